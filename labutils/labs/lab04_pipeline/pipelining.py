"""``torch.distributed.pipelining``'s schedules behind the ``schedule.gpipe_step`` contract, for
lab 04's correctness check and measurements::

    sched = pipelining.make_schedule(stage, n_microbatches=8, loss_fn=F.mse_loss, schedule="1f1b")
    out = pipelining.run_schedule(sched, x, target)       # the last rank's output, else None

Stage index = rank, p = world_size; shapes are inferred at the first step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

_SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def available_schedules() -> list[str]:
    """The schedules of ``_SCHEDULE_CLASSES`` that this torch's ``torch.distributed.pipelining`` has."""
    from torch.distributed import pipelining
    return [k for k, v in _SCHEDULE_CLASSES.items() if hasattr(pipelining, v)]


def make_schedule(stage, n_microbatches: int, loss_fn, schedule: str = "gpipe"):
    """Wrap this rank's ``stage`` (stage index = rank, p = world_size) in a ``PipelineStage`` and
    a ``ScheduleGPipe`` / ``Schedule1F1B``; shapes are inferred at the first step.

    Raises:
        ValueError: a schedule this torch does not have.
    """
    from torch.distributed import pipelining
    if schedule not in available_schedules():
        raise ValueError(f"schedule {schedule!r} is not in torch {torch.__version__}'s pipelining. "
                         f"HINT: one of {available_schedules()}.")
    device = next(stage.parameters()).device
    pstage = pipelining.PipelineStage(stage, dist.get_rank(), dist.get_world_size(), device)
    return getattr(pipelining, _SCHEDULE_CLASSES[schedule])(pstage, n_microbatches, loss_fn=loss_fn)


def run_schedule(sched, x, target):
    """One training step: the first rank feeds ``x``, the last ``target`` (torch splits both into
    micro-batches). Returns the last rank's output (detached), None elsewhere."""
    rank, p = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == p - 1
    if first and last:
        out = sched.step(x, target=target)
    elif first:
        out = sched.step(x)
    elif last:
        out = sched.step(target=target)
    else:
        out = sched.step()
    return out.detach() if last else None


def torch_schedule_step(stage, x, target, loss_fn, n_microbatches, act_shape, *, schedule="gpipe"):
    """The ``gpipe_step`` contract, run by ``torch.distributed.pipelining`` (``act_shape`` unused:
    torch infers shapes)."""
    return run_schedule(make_schedule(stage, n_microbatches, loss_fn, schedule), x, target)
