"""Lab 03 on one GPU: copies between host and device on a side stream beside a matmul, and the race that a
missing ``wait_stream`` leaves -- the harness around the notebook's own stream code.

What the lab teaches (the side stream, the two ``wait_stream`` calls, the copy that races an overwrite) is
code in the notebook; it hands this module zero-argument callables, and this module times them and packs
the result for a recording::

    data = streams.overlap_cases({"host -> GPU": (compute, h2d, together)}, size_bytes=...)
    race = streams.race_outcome(run, delay_ms=20.0)

Every time is a median of ``repeat`` samples, each bracketed by two ``timing.Clock`` marks on the current
stream after a ``synchronize`` (the notebook's ``together`` ends with the current stream waiting for the side
stream, so its stop mark covers both). The GPU sleep that makes a race's outcome deterministic is
``timing.gpu_sleep``.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch

from ... import timing
from .overlap import MAX_REPEATS, overlap_efficiency


def median_ms(fn: Callable[[], object], *, repeat: int = 10, warmup: int = 2) -> float:
    """Median time of ``fn()`` in ms: each sample alone (synchronised before), CUDA events on the current stream."""
    timing.check_counts(warmup=warmup, repeat=repeat)
    clock = timing.Clock("cuda")
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        clock.synchronize()
        start = clock.mark()
        fn()
        stop = clock.mark()
        clock.synchronize()
        samples.append(clock.elapsed_ms(start, stop))
    return statistics.median(samples)


def repeats_to_match(one_ms: float, target_ms: float) -> int:
    """How many repeats of a ``one_ms`` kernel take about ``target_ms`` (1 to ``MAX_REPEATS``)."""
    return max(1, min(MAX_REPEATS, round(target_ms / one_ms))) if one_ms > 0 else 1


def overlap_cases(cases: dict, *, size_bytes: int, compute_name: str, repeat: int = 10) -> dict:
    """Time each case alone, back to back and overlapped.

    Args:
        cases: ``{transfer name: (compute_k, transfer, together_k)}`` where ``compute_k(k)`` runs the compute
            kernel k times on the current stream, ``transfer()`` the copy on the current stream, and
            ``together_k(k)`` both, the copy on a side stream (the notebook's code).
        size_bytes: bytes one transfer moves.
        compute_name: what the compute is, for the table.

    Returns:
        ``{"size_bytes", "cases": [{"compute", "transfer", "k", "compute_ms", "comm_ms", "serial_ms",
        "overlapped_ms", "efficiency"}]}``; k is chosen so that the compute alone takes about as long as the
        transfer alone.
    """
    out = []
    for name, (compute_k, transfer, together_k) in cases.items():
        comm_ms = median_ms(transfer, repeat=repeat)
        k = repeats_to_match(median_ms(lambda: compute_k(1), repeat=repeat), comm_ms)
        compute_ms = median_ms(lambda: compute_k(k), repeat=repeat)
        serial_ms = median_ms(lambda: (compute_k(k), transfer()), repeat=repeat)
        overlapped_ms = median_ms(lambda: together_k(k), repeat=repeat)
        out.append({"compute": compute_name, "transfer": name, "k": k, "compute_ms": compute_ms,
                    "comm_ms": comm_ms, "serial_ms": serial_ms, "overlapped_ms": overlapped_ms,
                    "efficiency": overlap_efficiency(compute_ms, comm_ms, overlapped_ms)})
    return {"size_bytes": int(size_bytes), "cases": out}


def race_outcome(run: Callable, *, delay_ms: float = 20.0, trials: int = 5) -> dict:
    """Run the notebook's race ``run(delay, fixed)`` in four ways and say what the copy saw.

    ``run(delay, fixed)`` returns the share (0 to 1) of the copied elements that hold the value written
    *after* the copy was issued; ``delay()`` keeps the side stream busy first (or does nothing), ``fixed``
    says whether the ``wait_stream`` is there. Each way runs ``trials`` times; the share reported is the
    largest seen.

    Returns:
        ``{"delay_ms", "trials", "unsynced_delayed", "fixed_delayed", "unsynced", "fixed"}`` (shares).
    """
    timing.check_counts(trials=trials)
    rate = timing.sleep_cycles_per_ms()
    ways = {"unsynced_delayed": (True, False), "fixed_delayed": (True, True),
            "unsynced": (False, False), "fixed": (False, True)}
    out = {"delay_ms": float(delay_ms), "trials": trials}
    for key, (delayed, fixed) in ways.items():
        delay = (lambda: timing.gpu_sleep(delay_ms, rate)) if delayed else (lambda: None)
        out[key] = max(float(run(delay, fixed)) for _ in range(trials))
        torch.cuda.synchronize()
    return out
