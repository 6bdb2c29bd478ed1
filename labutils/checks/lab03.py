"""Checkers for lab 03: a ring all-gather and a ring all-reduce written with point-to-point ops.

    ring_fn = check.ring_all_gather(my_ring_all_gather, pool=POOL)   # prints ✓ ... or raises

Each checker runs on a ``labutils.RankPool``'s ranks (``pool=``) or launches ranks once (``backend=``,
``world_size=``), runs your function on a few shapes and dtypes next to the
collective it imitates, and compares them chunk by chunk on every rank. While your function runs,
the collectives (``dist.all_gather_into_tensor``, ``dist.all_reduce``, ...) are switched off: the
exercise is to build them from ``isend``/``irecv``. A stub that raises ``NotImplementedError``
counts as "not attempted": nothing is checked, and the checker returns torch's own collective as the
stand-in the rest of the notebook uses (``torch_all_gather``, ``torch_all_reduce``), so the notebook goes
on. Each checker returns the function to use from here on: yours once it passes, else the stand-in.
"""
from __future__ import annotations

import contextlib
import math

from . import fail, passed, run_ranks, say_not_attempted, standin
_FORBIDDEN = ("all_gather_into_tensor", "all_gather_single", "all_gather", "all_reduce",
              "reduce_scatter_tensor", "reduce_scatter", "broadcast", "all_to_all_single")
_AG_CASES = (((4,), "float32"), ((3, 5), "int64"), ((250, 8), "float32"))
_AR_CASES = (((7,), "float32"), ((4, 6), "int64"), ((1 << 16,), "float32"))
DEADLOCK_HINT = ("post each step's send and receive together: dist.batch_isend_irecv([dist.P2POp("
                  "dist.isend, send_chunk, right), dist.P2POp(dist.irecv, recv_chunk, left)]). An "
                  "isend followed by an irecv on every rank deadlocks under NCCL (section 1), and a "
                  "blocking dist.send on every rank deadlocks under gloo too")


@contextlib.contextmanager
def _collectives_forbidden():
    """Replace the collectives in ``torch.distributed`` by functions that raise, for the duration."""
    import torch.distributed as dist

    def blocked(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"this exercise builds the collective from point-to-point ops, but "
                               f"your function called dist.{name}. HINT: use dist.isend/dist.irecv "
                               "or dist.batch_isend_irecv.")
        return call

    saved = {name: getattr(dist, name) for name in _FORBIDDEN if hasattr(dist, name)}
    for name in saved:
        setattr(dist, name, blocked(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _input(shape, dtype: str, rank: int, device):
    """Distinct integer values per rank (exact in float32), so any misplaced chunk shows."""
    import torch
    n = math.prod(shape)
    t = torch.arange(n, dtype=torch.int64) + 1000 * (rank + 1)
    return t.reshape(shape).to(getattr(torch, dtype)).to(device)


def _call(fn, first: bool, *args) -> bool:
    """Run ``fn(*args)`` with collectives off. Returns False if the stub still raises
    NotImplementedError on the first case (not attempted)."""
    try:
        with _collectives_forbidden():
            fn(*args)
    except NotImplementedError:
        if not first:
            raise
        return False
    return True


def torch_all_gather(output, input, group=None) -> None:
    """The stand-in for an unwritten ring all-gather: torch's own collective."""
    from ..compat import all_gather_into_tensor
    all_gather_into_tensor(output, input, group=group)


def torch_all_reduce(tensor, group=None) -> None:
    """The stand-in for an unwritten ring all-reduce: torch's own collective (sum, in place)."""
    import torch.distributed as dist
    dist.all_reduce(tensor, group=group)


standin(torch_all_gather, "torch's dist.all_gather_into_tensor")
standin(torch_all_reduce, "torch's dist.all_reduce")


def _chunks_differ(got, expected, n: int) -> list[int]:
    import torch
    pairs = zip(got.reshape(-1).tensor_split(n), expected.reshape(-1).tensor_split(n))
    return [k for k, (a, b) in enumerate(pairs) if not torch.equal(a, b)]


def _all_gather_rank(rank: int, world_size: int, fn) -> dict:
    import torch
    from ..compat import all_gather_into_tensor
    from ..config import rank_device
    dev, cases = rank_device(), []
    for i, (shape, dtype) in enumerate(_AG_CASES):
        inp = _input(shape, dtype, rank, dev)
        expected = inp.new_empty((world_size * shape[0], *shape[1:]))
        all_gather_into_tensor(expected, inp)
        got = torch.full_like(expected, -7)
        if not _call(fn, i == 0, got, inp.clone()):
            return {"attempted": False, "cases": []}
        got, expected = got.cpu(), expected.cpu()
        cases.append({"case": f"{tuple(shape)} {dtype}", "untouched": bool((got == -7).all()),
                      "bad": _chunks_differ(got, expected, world_size)})
    return {"attempted": True, "cases": cases}


def _all_reduce_rank(rank: int, world_size: int, fn) -> dict:
    import torch.distributed as dist
    from ..config import rank_device
    dev, cases = rank_device(), []
    for i, (shape, dtype) in enumerate(_AR_CASES):
        start = _input(shape, dtype, rank, dev)
        expected = start.clone()
        dist.all_reduce(expected)
        got = start.clone()
        if not _call(fn, i == 0, got):
            return {"attempted": False, "cases": []}
        cases.append({"case": f"{tuple(shape)} {dtype}", "untouched": bool((got == start).all()),
                      "bad": _chunks_differ(got.cpu(), expected.cpu(), world_size)})
    return {"attempted": True, "cases": cases}


def _check(rank_fn, fn, name: str, what: str, collective: str, hints: dict, stand_in, backend, world_size,
           timeout: float, pool):
    if not callable(fn):
        fail(f"{what}: expected a function, got {fn!r}", f"pass the function itself: check.{name}(my_fn)")
    if pool is not None and (backend is not None or world_size is not None):
        raise ValueError(f"check.{name}: pass either pool= or backend=/world_size=, not both. HINT: the "
                         "pool's ranks already have a backend and a world size.")
    per_rank = run_ranks(rank_fn, fn, world_size=world_size, backend=backend,
                         pool=pool, timeout_s=timeout, hint=hints["error"], hang_hint=DEADLOCK_HINT)
    if not per_rank[0]["attempted"]:
        say_not_attempted(f"your {what} (my_{name})", stand_in.labutils_standin)
        return stand_in
    for r, res in enumerate(per_rank):
        for case in res["cases"]:
            if case["untouched"]:
                fail(f"{what}, case {case['case']}: rank {r}'s output was never written", hints["untouched"])
            if case["bad"]:
                fail(f"{what}, case {case['case']}: on rank {r}, chunk(s) {case['bad']} differ from "
                     f"{collective}", hints["order"])
    cases = ", ".join(c["case"] for c in per_rank[0]["cases"])
    passed(f"{what} matches {collective} on every rank ({cases})")
    return fn


def ring_all_gather(fn, *, pool=None, backend: str | None = None, world_size: int | None = None,
                    timeout: float = 30.0):
    """Check ``fn(output, input)`` against ``dist.all_gather_into_tensor`` on every rank.

    Args:
        pool: a ``labutils.RankPool`` to run on (a deadlock in ``fn`` restarts it); else fresh ranks
            with ``backend`` and ``world_size`` (``labutils.launch``'s defaults).

    Returns:
        The function that passed: ``fn``, or torch's collective (the stand-in) if ``fn`` is a stub.

    Raises:
        ExerciseError: wrong chunks, output never written, an error or a deadlock in ``fn``.
        ValueError: ``pool`` together with ``backend`` or ``world_size``.
    """
    hints = {"error": "call it like dist.all_gather_into_tensor(output, input); use only "
                      "isend/irecv/batch_isend_irecv",
             "untouched": "receive into views of output (output.view(n, -1)[k]), not into new "
                          "tensors, and copy your own input into chunk rank",
             "order": "chunk k must hold rank k's input. In step s = 0 .. n-2 rank r sends chunk "
                      "(r - s) mod n to rank r + 1 and receives chunk (r - s - 1) mod n from rank r - 1"}
    return _check(_all_gather_rank, fn, "ring_all_gather", "ring all-gather",
                  "all_gather_into_tensor", hints, torch_all_gather, backend, world_size, timeout, pool)


def ring_all_reduce(fn, *, pool=None, backend: str | None = None, world_size: int | None = None,
                    timeout: float = 30.0):
    """Check ``fn(tensor)`` (in-place sum) against ``dist.all_reduce`` on every rank.

    Args:
        pool: as in ``ring_all_gather``.

    Returns:
        The function that passed: ``fn``, or torch's collective (the stand-in) if ``fn`` is a stub.

    Raises:
        ExerciseError: wrong chunks, tensor unchanged, an error or a deadlock in ``fn``.
        ValueError: ``pool`` together with ``backend`` or ``world_size``.
    """
    hints = {"error": "call it like dist.all_reduce(tensor): sum in place; use only "
                      "isend/irecv/batch_isend_irecv",
             "untouched": "write the sums back into the tensor you were given (in place), e.g. "
                          "through chunks = tensor.view(-1).tensor_split(n)",
             "order": "reduce-scatter first: in step s rank r sends chunk (r - s) mod n and adds the "
                      "chunk (r - s - 1) mod n it receives; rank r then owns chunk (r + 1) mod n. "
                      "All-gather next: send chunk (r + 1 - s) mod n, receive chunk (r - s) mod n. "
                      "Split with tensor.view(-1).tensor_split(n) so every rank agrees on sizes"}
    return _check(_all_reduce_rank, fn, "ring_all_reduce", "ring all-reduce", "all_reduce", hints,
                  torch_all_reduce, backend, world_size, timeout, pool)
