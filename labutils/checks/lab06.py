"""Checkers for lab 06 (capstone: benchmark, alpha-beta fits, predictions).

``min_size_for_fraction`` is pure; ``send_one_way`` runs the learner's function on ranks -- the lab's
``RankPool`` (NCCL on GPUs, gloo on CPU: the printed text is the same) or two fresh gloo ranks -- and
checks every element it delivers with the benchmark's own check (``labutils.bench.ops.verify_one``).
A stub that raises NotImplementedError is "not attempted": the checker says so; ``usable`` gives a
stand-in (a bisection on the fit's model) where the notebook needs a size.
"""
from __future__ import annotations

from ..bandwidth import AlphaBeta
from . import attempted, fail, passed, run_ranks, say_not_attempted, standin

ONE_WAY_SIZES = (8, 4096, 2**20)   # bytes: one element pair, a page, a large message
TIMEOUT_S = 60                    # a learner's exchange that hangs is stopped after this long

_FITS = {"all_reduce": AlphaBeta(20.0, 350.0, 0.0), "all_gather": AlphaBeta(15.0, 700.0, 0.0),
         "send_recv": AlphaBeta(10.0, 380.0, 0.0)}


def _bandwidth_fraction(fit: AlphaBeta, size_bytes: float) -> float:
    """S / t(S) as a fraction of beta, from the fit's own model."""
    return fit.predict_gbps(size_bytes) / fit.beta_gbps


def solve_size_for_fraction(fit: AlphaBeta, fraction: float) -> float:
    """The stand-in for an unwritten ``min_size_for_fraction``: the size found by bisection on the
    model's bandwidth (no formula), to a relative 1e-12."""
    lo, hi = 0.0, 1.0
    while _bandwidth_fraction(fit, hi) < fraction:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _bandwidth_fraction(fit, mid) < fraction else (lo, mid)
        if hi - lo <= 1e-12 * hi:
            break
    return hi


standin(solve_size_for_fraction, "a bisection on the fit's model (labutils.checks.lab06.solve_size_for_fraction)")


def usable(fn, name: str = "min_size_for_fraction"):
    """``fn`` if the learner implemented it, else the stand-in ``solve_size_for_fraction`` (saying so)."""
    if name != "min_size_for_fraction":
        raise ValueError(f"no exercise {name!r} with a stand-in. HINT: usable(fn, 'min_size_for_fraction').")
    if attempted(fn, lambda f: f(_FITS["all_reduce"], 0.5)):
        return fn
    say_not_attempted(name, solve_size_for_fraction.labutils_standin)
    return solve_size_for_fraction


def min_size_for_fraction(fn) -> None:
    """``fn(fit, fraction)`` must return the S (bytes) at which S / t(S) = fraction x beta (checked on the
    fit's own model: the bandwidth at the returned size, and at 0.1% less)."""
    if not attempted(fn, lambda f: f(_FITS["all_reduce"], 0.5)):
        say_not_attempted("min_size_for_fraction")
        return
    cases = [(fit, f) for fit in _FITS.values() for f in (0.5, 0.8, 0.95)]
    for fit, f in cases:
        got = fn(fit, f)
        try:
            reached = _bandwidth_fraction(fit, float(got)) if float(got) > 0 else float("nan")
        except (TypeError, ValueError):
            reached = float("nan")
        if not abs(reached - f) <= 1e-6 * f:  # NaN fails too
            hint = ("solve S / (alpha + S / beta) = f beta for S; alpha is in us (x 1e-6 s), "
                    "beta in GB/s (x 1e9 B/s)")
            if f == 0.5:
                hint = "at half of beta the answer is n_1/2 = alpha x beta (in bytes: us x 1e-6 x GB/s x 1e9)"
            fail(f"min_size_for_fraction({fit}, {f}) = {got!r}: at that size the model reaches "
                 f"{reached:.4g} beta, not {f} beta", hint)
    passed(f"min_size_for_fraction solves S / t(S) = f beta on {len(cases)} cases")


def _one_way_rank(rank: int, world_size: int, fn) -> dict:
    """On every rank: the benchmark's check of ``fn`` as send_one_way at each size (nothing, if ``fn`` is
    still a stub: every rank's stub raises before it sends)."""
    from ..bench import ops
    wrong = {}
    for size in ONE_WAY_SIZES:
        try:
            wrong[size] = ops.verify_one(rank, world_size, "send_one_way", size, run=fn)
        except NotImplementedError:
            if wrong:
                raise
            return {"attempted": False, "wrong": {}}
    return {"attempted": True, "wrong": wrong}


def send_one_way(fn, pool=None, *, timeout: float = TIMEOUT_S) -> None:
    """``fn(case)`` must move ``case.inp`` of rank 2k into ``case.out`` of rank 2k+1 -- one direction only,
    every operation waited for -- and leave every other output untouched."""
    results = run_ranks(_one_way_rank, fn, pool=pool, world_size=pool.world_size if pool is not None else 2,
                        backend=None if pool is not None else "gloo", timeout_s=timeout,
                        hang_hint="every send needs the matching receive on the peer: rank 2k sends to 2k+1, "
                                  "rank 2k+1 receives from 2k; a rank that both sends and waits for its own send "
                                  "before receiving deadlocks",
                        hint="case.inp, case.out, case.rank and case.world_size are all you need; "
                             "dist.isend(tensor, dst) and dist.irecv(tensor, src) return works to .wait() on")
    if not results[0]["attempted"]:
        say_not_attempted("send_one_way")
        return
    bad = {size: w for size, w in results[0]["wrong"].items() if w}
    if bad:
        size, w = next(iter(bad.items()))
        fail(f"send_one_way left {w} wrong elements over the ranks at {size} bytes",
             "only rank 2k+1's output may change, and it must hold exactly rank 2k's input: a rank 2k that "
             "also receives (an exchange in both directions) overwrites its own output; an irecv not "
             "waited for may not have arrived yet")
    passed(f"send_one_way delivers rank 2k's input to rank 2k+1 and nothing else, at "
           f"{', '.join(str(s) for s in ONE_WAY_SIZES)} bytes")
