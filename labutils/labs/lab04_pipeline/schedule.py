"""Pipeline schedules (lab 04): stage splitting, the bubble math, schedule orders and their
simulation. (The GPipe micro-batch loop itself is in the notebook: the learner reads and runs it.)

    from labutils.labs.lab04_pipeline import schedule
    schedule.bubble_fraction(p=2, m=8)                 # 1/9: idle share of a GPipe step
    schedule.partition(n_layers=8, p=3)                # [(0, 3), (3, 6), (6, 8)]
    order = schedule.schedule_order("1f1b", p=4, m=8)  # per stage: [("F", 0), ..., ("B", 7)]
    spans, makespan = schedule.simulate(order, t_f=1, t_b=2)
    spans, makespan = schedule.simulate(order, t_f=[1.2, 0.9], t_b=[2.8, 3.2], t_comm=(0.1, 0.05))

Symbols (GPipe paper: Huang et al., NeurIPS 2019, arXiv:1811.06965): p stages (= ranks, "K" there),
m micro-batches ("M" there), t_f / t_b forward / backward time of one micro-batch on one stage.
Everything here is pure (unit-tested without torch.distributed).
"""
from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b")


def _check_pm(p, m) -> None:
    for name, v in (("p (stages)", p), ("m (micro-batches)", m)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be an int >= 1, got {v!r}.")


def bubble_fraction(p: int, m: int) -> float:
    """Share of a GPipe (or 1F1B) step that each stage sits idle: ``(p - 1) / (m + p - 1)``.

    With uniform stages and free communication a step lasts ``(m + p - 1) (t_f + t_b)`` and each
    stage works ``m (t_f + t_b)`` of it (GPipe: bubble overhead O((K-1)/(M+K-1))). Megatron-LM
    (Narayanan et al., SC'21, section 2.2.1) quotes the same bubble relative to the ideal time
    instead of the step time: (p - 1) / m.

    Raises:
        ValueError: p or m not an int >= 1.
    """
    _check_pm(p, m)
    return (p - 1) / (m + p - 1)


def ideal_speedup(p: int, m: int) -> float:
    """Step-time speedup of a p-stage pipeline over one device doing the same work, p m / (m + p - 1)
    (uniform stages, free communication, micro-batches as efficient as the full batch)."""
    _check_pm(p, m)
    return p * m / (m + p - 1)


def partition(n_layers: int, p: int) -> list[tuple[int, int]]:
    """Split layers ``0 .. n_layers - 1`` into p contiguous stages, as even as possible.

    Returns:
        ``[(start, stop), ...]``, one half-open range per stage; earlier stages get the extra layer.

    Raises:
        ValueError: p < 1 or more stages than layers.
    """
    _check_pm(p, 1)
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < p:
        raise ValueError(f"cannot split {n_layers!r} layers into {p} stages. "
                         "HINT: every stage needs at least one layer; use fewer ranks or more layers.")
    q, r = divmod(n_layers, p)
    bounds, start = [], 0
    for s in range(p):
        stop = start + q + (1 if s < r else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


# ---------------------------------------------------------------- schedules and their timing

def schedule_order(schedule: str, p: int, m: int) -> list[list[tuple[str, int]]]:
    """The order in which each stage runs forward ("F") and backward ("B") of each micro-batch.

    * ``"gpipe"``: all forwards, then all backwards (fill-drain; torch's ``ScheduleGPipe``);
    * ``"1f1b"``: ``p - s`` forwards, then backward/forward alternately, then the remaining
      backwards (PipeDream-Flush, Narayanan et al. 2021; torch's ``Schedule1F1B``). Same bubble as
      GPipe, but stage s holds at most ``p - s`` micro-batches' activations instead of m.

    Raises:
        ValueError: unknown schedule, or p / m not ints >= 1.
    """
    _check_pm(p, m)
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}. HINT: one of {SCHEDULES}.")
    orders = []
    for s in range(p):
        if schedule == "gpipe":
            orders.append([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
            continue
        warm = min(m, p - s)
        order = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            order += [("B", i), ("F", warm + i)]
        order += [("B", i) for i in range(m - warm, m)]
        orders.append(order)
    return orders


def _per_stage(value, p: int, what: str) -> list[float]:
    values = list(value) if isinstance(value, (list, tuple)) else [value] * p
    if len(values) != p:
        raise ValueError(f"{what} has {len(values)} values for {p} stages. HINT: one number, or one per stage.")
    return [float(v) for v in values]


class ScheduleDeadlock(ValueError):
    """A schedule in which every stage that has ops left waits for an op that can never run.

    ``stuck`` maps each such stage to ``(its next op, the op it waits for)``, an op being
    ``(kind, stage, micro-batch)``."""

    def __init__(self, stuck: dict):
        self.stuck = stuck
        self.waits = waits = "; ".join(f"stage {s} waits at {op[0]}{op[2]} for " +
                          ("its own " if dep[1] == s else f"stage {dep[1]}'s ") + f"{dep[0]}{dep[2]}"
                          for s, (op, dep) in stuck.items())
        super().__init__(f"the schedule deadlocks: {waits}. HINT: a stage runs its list in order and blocks "
                         "on its next op until what that op receives exists; run, on each stage, the ops "
                         "its neighbours wait for before the op that waits for them.")


def _check_order(order) -> None:
    if not isinstance(order, (list, tuple)) or not order:
        raise ValueError(f"an order is a list with one list of ops per stage, got {order!r}.")
    for s, ops in enumerate(order):
        for op in ops:
            if (not isinstance(op, (list, tuple)) or len(op) != 2 or op[0] not in ("F", "B")
                    or isinstance(op[1], bool) or not isinstance(op[1], int)):
                raise ValueError(f"stage {s}: {op!r} is not an op. HINT: an op is (\"F\", i) or (\"B\", i), "
                                 "i the micro-batch (an int).")


def _waits_for(kind: str, s: int, i: int, p: int) -> list[tuple[str, int, int]]:
    """The ops that (kind, i) on stage s needs done first: the previous stage's forward of i; the next
    stage's backward of i and this stage's own forward of i (its activations)."""
    if kind == "F":
        return [("F", s - 1, i)] if s > 0 else []
    return [("F", s, i)] + ([("B", s + 1, i)] if s < p - 1 else [])


def simulate(order: list[list[tuple[str, int]]], t_f=1.0, t_b=2.0,
             t_comm=0.0) -> tuple[list[dict], float]:
    """Run a schedule on an idealised machine: each stage runs its ops in the order given, and an op
    starts as soon as its stage is free and its inputs exist -- the blocking receive of a loop whose
    sends do not block (``isend``): forward of micro-batch i on stage s needs stage s-1's forward of i
    plus the forward transfer time; backward needs stage s+1's backward of i plus the backward
    transfer time, and stage s's own forward of i.

    Args:
        order: per stage, the ops in the order it runs them (``schedule_order``).
        t_f, t_b: forward / backward time of one micro-batch: one number, or one per stage.
        t_comm: transfer time of one message between neighbouring stages: one number, or a pair
            ``(forward activation, backward gradient)``.

    Returns:
        (spans, makespan): spans as ``plots.timeline_plot`` takes them (times in the unit of t_f).

    Raises:
        ScheduleDeadlock (a ValueError): the order deadlocks (an op waits for one that can never run).
        ValueError: an entry that is not an op, or a per-stage list of the wrong length.
    """
    _check_order(order)
    p = len(order)
    tf, tb = _per_stage(t_f, p, "t_f"), _per_stage(t_b, p, "t_b")
    c_f, c_b = (float(t_comm[0]), float(t_comm[1])) if isinstance(t_comm, (list, tuple)) else (float(t_comm),) * 2
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    nxt = [0] * p
    spans: list[dict] = []
    while any(nxt[s] < len(order[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while nxt[s] < len(order[s]):
                kind, i = order[s][nxt[s]]
                deps = _waits_for(kind, s, i, p)
                if any(d not in done for d in deps):
                    break  # an input not produced yet: try the other stages
                ready = max([0.0] + [done[d] + (0.0 if d[1] == s else c_f if kind == "F" else c_b) for d in deps])
                start = max(free[s], ready)
                end = start + (tf[s] if kind == "F" else tb[s])
                done[(kind, s, i)] = free[s] = end
                spans.append({"lane": f"stage {s}", "kind": "forward" if kind == "F" else "backward",
                              "label": f"{kind}{i}", "start_ms": start, "end_ms": end})
                nxt[s] += 1
                progressed = True
        if not progressed:
            stuck = {}
            for s in range(p):
                if nxt[s] < len(order[s]):
                    kind, i = order[s][nxt[s]]
                    dep = next(d for d in _waits_for(kind, s, i, p) if d not in done)
                    stuck[s] = ((kind, s, i), dep)
            raise ScheduleDeadlock(stuck)
    return spans, max(free)


def peak_in_flight(order: list[list[tuple[str, int]]]) -> list[int]:
    """Most micro-batches whose activations stage s holds at once (forward done, backward not yet),
    for each stage: GPipe m everywhere, 1F1B ``min(m, p - s)``."""
    peaks = []
    for ops in order:
        live = peak = 0
        for kind, _ in ops:
            live += 1 if kind == "F" else -1
            peak = max(peak, live)
        peaks.append(peak)
    return peaks


def bubble_from_spans(spans: list[dict]) -> dict:
    """Measured bubble of a step from its spans (lane = stage), all times from one common start 0.

    ``step = max end``, ``busy[lane] = sum of the lane's span durations``,
    ``bubble[lane] = 1 - busy / step``; ``mean`` is the average over lanes.
    """
    if not spans:
        raise ValueError("no spans: nothing ran. HINT: pass the spans of at least one stage.")
    step = max(s["end_ms"] for s in spans)
    busy: dict[str, float] = {}
    for s in spans:
        busy[s["lane"]] = busy.get(s["lane"], 0.0) + s["end_ms"] - s["start_ms"]
    bubble = {lane: 1.0 - b / step for lane, b in busy.items()}
    return {"step_ms": step, "busy_ms": busy, "bubble": bubble,
            "mean": sum(bubble.values()) / len(bubble)}
