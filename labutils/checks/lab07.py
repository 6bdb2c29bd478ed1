"""Checkers for lab 07's exercises.

* ``all_agree(fn)``: the learner's rank-side ``all_agree(flag) -> bool`` (True on every rank exactly when
  every rank's flag is True), run on 3 gloo ranks for every pattern of flags, with the ledger: one
  collective, an all_reduce, on every rank.
* ``break_even(fn)``: the learner's ``break_even(start_s, launch_s, roundtrip_s, work_s) -> int`` (the
  number of experiments from which a pool costs no more than fresh launches), on fixed cases and on the
  lab's own measurement.

A stub that raises ``NotImplementedError`` is "not attempted" (no points, the notebook goes on);
``usable_all_agree`` gives the rest of the notebook a stand-in that does not show the answer.
"""
from __future__ import annotations

import itertools
import math

from . import attempted, fail, passed, run_ranks, say_not_attempted, standin

AGREE_RANKS = 3
AGREE_HINT = ("every rank must get the same answer, so every rank must take part: reduce this rank's flag "
              "with every other rank's (dist.all_reduce of an int tensor, with an op that is 0 as soon as one "
              "flag is 0)")


def _patterns(n: int) -> list[tuple[bool, ...]]:
    return list(itertools.product((True, False), repeat=n))


def _agree_rank(rank, world_size, fn):
    """Rank side: ``fn(flag)`` for every pattern of flags (this rank's entry), each under the ledger."""
    from ..instruments.ledger import Ledger
    out = []
    for pattern in _patterns(world_size):
        with Ledger("agree") as book:
            got = fn(pattern[rank])
        out.append({"got": got, "counts": book.counts(), "wire_bytes": book.wire_bytes_per_rank()})
    return out


def standin_all_agree(flag) -> bool:
    """The stand-in for an unwritten ``all_agree``: every rank's flag gathered as a Python object."""
    import torch.distributed as dist
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(flag))
    return all(flags)


standin(standin_all_agree, "dist.all_gather_object + all() (pickles every flag: slower than a reduction)")


def _probe_agree(fn):
    return fn(True)


def usable_all_agree(fn):
    """``fn`` if the learner wrote it, else the stand-in (saying so)."""
    if attempted(fn, _probe_agree):
        return fn
    say_not_attempted("all_agree", standin_all_agree.labutils_standin)
    return standin_all_agree


def all_agree(fn, pool=None) -> None:
    """Judge ``fn(flag) -> bool`` on 3 gloo ranks (``pool``: a 3-rank gloo pool to use, else a fresh launch)
    for all 8 patterns of flags."""
    if not attempted(fn, _probe_agree):
        say_not_attempted("all_agree")
        return
    out = run_ranks(_agree_rank, fn, world_size=AGREE_RANKS, backend="gloo", pool=pool,
                    hint="call it by hand on the ranks (pool.run) with a flag that depends on the rank")
    patterns = _patterns(AGREE_RANKS)
    results = []
    for i, pattern in enumerate(patterns):
        got = [o[i]["got"] for o in out]
        shown = "".join("T" if f else "F" for f in pattern)
        if not all(isinstance(g, bool) or (hasattr(g, "item") and g.numel() == 1) for g in got):
            fail(f"with flags {shown} your all_agree returned {got!r}", "return a Python bool (.item() of a "
                 "one-element tensor, then bool(...))")
        results.append([bool(g.item() if hasattr(g, "item") else g) for g in got])
    wrong = [(p, got) for p, got in zip(patterns, results) if got != [all(p)] * AGREE_RANKS]
    if wrong:
        models = [(lambda p: list(p), "each rank returned its own flag: the ranks must combine them"),
                  (lambda p: [p[0]] * len(p), "every rank returned rank 0's flag (a broadcast): rank 0 decides "
                                              "alone, and another rank's False is lost; reduce every rank's flag"),
                  (lambda p: [any(p)] * len(p), "that is 'any rank is True' (op MAX, or SUM > 0): all must be "
                                                "True, so use op MIN (or SUM == world_size)")]
        hint = next((h for model, h in models if all(got == model(p) for p, got in zip(patterns, results))),
                    AGREE_HINT)
        p, got = wrong[0]
        shown = "".join("T" if f else "F" for f in p)
        fail(f"with flags {shown} (rank 0, 1, 2) your all_agree gave {got}, expected {all(p)} on every rank", hint)
    for r, o in enumerate(out):
        counts = o[0]["counts"]
        if counts != {"all_reduce": 1}:
            hint = (AGREE_HINT if not counts else
                    "one all_reduce of one number is all it takes: a broadcast or gather moves more, or "
                    "decides on one rank" if "all_reduce" not in counts or len(counts) > 1 else
                    "one all_reduce of one number is enough: every extra collective is another round trip")
            fail(f"rank {r} issued {counts or 'no collective'} (the ledger)", hint)
    wire = max(o[0]["wire_bytes"] for o in out)
    passed(f"all_agree: the same, right answer on all {AGREE_RANKS} ranks for all {len(patterns)} patterns of "
           f"flags, with one all_reduce ({wire:.0f} bytes on the wire per rank at most)")


# ---- break-even -------------------------------------------------------------------------------------
BREAK_EVEN_CASES = [(5.0, 5.0, 0.004, 0.0), (10.0, 5.0, 0.004, 0.0), (2.0, 1.0, 0.5, 0.0),
                    (3.0, 2.0, 0.001, 7.0), (0.5, 4.0, 0.003, 1.0), (12.0, 1.5, 0.002, 0.25)]


def _expected_break_even(start_s, launch_s, roundtrip_s, work_s) -> int:
    """Smallest k >= 1 with start + k (roundtrip + work) <= k (launch + work), by counting (no formula)."""
    k = 1
    while start_s + k * (roundtrip_s + work_s) > k * (launch_s + work_s) + 1e-12:
        k += 1
    return k


def _probe_break_even(fn):
    return fn(1.0, 1.0, 0.1, 0.0)


def break_even(fn, measured: dict | None = None) -> None:
    """Judge ``fn(start_s, launch_s, roundtrip_s, work_s) -> int`` on fixed cases and, if given, on
    ``measured = {"start_s", "launch_s", "roundtrip_s"}`` (the lab's own medians) with no work."""
    if not attempted(fn, _probe_break_even):
        say_not_attempted("break_even")
        return
    cases = list(BREAK_EVEN_CASES)
    if measured:
        cases.append((measured["start_s"], measured["launch_s"], measured["roundtrip_s"], 0.0))
    got = []
    for case in cases:
        try:
            got.append(fn(*case))
        except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything; say what
            fail(f"break_even{case} raised {type(exc).__name__}: {exc}", "return a whole number of experiments")
    want = [_expected_break_even(*case) for case in cases]

    def same(g, w) -> bool:
        try:
            return float(g) == float(w)
        except (TypeError, ValueError):
            return False
    if all(same(g, w) and int(g) == g for g, w in zip(got, want)):
        passed(f"break_even: the first experiment from which the pool costs no more, on {len(cases)} cases"
               + (" (the last one this machine's measurement)" if measured else ""))
        return
    models = [(lambda s, l, r, w: s / (l - r),
               "that is the exact ratio; a number of experiments is whole: round it up (math.ceil)"),
              (lambda s, l, r, w: math.floor(s / (l - r)),
               "rounded down, the pool still costs more at that k: round the ratio up (math.ceil)"),
              (lambda s, l, r, w: math.ceil(s / l),
               "the pool pays a round trip per experiment too: subtract it from what a launch costs"),
              (lambda s, l, r, w: math.ceil(s / (l + w - r)),
               "the work is paid the same way by both: it cancels out of the difference")]
    hint = next((h for model, h in models
                 if all(same(g, model(*case)) and type(g) is type(model(*case)) for g, case in zip(got, cases))),
                "write both costs for k experiments (section 1's formulas), find the smallest whole k with "
                "pool <= launches; it is at least 1")
    case, g, w = next((c, g, w) for c, g, w in zip(cases, got, want) if not (same(g, w) and int(g) == g))
    fail(f"break_even{case} = {g!r}, expected {w}", hint)
