"""Checkers for lab 05 (debugging distributed programs).

Each exercise runs the learner's rank function on real ranks -- a ``RankPool``'s when one is given
(the notebook passes 3 gloo ranks), else freshly launched ones (NCCL with >= 2 GPUs, else gloo) --
with a short timeout: a hang is a failed check, reported with what it means, not a frozen notebook.
"""
from __future__ import annotations

from ..config import rank_device
from . import attempted, fail, not_attempted, passed, run_ranks, say_not_attempted

TIMEOUT_S = 40.0       # a launch: start-up (several seconds under NCCL) + a few collectives
POOL_TIMEOUT_S = 10.0  # a pool's ranks are already up: a few collectives
NUMEL = 1024           # elements of the checked tensors: large enough that sending them shows next to a fingerprint


def _run_ranks(rank_fn, fn, world_size, backend, hang_hint: str, error_hint: str, pool=None) -> list:
    """Run ``rank_fn(rank, world_size, fn)`` on ``pool``'s ranks, or on freshly launched ones (launch's
    defaults for what is None), and turn a hang or a failure into ExerciseError."""
    return run_ranks(rank_fn, fn, pool=pool, world_size=None if pool is not None else world_size,
                     backend=None if pool is not None else backend,
                     timeout_s=POOL_TIMEOUT_S if pool is not None else TIMEOUT_S,
                     hang_hint=hang_hint, hint=error_hint)


def _sent(ledger) -> dict:
    """What one call issued, from the ledger: all_reduce calls and bytes, and the bytes of everything else."""
    return {"all_reduce_calls": ledger.counts().get("all_reduce", 0),
            "all_reduce_bytes": sum(r.size_bytes for r in ledger.records if r.op == "all_reduce"),
            "other_bytes": ledger.wire_bytes_per_rank() - ledger.wire_bytes_per_rank(("all_reduce",))}


def _run_checked(rank, world_size, fn):
    import torch

    from ..instruments.ledger import Ledger
    dev = rank_device()
    with Ledger() as ledger:
        fine = fn(torch.full((NUMEL,), float(rank + 1), device=dev))
    odd = 5 if rank == world_size - 1 else 4  # the last rank's tensor has one element more (small: gloo then
    #                                           hangs rather than aborting the rank on a size mismatch)
    try:
        fn(torch.ones(odd, device=dev))
        mismatch = None
    except ValueError as exc:
        mismatch = str(exc)
    return fine, mismatch, _sent(ledger)


def checked_all_reduce(fn, world_size=None, backend=None, pool=None) -> None:
    """Run ``fn(t)`` on every rank (of ``pool``, or launched): matching tensors must be summed; when the
    last rank's tensor has another shape, every rank must raise ValueError naming that rank -- and
    nobody may hang."""
    import torch

    def probe(f):
        f(torch.zeros(1))
    if not attempted(fn, probe):  # the probe runs outside a process group: only a stub gets this far
        say_not_attempted("my_checked_all_reduce")
        return
    out = _run_ranks(_run_checked, fn, world_size, backend,
                     "every rank must take part in the fingerprint exchange and raise *after* it, on "
                     "every rank: dist.all_gather_object(everyone, (tuple(t.shape), str(t.dtype))), "
                     "then compare",
                     "compare the fingerprints before the all_reduce, and raise ValueError (not "
                     "another exception) on every rank when they differ", pool)
    ws = len(out)
    total = sum(range(1, ws + 1))
    for rank, (fine, mismatch, sent) in enumerate(out):
        if not isinstance(fine, torch.Tensor) or not torch.equal(fine, torch.full((NUMEL,), float(total))):
            fail(f"with matching tensors, rank {rank} returned {_short(fine)}; expected {total:g} everywhere",
                 "after the check, run dist.all_reduce(t) and return t")
        tensor_bytes = NUMEL * fine.element_size()
        if sent["other_bytes"] >= tensor_bytes / 2:
            fail(f"with matching tensors of {tensor_bytes} bytes, rank {rank} sent {sent['other_bytes']:.0f} bytes "
                 "besides the all_reduce", "compare a fingerprint of the call (shape, dtype), not the data: "
                 "gathering every rank's tensor to look at its shape costs (n - 1) times the tensor")
        if sent["all_reduce_calls"] != 1 or sent["all_reduce_bytes"] != tensor_bytes:
            fail(f"with matching tensors, rank {rank} issued {sent['all_reduce_calls']} all_reduce(s) of "
                 f"{sent['all_reduce_bytes']} bytes in all; expected one of the tensor ({tensor_bytes} bytes)",
                 "check first, then one dist.all_reduce(t): the fingerprint exchange is the only extra call")
        if mismatch is None:
            fail(f"rank {rank} did not raise ValueError when rank {ws - 1}'s tensor had shape (5,)",
                 "compare every rank's (shape, dtype) with rank 0's and raise if any differs")
        if f"rank {ws - 1}" not in mismatch:
            fail(f"rank {rank}'s message does not name the odd rank {ws - 1}: {mismatch!r}",
                 "say which ranks differ, e.g. 'rank 1 has ((5,), float32)'")
    passed(f"checked_all_reduce: sums matching tensors, and all {ws} ranks raise naming rank {ws - 1} "
           "when its shape differs")


def _short(x) -> str:
    """A result for a message: a tensor by shape and its first values, anything else by repr."""
    import torch
    if isinstance(x, torch.Tensor):
        return f"a tensor of shape {tuple(x.shape)} starting {x.flatten()[:3].tolist()}"
    return repr(x)[:80]


def _run_steps(rank, world_size, fn):
    import math

    import torch

    from ..instruments.ledger import Ledger
    dev = rank_device()
    grad = torch.full((NUMEL,), float(rank + 1), device=dev)
    fine = fn(rank, world_size, torch.tensor(1.0 + rank, device=dev), grad)
    nan_loss = math.nan if rank == world_size - 1 else 1.0  # only the last rank sees a NaN
    with Ledger() as ledger:
        skipped = fn(rank, world_size, torch.tensor(nan_loss, device=dev), grad)
    return fine, skipped, ledger.wire_bytes_per_rank()


def guarded_step(fn, world_size=None, backend=None, pool=None) -> None:
    """Run ``fn(rank, world_size, loss, grad)`` twice on every rank (of ``pool``, or launched): all
    losses finite (must average ``grad``), and with a NaN on the last rank only (every rank must return
    None -- and nobody may hang)."""
    import torch

    def probe(f):
        f(0, 1, torch.tensor(1.0), torch.ones(4))
    if not attempted(fn, probe):
        say_not_attempted("my_guarded_step")
        return
    out = _run_ranks(_run_steps, fn, world_size, backend,
                     "the rank with the NaN skipped a collective the others called. Decide together "
                     "first: all_reduce a 0/1 'my loss is finite' flag with op=ReduceOp.MIN, then "
                     "branch on it", "the rank's traceback is shown above this error", pool)
    ws = len(out)
    mean = sum(range(1, ws + 1)) / ws
    for rank, (fine, skipped, sent) in enumerate(out):
        if not isinstance(fine, torch.Tensor) or not torch.allclose(fine, torch.full((NUMEL,), mean)):
            fail(f"with every loss finite, rank {rank} returned {_short(fine)}; expected the mean gradient "
                 f"{mean:g} in every element", "all_reduce the gradient (SUM), then divide by world_size")
        if skipped is not None:
            fail(f"with a NaN loss on rank {ws - 1}, rank {rank} returned {_short(skipped)} instead of None",
                 "when any rank's loss is not finite, every rank must skip the step")
        grad_bytes = NUMEL * fine.element_size()
        if sent >= grad_bytes / 2:
            fail(f"with a NaN loss on rank {ws - 1}, every rank returned None, but rank {rank} still sent "
                 f"{sent:.0f} bytes (the gradient has {grad_bytes})", "decide first, then skip: a skipped step "
                 "sends only the decision (a 0/1 flag), not the gradient it throws away")
    passed(f"guarded_step: {ws} ranks average when all losses are finite and all skip together on a NaN")


def prediction_outcome(answer, outcomes: dict[str, str]) -> None:
    """Compare a predicted outcome ("hang", "error" or "wrong values") with what was observed."""
    if not_attempted(answer):
        print("… no prediction written: observed " +
              ", ".join(f"{k}: {v}" for k, v in outcomes.items()))
        return
    got = str(answer).strip().lower()
    for where, seen in outcomes.items():
        verdict = "✓" if got in seen.lower() else "✗"
        print(f"{verdict} {where}: you said {got!r}, observed {seen}")
