"""Checkers for lab 06 (capstone: benchmark, alpha-beta fits, predictions).

``min_size_for_fraction`` is pure; ``send_one_way`` runs the learner's function on ranks -- the lab's
``RankPool`` (NCCL on GPUs, gloo on CPU: the printed text is the same) or two fresh gloo ranks -- and
checks every element it delivers with the benchmark's own check (``labutils.bench.ops.verify_one``).
A stub that raises NotImplementedError is "not attempted": the checker says so and checks the
reference solution instead.
"""
from __future__ import annotations

from ..bandwidth import AlphaBeta
from ..solutions import lab06 as solution
from . import fail, passed, say_not_attempted

ONE_WAY_SIZES = (8, 4096, 2**20)   # bytes: one element pair, a page, a large message
TIMEOUT_S = 60                    # a learner's exchange that hangs is stopped after this long

_FITS = {"all_reduce": AlphaBeta(20.0, 350.0, 0.0), "all_gather": AlphaBeta(15.0, 700.0, 0.0),
         "send_recv": AlphaBeta(10.0, 380.0, 0.0)}


def _attempted(fn, *args) -> bool:
    try:
        fn(*args)
        return True
    except NotImplementedError:
        return False


def usable(fn, name: str):
    """``fn`` if the learner implemented it, else the reference solution ``name``."""
    ref = getattr(solution, name)
    probe = {"min_size_for_fraction": (_FITS["all_reduce"], 0.5)}[name]
    return fn if _attempted(fn, *probe) else ref


def _not_attempted(name: str) -> None:
    say_not_attempted(f"labutils.solutions.lab06.{name}")


def min_size_for_fraction(fn) -> None:
    """``fn(fit, fraction)`` must return the S (bytes) at which S / t(S) = fraction x beta."""
    if not _attempted(fn, _FITS["all_reduce"], 0.5):
        _not_attempted("min_size_for_fraction")
        fn = solution.min_size_for_fraction
    cases = [(fit, f) for fit in _FITS.values() for f in (0.5, 0.8, 0.95)]
    for fit, f in cases:
        want = solution.min_size_for_fraction(fit, f)
        got = fn(fit, f)
        try:
            ok = abs(float(got) - want) <= 1e-6 * want
        except (TypeError, ValueError):
            ok = False
        if not ok:
            hint = ("solve S / (alpha + S / beta) = f beta for S; alpha is in us (x 1e-6 s), "
                    "beta in GB/s (x 1e9 B/s)")
            if f == 0.5:
                hint = "at half of beta the answer is n_1/2 = alpha x beta (in bytes: us x 1e-6 x GB/s x 1e9)"
            fail(f"min_size_for_fraction({fit}, {f}) = {got!r}, expected {want:.6g} bytes", hint)
    passed(f"min_size_for_fraction solves S / t(S) = f beta on {len(cases)} cases")


def _one_way_rank(rank: int, world_size: int, fn) -> dict:
    """On every rank: the benchmark's check of ``fn`` as send_one_way at each size (or of the reference
    solution, if ``fn`` is still a stub)."""
    from ..bench import ops
    used_reference = False
    wrong = {}
    for size in ONE_WAY_SIZES:
        try:
            wrong[size] = ops.verify_one(rank, world_size, "send_one_way", size, run=fn)
        except NotImplementedError:
            used_reference, fn = True, solution.send_one_way
            wrong[size] = ops.verify_one(rank, world_size, "send_one_way", size, run=fn)
    return {"used_reference": used_reference, "wrong": wrong}


def send_one_way(fn, pool=None, *, timeout: float = TIMEOUT_S) -> None:
    """``fn(case)`` must move ``case.inp`` of rank 2k into ``case.out`` of rank 2k+1 -- one direction only,
    every operation waited for -- and leave every other output untouched."""
    import labutils
    try:
        if pool is not None:
            results = pool.run(_one_way_rank, fn, timeout=timeout, output="quiet")
        else:
            results = labutils.launch(_one_way_rank, fn, world_size=2, backend="gloo", timeout=timeout,
                                      output="quiet")
    except labutils.RankTimeout:
        fail(f"send_one_way did not return within {timeout:g} s",
             "every send needs the matching receive on the peer: rank 2k sends to 2k+1, rank 2k+1 receives "
             "from 2k; a rank that both sends and waits for its own send before receiving deadlocks")
    except labutils.RankError as exc:
        what = (f"send_one_way raised {exc.exc_type} on rank {exc.rank}: {exc.remote_message}"
                if exc.exc_type else str(exc).split(". HINT")[0])
        fail(what, "case.inp, case.out, case.rank and case.world_size are all you need; "
                   "dist.isend(tensor, dst) and dist.irecv(tensor, src) return works to .wait() on")
    if results[0]["used_reference"]:
        say_not_attempted("labutils.solutions.lab06.send_one_way")
    bad = {size: w for size, w in results[0]["wrong"].items() if w}
    if bad:
        size, w = next(iter(bad.items()))
        fail(f"send_one_way left {w} wrong elements over the ranks at {size} bytes",
             "only rank 2k+1's output may change, and it must hold exactly rank 2k's input: a rank 2k that "
             "also receives (an exchange in both directions) overwrites its own output; an irecv not "
             "waited for may not have arrived yet")
    passed(f"send_one_way delivers rank 2k's input to rank 2k+1 and nothing else, at "
           f"{', '.join(str(s) for s in ONE_WAY_SIZES)} bytes")
