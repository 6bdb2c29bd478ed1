"""Where a pipeline step's time goes (lab 04), from the measured spans -- pure, no torch::

    from labutils.labs.lab04_pipeline import analysis
    rows = analysis.bubble_breakdown(data)        # data: the "04_pipeline_bench" recording
    pred = analysis.memory_prediction(data)       # peak memory per stage, predicted from its parts

The bubble (p-1)/(m+p-1) assumes equal stages, free transfers and a GPU that never waits for its
host. ``bubble_breakdown`` adds what was measured, one cause at a time: each stage's own forward and
backward time per micro-batch (``schedule.simulate`` with per-stage times), then the one-way transfer
of each message, and reports what is left -- and how much of the stages' idle time the GPU spent
waiting for the host to issue the next operation (spans carry ``host_start_ms``).
"""
from __future__ import annotations

import statistics

from ...timing import summarize
from .schedule import bubble_fraction, bubble_from_spans, peak_in_flight, schedule_order, simulate

# An operation that started on the GPU within this long of the host issuing it found the GPU idle:
# the GPU was waiting for the host, not for a neighbour. (A receive of data already there, plus the
# launch, takes tens of microseconds; waiting for a neighbour takes as long as the neighbour's work.)
HOST_LAG_MS = 0.1


def stage_times(spans: list[dict], p: int) -> dict[str, list[float]]:
    """Median forward and backward time of one micro-batch on each stage (lanes ``"stage s"``).

    Returns:
        ``{"t_f": [ms per stage], "t_b": [ms per stage]}``.

    Raises:
        ValueError: a stage without forward or backward spans.
    """
    out: dict[str, list[float]] = {"t_f": [], "t_b": []}
    for s in range(p):
        for key, kind in (("t_f", "forward"), ("t_b", "backward")):
            times = [x["end_ms"] - x["start_ms"] for x in spans if x["lane"] == f"stage {s}" and x["kind"] == kind]
            if not times:
                raise ValueError(f"no {kind} spans for stage {s}. HINT: pass the spans of every stage of one step.")
            out[key].append(statistics.median(times))
    return out


def simulated_bubble(p: int, m: int, t_f, t_b, t_comm=0.0, schedule: str = "gpipe") -> float:
    """Mean bubble of ``schedule`` simulated with these per-micro-batch times (see ``schedule.simulate``)."""
    spans, _ = simulate(schedule_order(schedule, p, m), t_f, t_b, t_comm)
    return bubble_from_spans(spans)["mean"]


def host_wait_share(spans: list[dict], lag_ms: float = HOST_LAG_MS) -> float | None:
    """Share of the step (mean over stages) in which a stage's GPU sat idle waiting for its host.

    Idle time before an op counts when the op started on the GPU less than ``lag_ms`` after the
    host issued it: the GPU had nothing queued. None if the spans carry no host times.
    """
    if not spans or any("host_start_ms" not in s for s in spans):
        return None
    step = max(s["end_ms"] for s in spans)
    lanes = sorted({s["lane"] for s in spans})
    waited = []
    for lane in lanes:
        ops = sorted((s for s in spans if s["lane"] == lane), key=lambda s: s["start_ms"])
        total, prev_end = 0.0, 0.0
        for s in ops:
            idle = s["start_ms"] - prev_end
            if idle > 0 and s["start_ms"] - s["host_start_ms"] < lag_ms:
                total += idle
            prev_end = s["end_ms"]
        waited.append(total / step)
    return sum(waited) / len(waited)


def bubble_tolerance(samples: list[float] | None, floor: float = 0.02) -> float:
    """How close a predicted bubble must be to count as right: ``floor`` (2 percentage points), or the
    measured bubble's own p10-p90 range over the samples where that is wider (a model closer than the
    measurement's scatter cannot be told apart from it)."""
    if not samples or len(samples) < 2:
        return floor
    t = summarize(samples)   # order statistics (the fractions are >= 0, as timing samples are)
    return max(floor, t.p90_ms - t.p10_ms)


def bubble_breakdown(data: dict) -> list[dict]:
    """Per m: the bubble predicted from more and more of what was measured, and what remains.

    Returns one dict per m: ``ideal`` ((p-1)/(m+p-1)), ``stage_times`` (simulated with each stage's
    measured t_f, t_b), ``with_sends`` (also with the measured one-way transfer of each message),
    ``measured``, ``unexplained`` (measured - with_sends), ``host_wait`` (share of the step the GPUs
    waited for their host, or None), ``tolerance`` (``bubble_tolerance`` of the samples).
    """
    p, ms = data["world_size"], data["config"]["ms"]
    rows = []
    for i, m in enumerate(ms):
        spans = data["spans"][str(m)]
        st = data["stage_ms"][i] if data.get("stage_ms") else stage_times(spans, p)
        comm = (data["p2p"]["fwd_ms"][i], data["p2p"]["bwd_ms"][i])
        with_sends = simulated_bubble(p, m, st["t_f"], st["t_b"], comm)
        samples = data["bubble_samples"][i] if data.get("bubble_samples") else None
        rows.append({"m": m, "ideal": bubble_fraction(p, m),
                     "stage_times": simulated_bubble(p, m, st["t_f"], st["t_b"]),
                     "with_sends": with_sends, "measured": data["bubble_measured"][i],
                     "unexplained": data["bubble_measured"][i] - with_sends,
                     "host_wait": host_wait_share(spans), "tolerance": bubble_tolerance(samples)})
    return rows


def memory_prediction(data: dict) -> dict[str, list[float]] | None:
    """Peak memory of each stage during a step at m = ``schedule_m``, predicted from its parts:

    micro-batches held at once (``schedule.peak_in_flight``: m for GPipe, p - s for 1F1B) x what one
    micro-batch's forward keeps, + what one micro-batch's backward needs on top (its gradients of
    activations, and a weight-sized temporary for each weight gradient that is added into an existing
    ``.grad``), + on the last stage the outputs kept to be returned (the whole batch's).

    Returns:
        ``{"ours gpipe": [bytes per stage], "torch gpipe": [...], "torch 1f1b": [...]}``, or None when
        the recording has no backward measurement (older recordings) or no GPU memory figures.
    """
    mem, p, m = data["memory_bytes"], data["world_size"], data["config"]["schedule_m"]
    kept, backward = mem.get("one micro-batch kept"), mem.get("one micro-batch backward")
    if not kept or not backward or kept[0] is None or backward[0] is None:
        return None
    cfg = data["config"]
    outputs = cfg["rows"] * cfg["hidden"] * data["element_size"]
    out = {}
    for name, sched in (("ours gpipe", "gpipe"), ("torch gpipe", "gpipe"), ("torch 1f1b", "1f1b")):
        held = peak_in_flight(schedule_order(sched, p, m))
        out[name] = [held[s] * kept[s] + backward[s] + (outputs if s == p - 1 else 0) for s in range(p)]
    return out


MEMORY_KEYS = {"ours gpipe": "ours m={m}", "torch gpipe": "torch gpipe m={m}", "torch 1f1b": "torch 1f1b m={m}"}


def measured_memory(data: dict) -> dict[str, list[float]]:
    """The measured peaks under ``memory_prediction``'s names (those that were measured)."""
    mem, m = data["memory_bytes"], data["config"]["schedule_m"]
    return {name: mem[key.format(m=m)] for name, key in MEMORY_KEYS.items() if key.format(m=m) in mem}
