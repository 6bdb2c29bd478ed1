"""Lab 06's arithmetic on measurements (pure: lists and dicts in, dicts out; no GPU).

* ``kernel_parts``: the same collective profiled on every rank. An NCCL kernel starts when its rank
  launches it and ends when the data has moved, which needs every rank: the kernels of one call end
  together, so the rank that launched last has the shortest kernel -- the transfer itself -- and
  every other rank's kernel is that plus the time it waited for the last one.
* ``alpha_split``: where the time of one small eager call goes -- the host's launch vs the device.
* ``comm_ops`` / ``fit_for`` / ``predictions``: another lab's recorded ops predicted from the
  benchmark's fits, each with the fit that matches how the op moves data, against the time that
  matches what the fit measures (e.g. lab 02's transfer, next to its in-step time).
"""
from __future__ import annotations

import statistics

from ... import bandwidth


def _median(xs) -> float:
    xs = [float(x) for x in xs]
    if not xs:
        raise ValueError("no values to take the median of. HINT: the measurement recorded nothing; "
                         "was the profiled loop empty, or did the trace miss the CUDA activity?")
    return statistics.median(xs)


def kernel_parts(per_rank_us: list[list[float]], skip: int = 1) -> dict:
    """Split the kernels of repeated calls into transfer and waiting.

    Args:
        per_rank_us: per rank, the durations (us) of the NCCL kernels of the same calls, in order.
        skip: leading calls to drop (the first one also waits for the others' start).

    Returns:
        ``{"calls", "transfer_us"`` (median over calls of the shortest kernel), ``"kernel_us"`` (per
        rank, median), ``"wait_us"`` (per rank, median of kernel - shortest)``}``.

    Raises:
        ValueError: fewer than two ranks, or ranks with different numbers of kernels.
    """
    if len(per_rank_us) < 2:
        raise ValueError(f"kernel_parts needs the kernels of >= 2 ranks, got {len(per_rank_us)}.")
    counts = {len(k) for k in per_rank_us}
    if len(counts) != 1:
        raise ValueError(f"the ranks profiled different numbers of NCCL kernels ({sorted(counts)}). HINT: "
                         "profile the same calls on every rank, with nothing else issuing collectives.")
    calls = list(zip(*per_rank_us))[skip:]
    if not calls:
        raise ValueError(f"no call left after skipping {skip}. HINT: profile more calls.")
    transfer = [min(c) for c in calls]
    n = len(per_rank_us)
    return {"calls": len(calls), "transfer_us": _median(transfer),
            "kernel_us": [_median(c[r] for c in calls) for r in range(n)],
            "wait_us": [_median(c[r] - t for c, t in zip(calls, transfer)) for r in range(n)]}


def alpha_split(ranks: list[dict]) -> dict:
    """Host vs device time of one small eager call, from each rank's
    ``{"eager_us", "host_us", "cpu_op_us": [...], "kernel_us": [...]}`` and, where it was measured,
    ``"eager_after_us"`` (the same loop timed again after the profiler).

    Returns:
        ``eager_us`` (per call, back to back, slowest rank), ``host_us`` (the host's time to issue one
        call, slowest rank), ``cpu_op_us`` (the C++ op under the profiler, slowest rank's median),
        ``transfer_us`` (the NCCL kernel of the rank that launched last), ``device_share``
        (transfer / eager), the per-rank kernel medians, and ``eager_after_us`` (slowest rank; None
        when not measured).
    """
    parts = kernel_parts([r["kernel_us"] for r in ranks])
    eager = max(r["eager_us"] for r in ranks)
    after = [r["eager_after_us"] for r in ranks if r.get("eager_after_us") is not None]
    return {"eager_us": eager, "host_us": max(r["host_us"] for r in ranks),
            "cpu_op_us": max(_median(r["cpu_op_us"]) for r in ranks),
            "transfer_us": parts["transfer_us"], "kernel_us": parts["kernel_us"], "calls": parts["calls"],
            "device_share": parts["transfer_us"] / eager,
            "eager_after_us": max(after) if len(after) == len(ranks) else None}


# ----------------------------------------------------------------------------- other labs' ops
ONE_WAY, BOTH_WAYS = "send_one_way", "send_recv"
_DIRECTIONS = {"one-way": ONE_WAY, "one_way": ONE_WAY, "oneway": ONE_WAY, "uni": ONE_WAY,
               "both": BOTH_WAYS, "both-ways": BOTH_WAYS, "bidirectional": BOTH_WAYS, "bidir": BOTH_WAYS}


def comm_ops(data: dict) -> list[dict]:
    """The ops of a lab's ``NN_comm_summary`` recording, each with its canonical collective and, under
    ``extra_ms``, any other time it recorded (``*_ms`` fields beyond ``measured_ms`` and ``step_ms``:
    e.g. a kernel time next to the in-step time). Works with every version of the summary."""
    out = []
    for op in data["ops"]:
        extra = {k: v for k, v in op.items() if k.endswith("_ms") and k not in ("measured_ms", "step_ms")
                 and isinstance(v, (int, float))}
        out.append({**op, "collective": bandwidth.canonical_op(op["op"]), "extra_ms": extra})
    return out


def fit_for(op: dict, default_p2p: str = BOTH_WAYS) -> str:
    """Which of the benchmark's fits predicts ``op``: its own collective, except that a point-to-point
    op is predicted with the one-way or the both-ways fit according to its ``direction`` field, else
    ``default_p2p`` (the caller knows how that lab moves its messages)."""
    coll = op.get("collective") or bandwidth.canonical_op(op["op"])
    if coll not in (ONE_WAY, BOTH_WAYS):
        return coll
    direction = str(op.get("direction", "")).lower()
    if direction and direction not in _DIRECTIONS:
        raise ValueError(f"unknown direction {op['direction']!r} of {op.get('what', op['op'])!r}. "
                         f"HINT: one of {', '.join(_DIRECTIONS)}.")
    return _DIRECTIONS.get(direction, coll if coll == ONE_WAY else default_p2p)


def predictions(fits: dict, ops: list[dict], world_size: int, default_p2p: str = BOTH_WAYS,
                measured: str = "measured_ms") -> list[dict]:
    """One row per op: the fit used, the predicted time of one call (ms), the op's ``measured`` time and
    their ratio (``measured`` names the recorded time to compare with: ``measured_ms``, or e.g. lab 02's
    ``kernel_ms``).

    Ops that ran on another number of ranks, whose fit the sweep lacks, or that have no ``measured``
    time get ``predicted_ms`` (or ``ratio``) None and a ``note`` saying why.
    """
    rows = []
    for op in ops:
        fit = fit_for(op, default_p2p)
        row = {"what": op["what"], "collective": op["collective"], "fit": fit, "size_bytes": op["size_bytes"],
               "count_per_step": op["count_per_step"], "measured_ms": op.get(measured),
               "predicted_ms": None, "ratio": None, "note": ""}
        if op["world_size"] != world_size:
            row["note"] = f"ran on {op['world_size']} ranks, the sweep on {world_size}"
        elif fit not in fits:
            row["note"] = f"the sweep has no {fit} (recorded before that form existed)"
        else:
            row["predicted_ms"] = fits[fit].predict_ms(op["size_bytes"])
            if row["measured_ms"]:
                row["ratio"] = row["predicted_ms"] / row["measured_ms"]
            else:
                row["note"] = f"no {measured} in this recording"
        rows.append(row)
    return rows


def median_ratio(rows: list[dict]) -> float | None:
    """Median of predicted / measured over the rows that were predicted (None if none)."""
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    return statistics.median(ratios) if ratios else None
