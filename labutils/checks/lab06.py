"""Checkers for lab 06 (capstone: benchmark, alpha-beta fits, predictions)."""
from __future__ import annotations

from ..bandwidth import AlphaBeta
from ..solutions import lab06 as solution
from . import fail, passed, say_not_attempted

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
    probe = {"min_size_for_fraction": (_FITS["all_reduce"], 0.5),
             "predict_step_comm_ms": (_FITS, [])}[name]
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


def predict_step_comm_ms(fn) -> None:
    """``fn(fits, ops)`` must return sum(count_per_step x fits[op].predict_ms(size_bytes)) in ms."""
    if not _attempted(fn, _FITS, []):
        _not_attempted("predict_step_comm_ms")
        fn = solution.predict_step_comm_ms
    ops = [{"what": "attention out", "op": "all_reduce", "size_bytes": 8 * 2**20, "count_per_step": 4},
           {"what": "mlp out", "op": "all_reduce", "size_bytes": 2**10, "count_per_step": 2},
           {"what": "params", "op": "all_gather", "size_bytes": 64 * 2**20, "count_per_step": 1},
           {"what": "activations", "op": "send_recv", "size_bytes": 4 * 2**20, "count_per_step": 16}]
    cases = [([], 0.0)] + [([op], None) for op in ops] + [(ops, None)]
    for case_ops, want in cases:
        want = solution.predict_step_comm_ms(_FITS, case_ops) if want is None else want
        got = fn(_FITS, case_ops)
        try:
            ok = abs(float(got) - want) <= 1e-9 + 1e-6 * want
        except (TypeError, ValueError):
            ok = False
        if not ok:
            hint = "each op costs alpha + S / beta (fit.predict_ms(S), in ms) and runs count_per_step times"
            if len(case_ops) == 1 and case_ops[0]["count_per_step"] > 1:
                hint = "multiply by count_per_step: the op runs that many times per step"
            if not case_ops:
                hint = "a step without communication costs 0 ms"
            fail(f"predict_step_comm_ms(fits, {[o['what'] for o in case_ops]}) = {got!r}, "
                 f"expected {want:.6g} ms", hint)
    passed(f"predict_step_comm_ms adds count x (alpha + S / beta) over the ops ({len(cases)} cases)")
