"""Checkers for lab 03: a ring all-gather and a ring all-reduce written with point-to-point ops.

    ring_fn = check.ring_all_gather(my_ring_all_gather, pool=POOL)   # prints ✓ ... or raises

Each checker runs on a ``labutils.RankPool``'s ranks (``pool=``) or launches ranks once (``backend=``,
``world_size=``), runs your function on a few shapes and dtypes next to the
collective it imitates, and compares them chunk by chunk on every rank. While your function runs,
the collectives (``dist.all_gather_into_tensor``, ``dist.all_reduce``, ...) are switched off: the
exercise is to build them from ``isend``/``irecv``. A stub that raises ``NotImplementedError``
counts as "not attempted" and the reference solution is checked instead, so the notebook goes on.
Each checker returns the function it verified (yours, or the reference).
"""
from __future__ import annotations

import contextlib
import math

from ..errors import RankError, RankTimeout
from . import ExerciseError, fail, passed, say_not_attempted

REFERENCE = "labutils.solutions.lab03"
_FORBIDDEN = ("all_gather_into_tensor", "all_gather_single", "all_gather", "all_reduce",
              "reduce_scatter_tensor", "reduce_scatter", "broadcast", "all_to_all_single")
_AG_CASES = (((4,), "float32"), ((3, 5), "int64"), ((250, 8), "float32"))
_AR_CASES = (((7,), "float32"), ((4, 6), "int64"), ((1 << 16,), "float32"))
_DEADLOCK_HINT = ("post each step's send and receive together: dist.batch_isend_irecv([dist.P2POp("
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


def _call(fn, reference, used_reference: bool, first: bool, *args) -> bool:
    """Run ``fn(*args)`` with collectives off; a NotImplementedError on the first case switches to
    the reference. Returns whether the reference was used."""
    if not used_reference:
        try:
            with _collectives_forbidden():
                fn(*args)
            return False
        except NotImplementedError:
            if not first:
                raise
    reference(*args)
    return True


def _chunks_differ(got, expected, n: int) -> list[int]:
    import torch
    pairs = zip(got.reshape(-1).tensor_split(n), expected.reshape(-1).tensor_split(n))
    return [k for k, (a, b) in enumerate(pairs) if not torch.equal(a, b)]


def _all_gather_rank(rank: int, world_size: int, fn, reference) -> dict:
    import torch
    from ..compat import all_gather_into_tensor
    from ..config import rank_device
    dev, used, cases = rank_device(), False, []
    for i, (shape, dtype) in enumerate(_AG_CASES):
        inp = _input(shape, dtype, rank, dev)
        expected = inp.new_empty((world_size * shape[0], *shape[1:]))
        all_gather_into_tensor(expected, inp)
        got = torch.full_like(expected, -7)
        used = _call(fn, reference, used, i == 0, got, inp.clone())
        got, expected = got.cpu(), expected.cpu()
        cases.append({"case": f"{tuple(shape)} {dtype}", "untouched": bool((got == -7).all()),
                      "bad": _chunks_differ(got, expected, world_size)})
    return {"used_reference": used, "cases": cases}


def _all_reduce_rank(rank: int, world_size: int, fn, reference) -> dict:
    import torch.distributed as dist
    from ..config import rank_device
    dev, used, cases = rank_device(), False, []
    for i, (shape, dtype) in enumerate(_AR_CASES):
        start = _input(shape, dtype, rank, dev)
        expected = start.clone()
        dist.all_reduce(expected)
        got = start.clone()
        used = _call(fn, reference, used, i == 0, got)
        cases.append({"case": f"{tuple(shape)} {dtype}", "untouched": bool((got == start).all()),
                      "bad": _chunks_differ(got.cpu(), expected.cpu(), world_size)})
    return {"used_reference": used, "cases": cases}


def _raise(what: str, hint: str):
    raise ExerciseError(f"✗ {what}. HINT: {hint}") from None


def _check(rank_fn, fn, name: str, what: str, collective: str, hints: dict, backend, world_size,
           timeout: float, pool):
    from ..launch import launch
    from ..solutions import lab03 as reference_module
    reference = getattr(reference_module, name)
    if not callable(fn):
        fail(f"{what}: expected a function, got {fn!r}", f"pass the function itself: check.{name}(my_fn)")
    if pool is not None and (backend is not None or world_size is not None):
        raise ValueError(f"check.{name}: pass either pool= or backend=/world_size=, not both. HINT: the "
                         "pool's ranks already have a backend and a world size.")
    try:
        if pool is not None:
            per_rank = pool.run(rank_fn, fn, reference, timeout=timeout, output="quiet")
        else:
            per_rank = launch(rank_fn, fn, reference, backend=backend, world_size=world_size,
                              timeout=timeout, output="quiet")
    except RankTimeout as exc:
        _raise(f"your {what} did not finish within {timeout:g} s (RankTimeout: ranks {exc.ranks} "
               "were still waiting)", _DEADLOCK_HINT)
    except RankError as exc:
        _raise(f"your {what} raised {exc.exc_type or 'a fatal error'} on rank {exc.rank}: "
               f"{exc.remote_message or exc}", hints["error"])
    used = per_rank[0]["used_reference"]
    if used:
        say_not_attempted(f"{REFERENCE}.{name}")
    for r, res in enumerate(per_rank):
        for case in res["cases"]:
            if case["untouched"]:
                fail(f"{what}, case {case['case']}: rank {r}'s output was never written", hints["untouched"])
            if case["bad"]:
                fail(f"{what}, case {case['case']}: on rank {r}, chunk(s) {case['bad']} differ from "
                     f"{collective}", hints["order"])
    cases = ", ".join(c["case"] for c in per_rank[0]["cases"])
    passed(f"{what}{' (reference solution)' if used else ''} matches {collective} on every rank "
           f"({cases})")
    return reference if used else fn


def ring_all_gather(fn, *, pool=None, backend: str | None = None, world_size: int | None = None,
                    timeout: float = 30.0):
    """Check ``fn(output, input)`` against ``dist.all_gather_into_tensor`` on every rank.

    Args:
        pool: a ``labutils.RankPool`` to run on (a deadlock in ``fn`` restarts it); else fresh ranks
            with ``backend`` and ``world_size`` (``labutils.launch``'s defaults).

    Returns:
        The function that passed: ``fn``, or the reference if ``fn`` is a stub.

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
                  "all_gather_into_tensor", hints, backend, world_size, timeout, pool)


def ring_all_reduce(fn, *, pool=None, backend: str | None = None, world_size: int | None = None,
                    timeout: float = 30.0):
    """Check ``fn(tensor)`` (in-place sum) against ``dist.all_reduce`` on every rank.

    Args:
        pool: as in ``ring_all_gather``.

    Returns:
        The function that passed: ``fn``, or the reference if ``fn`` is a stub.

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
                  backend, world_size, timeout, pool)
