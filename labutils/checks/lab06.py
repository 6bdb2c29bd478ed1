"""Checkers for lab 06 (capstone: benchmark, alpha-beta fits, predictions).

``min_size_for_fraction`` is pure; ``send_one_way`` runs the learner's function on three gloo ranks (the
pairing depends on the rank count: the last of an odd number has no partner; the text printed is the same
on every machine), checks every element it delivers with the benchmark's own check
(``labutils.bench.ops.verify_one``) and what each rank issued (``labutils.instruments.ledger.Ledger``).
A stub that raises NotImplementedError is "not attempted": the checker says so; ``usable`` gives a
stand-in (a bisection on the fit's model) where the notebook needs a size.
"""
from __future__ import annotations

from ..bandwidth import AlphaBeta
from . import attempted, fail, passed, run_ranks, say_not_attempted, standin

ONE_WAY_SIZES = (8, 4096, 2**20)   # bytes: one element pair, a page, a large message
TIMEOUT_S = 60                    # a learner's exchange that hangs is stopped after this long
WORLD_SIZE = 3                    # send_one_way's ranks: an odd number, so that the last one has no partner

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
    """On every rank: the benchmark's check of ``fn`` as send_one_way at each size, and what ``fn`` issued
    there (``Ledger``: op, peer, bytes); nothing, if ``fn`` is still a stub (every rank's stub raises before it
    sends)."""
    from ..bench import ops
    from ..instruments.ledger import Ledger
    wrong, issued = {}, {}

    def run(case):
        with Ledger("send_one_way") as book:
            fn(case)
        issued[size] = [(r.op, r.peer, r.size_bytes) for r in book.records]

    for size in ONE_WAY_SIZES:
        try:
            wrong[size] = ops.verify_one(rank, world_size, "send_one_way", size, run=run)
        except NotImplementedError:
            if wrong:
                raise
            return {"attempted": False, "wrong": {}, "issued": {}}
    return {"attempted": True, "wrong": wrong, "issued": issued}


def expected_issue(rank: int, world_size: int, size_bytes: int) -> list[tuple]:
    """What one call of the one-way form issues on ``rank``: rank 2k one send of S to 2k+1, rank 2k+1 one
    receive of S from 2k, a last rank without a partner (odd world size) nothing."""
    if rank % 2 == 0 and rank + 1 < world_size:
        return [("send", rank + 1, size_bytes)]
    if rank % 2 == 1:
        return [("recv", rank - 1, size_bytes)]
    return []


def _issue_hint(got: list, want: list) -> str:
    ops = [op for op, _, _ in got]
    if any(op not in ("send", "recv") for op in ops):
        return ("a collective moves data between every rank of the group (an all_gather puts each rank's input "
                "on every rank: (n-1)/n x S out of each of them); a one-way send moves S once, from 2k to 2k+1: "
                "dist.isend on the sender, dist.irecv on the receiver")
    if not want:
        return "with an odd number of ranks the last one has no partner: it issues nothing"
    if len(got) > 1:
        return ("one operation per rank and call: the sender's isend of the whole case.inp, the receiver's irecv "
                "into case.out (the benchmark compares one operation per rank with send_recv's two)")
    return "rank 2k sends to 2k+1 and rank 2k+1 receives from 2k, the whole tensor once; the other ranks stay out"


def send_one_way(fn, pool=None, *, timeout: float = TIMEOUT_S) -> None:
    """``fn(case)`` must move ``case.inp`` of rank 2k into ``case.out`` of rank 2k+1 -- one direction only,
    one operation per rank, every operation waited for -- and leave every other output untouched. Checked on
    ``WORLD_SIZE`` gloo ranks (an odd number: the last rank has no partner), element by element with the
    benchmark's own check, and by what each rank issued (``labutils.instruments.ledger``). ``pool``: a
    ``RankPool`` of that many gloo ranks to run in (else a fresh launch)."""
    results = run_ranks(_one_way_rank, fn, pool=pool, world_size=WORLD_SIZE, backend="gloo", timeout_s=timeout,
                        hang_hint="every send needs the matching receive on the peer: rank 2k sends to 2k+1, "
                                  "rank 2k+1 receives from 2k; a rank that both sends and waits for its own send "
                                  "before receiving deadlocks, and so does a last odd rank that sends or receives",
                        hint="case.inp, case.out, case.rank and case.world_size are all you need; "
                             "dist.isend(tensor, dst) and dist.irecv(tensor, src) return works to .wait() on")
    if not results[0]["attempted"]:
        say_not_attempted("send_one_way")
        return
    bad = {size: w for size, w in results[0]["wrong"].items() if w}
    if bad:
        size, w = next(iter(bad.items()))
        fail(f"send_one_way left {w} wrong elements over the {WORLD_SIZE} ranks at {size} bytes",
             "only rank 2k+1's output may change, and it must hold exactly rank 2k's input: a rank 2k that "
             "also receives (an exchange in both directions) overwrites its own output; an irecv not "
             "waited for may not have arrived yet")
    for rank, res in enumerate(results):
        for size in ONE_WAY_SIZES:
            got, want = [tuple(x) for x in res["issued"].get(size, [])], expected_issue(rank, WORLD_SIZE, size)
            if got != want:
                show = lambda ops: ", ".join(f"{op} {b} B {'to' if op == 'send' else 'from'} {p}"  # noqa: E731
                                             if p is not None else f"{op} {b} B" for op, p, b in ops) or "nothing"
                fail(f"send_one_way issued on rank {rank} of {WORLD_SIZE} at {size} bytes: {show(got)}; "
                     f"the one-way form issues {show(want)}", _issue_hint(got, want))
    passed(f"send_one_way delivers rank 2k's input to rank 2k+1 and nothing else, one send and one receive "
           f"per pair, the last of {WORLD_SIZE} ranks idle, at {', '.join(str(s) for s in ONE_WAY_SIZES)} bytes")
