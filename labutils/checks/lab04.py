"""Checkers for lab 04 (model parallelism and pipelining)."""
from __future__ import annotations

from ..errors import RankTimeout
from ..solutions import lab04 as solution
from . import check_close, fail, not_attempted, passed, say_not_attempted

_GRID = [(p, m) for p in (1, 2, 3, 4, 8) for m in (1, 2, 4, 8, 16, 32)]


def _bubble_hint(p, m, got) -> str:
    try:
        g = float(got)
    except (TypeError, ValueError):
        return "return a number: the idle fraction of the step, between 0 and 1"
    if p > 1 and abs(g - (p - 1) / m) < 1e-9:
        return ("(p - 1) / m is the bubble relative to the *ideal* time (Megatron-LM's definition); "
                "here it is relative to the whole step, which lasts m + p - 1 slots")
    if p == 1:
        return "with one stage nothing waits: the bubble is 0"
    return "count slots: the step lasts m + p - 1 of them, and each stage works in m"


def usable_bubble(fn):
    """``fn`` if the learner implemented it, else the reference solution."""
    try:
        fn(2, 8)
        return fn
    except NotImplementedError:
        return solution.bubble_fraction


def bubble_fraction(fn) -> None:
    """Compare ``fn(p, m)`` with (p - 1) / (m + p - 1) on a grid of p and m."""
    try:
        fn(2, 8)
    except NotImplementedError:
        say_not_attempted(solution.bubble_fraction)
        fn = solution.bubble_fraction
    for p, m in _GRID:
        want = (p - 1) / (m + p - 1)
        got = fn(p, m)
        try:
            ok = abs(float(got) - want) <= 1e-9
        except (TypeError, ValueError):
            ok = False
        if not ok:
            fail(f"bubble_fraction(p={p}, m={m}) = {got!r}, expected {want:.4f}", _bubble_hint(p, m, got))
    passed(f"bubble_fraction matches (p - 1) / (m + p - 1) on {len(_GRID)} cases (p up to 8, m up to 32)")


def prediction_bubble(answer, p: int, m: int) -> None:
    """A predicted bubble (fraction, e.g. 0.11, or a percentage like 11) vs the model's value."""
    want = (p - 1) / (m + p - 1)
    if not_attempted(answer):
        print(f"… no prediction written: the model says {want:.3f} for p = {p}, m = {m}.")
        return
    try:
        value = float(answer)
    except (TypeError, ValueError):
        fail(f"the prediction must be a number, got {answer!r}", "write e.g. 0.25 for a quarter of the step")
    if value > 1:
        value /= 100  # written as a percentage
    check_close(value, want, rel_tol=0.02, what=f"predicted bubble at p = {p}, m = {m}",
                hint="the step has m + p - 1 slots; each stage is idle in p - 1 of them")


def gpipe_loop(fn, world_size: int = 3, ms=(1, 4), timeout: float = 120.0) -> None:
    """Run ``fn`` (the ``schedule.gpipe_step`` contract) on ``world_size`` gloo ranks (CPU tensors,
    whatever the machine, so the check reads the same everywhere) and compare the output and every
    stage's gradients with the one-device model (``torch.testing.assert_close``, float64)."""
    from ..launch import launch
    from ..labs.lab04_pipeline.verify import against_one_device
    try:
        results = launch(against_one_device, fn, tuple(ms), world_size=world_size, backend="gloo",
                         timeout=timeout, kwargs={"fallback": solution.gpipe_step})
    except RankTimeout:
        fail(f"your step did not finish within {timeout:g} s on {world_size} ranks",
             "a recv waits until the peer sends a tensor of the same size: in forward, rank r sends to "
             "r + 1 and receives from r - 1; in backward the other way; run every forward before the "
             "first backward")
    if any(r["not_attempted"] for r in results):
        say_not_attempted(solution.gpipe_step)
    for m in ms:
        for rank, res in enumerate(results):
            if res[m]["output"] not in ("ok", None):
                fail(f"m = {m}, last rank: {res[m]['output']}",
                     "return torch.cat of the micro-batch outputs, in order, detached, on the last rank")
            if res[m]["grads"] != "ok":
                fail(f"m = {m}, rank {rank}: {res[m]['grads']}",
                     "divide each micro-batch's loss by m (the loss is a mean over the whole batch); "
                     "call requires_grad_() on a received activation so that its .grad can be sent back; "
                     "backward every micro-batch exactly once")
    passed(f"your GPipe step matches the one-device model on {world_size} ranks, m = "
           f"{' and '.join(map(str, ms))}: output and every stage's gradients")
