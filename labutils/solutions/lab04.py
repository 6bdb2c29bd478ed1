"""Reference solutions for lab 04 (model parallelism and pipelining)."""
from __future__ import annotations


def bubble_fraction(p, m):
    """Idle share of a GPipe step with p stages and m micro-batches: (p - 1) / (m + p - 1).

    The step lasts m + p - 1 slots (m to push every micro-batch through, plus p - 1 to fill and
    drain the pipe); each stage works in m of them.
    """
    return (p - 1) / (m + p - 1)


def gpipe_step(stage, x, target, loss_fn, n_microbatches, act_shape):
    """One GPipe step on this rank: all forwards (recv activation, run, send), then all backwards
    (recv gradient, backprop, send the input's gradient); each micro-batch's loss divided by m.

    The code, with comments, is ``labutils.labs.lab04_pipeline.schedule.gpipe_step`` (the lab's
    measurements use it).
    """
    from ..labs.lab04_pipeline.schedule import gpipe_step as reference
    return reference(stage, x, target, loss_fn, n_microbatches, act_shape)
