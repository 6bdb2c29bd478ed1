"""Checkers for lab 04 (model parallelism and pipelining): the bubble formula, a predicted bubble,
and the 1F1B loop (on gloo ranks against the one-device model)."""
from __future__ import annotations

from ..labs.lab04_pipeline.schedule import bubble_fraction as model_bubble_fraction
from . import attempted, check_close, fail, not_attempted, passed, run_ranks, say_not_attempted, standin

standin(model_bubble_fraction, "the lab's schedule model (labutils.labs.lab04_pipeline.schedule.bubble_fraction)")

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
    """``fn`` if the learner implemented it, else the schedule model's formula (the stand-in), saying so."""
    if attempted(fn, lambda f: f(2, 8)):
        return fn
    say_not_attempted("my_bubble_fraction", model_bubble_fraction.labutils_standin)
    return model_bubble_fraction


def bubble_fraction(fn) -> None:
    """Compare ``fn(p, m)`` with (p - 1) / (m + p - 1) on a grid of p and m."""
    if not attempted(fn, lambda f: f(2, 8)):
        say_not_attempted("my_bubble_fraction")
        return
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


def _order_problem(order, rank: int, p: int, m: int) -> str | None:
    """What is wrong with one stage's order of forwards and backwards for 1F1B, or None."""
    fwd = [i for kind, i in order if kind == "F"]
    if sorted(fwd) != list(range(m)) or sorted(i for kind, i in order if kind == "B") != list(range(m)):
        return (f"stage {rank} ran forwards {fwd} and backwards "
                f"{[i for kind, i in order if kind == 'B']}: each of the {m} micro-batches needs exactly one of each")
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    if peak > min(m, p - rank):
        return (f"stage {rank} held {peak} micro-batches' activations at once; 1F1B holds at most "
                f"min(m, p - s) = {min(m, p - rank)}")
    return None


def _one_f_one_b_rank(rank: int, world_size: int, fn, ms) -> dict:
    """``against_one_device`` on this rank, or ``{"not_attempted": True}`` when ``fn`` is still a stub."""
    from ..labs.lab04_pipeline.verify import against_one_device
    try:
        return against_one_device(rank, world_size, fn, ms, record_order=True)
    except NotImplementedError:
        return {"not_attempted": True}


def one_f_one_b(fn, world_size: int = 3, ms=(2, 6), timeout: float = 120.0, pool=None) -> None:
    """Run ``fn`` (the contract of the notebook's ``gpipe_step``) on ``world_size`` gloo ranks (CPU
    tensors, whatever the machine, so the check reads the same everywhere; or on ``pool``'s ranks):
    the output and every stage's gradients must equal the one-device model's
    (``torch.testing.assert_close``, float64), and stage s may hold at most min(m, p - s)
    micro-batches at once (the order of its forwards and backwards is recorded with hooks on the
    stage)."""
    world_size = pool.world_size if pool is not None else world_size
    results = run_ranks(_one_f_one_b_rank, fn, tuple(ms), pool=pool, world_size=world_size,
                        backend=None if pool is not None else "gloo", timeout_s=timeout,
                        hang_hint="send with dist.isend (keep the tensor and the work, wait at the end): a "
                                  "blocking send waits for its receiver, and in 1F1B the receiver may be waiting "
                                  "for you; every recv needs the neighbour's matching send in the same order")
    if any(r["not_attempted"] for r in results):
        say_not_attempted("my_1f1b_step")
        return
    for m in ms:
        for rank, res in enumerate(results):
            if res[m]["output"] not in ("ok", None):
                fail(f"m = {m}, last rank: {res[m]['output']}",
                     "return torch.cat of the micro-batch outputs, in order, detached, on the last rank")
            if res[m]["grads"] != "ok":
                fail(f"m = {m}, rank {rank}: {res[m]['grads']}",
                     "divide each micro-batch's loss by m; call requires_grad_() on a received activation "
                     "so that its .grad can be sent back; backward every micro-batch exactly once")
            problem = _order_problem(res[m]["order"], rank, world_size, m)
            if problem:
                fail(f"m = {m}: {problem}",
                     "run min(m, p - rank) forwards first, then alternate backward(i) and forward(i + warm-up), "
                     "then the backwards left; that is what frees memory early (GPipe runs all m forwards)")
    caps = ", ".join(str(min(max(ms), world_size - r)) for r in range(world_size))
    passed(f"your 1F1B step matches the one-device model on {world_size} ranks, m = "
           f"{' and '.join(map(str, ms))}: output, every stage's gradients, and at most ({caps}) "
           f"micro-batches held per stage at m = {max(ms)}")
