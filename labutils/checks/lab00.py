"""Checkers for lab 00 (setup)."""
from __future__ import annotations

import random

from ..bandwidth import AlphaBeta
from . import attempted, fail, not_attempted, passed, say_not_attempted, standin


def prediction_sum(answer, world_size: int) -> None:
    """The all_reduce (sum) of rank + 1 over ``world_size`` ranks is n (n + 1) / 2."""
    expected = world_size * (world_size + 1) // 2
    if not_attempted(answer):
        print(f"… no prediction written: every rank holds {expected} = 1 + ... + {world_size}.")
        return
    if answer != expected:
        fail(f"you predicted {answer!r}, every rank holds {expected}",
             "all_reduce sums the contributions of all ranks and gives the sum to every rank")
    passed(f"prediction {answer} = 1 + ... + {world_size}")


def model_time_ms(size_bytes, alpha_us, beta_gbps):
    """The stand-in for an unwritten ``predicted_time_ms``: ``labutils.bandwidth.AlphaBeta``'s model."""
    return AlphaBeta(alpha_us, beta_gbps, 0.0).predict_ms(size_bytes)


standin(model_time_ms, "labutils.bandwidth.AlphaBeta(alpha_us, beta_gbps, 0).predict_ms")


def usable(fn):
    """``fn`` if the learner implemented it, else the stand-in ``model_time_ms`` (and says so)."""
    if attempted(fn, lambda f: f(1, 1.0, 1.0)):
        return fn
    say_not_attempted("predicted_time_ms", model_time_ms.labutils_standin)
    return model_time_ms


def predicted_time_ms(fn) -> None:
    """Compare ``fn(size_bytes, alpha_us, beta_gbps)`` with the alpha-beta model on fixed cases."""
    rng = random.Random(0)
    cases = [(0, 5.0, 100.0), (2**30, 0.0, 50.0)] + [
        (rng.choice([2**10, 2**20, 2**28]), rng.uniform(1, 30), rng.uniform(10, 500)) for _ in range(4)]
    if not attempted(fn, lambda f: f(*cases[0])):
        say_not_attempted("predicted_time_ms")
        return
    for size, a, b in cases:
        want = AlphaBeta(a, b, 0.0).predict_ms(size)
        got = fn(size, a, b)
        try:
            ok = abs(float(got) - want) <= 1e-9 + 1e-6 * abs(want)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            hint = "alpha is in microseconds (x 1e-3 for ms); S / beta is in seconds when beta is in B/s"
            if size == 0:
                hint = "an empty message still pays alpha: t(0) = alpha"
            fail(f"predicted_time_ms({size}, {a:.3g}, {b:.3g}) = {got!r}, expected {want:.6g} ms", hint)
    passed(f"predicted_time_ms matches t = alpha + S / beta on {len(cases)} cases")
