"""One training step under ``torch.profiler``: a Perfetto-ready trace file, and the spans it contains.

    path = trace.profile_step(step, "traces/08_ddp_rank0.json.gz")   # chrome trace, gzip'd
    t = trace.summarize(trace.load_events(path), lane="rank 0")
    t["comm_ms"], t["overlap_ms"]            # NCCL kernel time, and how much of it ran beside compute
    t["idle_ms"]                             # time in the step when no kernel at all ran on the GPU
    plots.timeline_plot(t["spans"])          # phases, compute kernels, NCCL kernels

Open the file in https://ui.perfetto.dev (or chrome://tracing): one row per CUDA stream; DDP's
all-reduces are the ``ncclDevKernel_AllReduce...`` kernels on NCCL's own stream, beside the backward's
GEMMs on the default stream. ``summarize`` reads the same file: kernels whose name starts with
``nccl`` are communication, every other kernel is compute, and the ``record_function`` ranges
("forward", "backward", "optimizer") appear on the GPU as ``gpu_user_annotation`` events.
"""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Callable

PHASES = ("forward", "backward", "optimizer")


def profile_step(step: Callable[[], None], path: str | Path) -> Path:
    """Run ``step()`` once under the profiler (CPU + CUDA activity) and write a chrome trace to
    ``path`` (gzip'd when it ends with ``.gz``). ``step`` should wrap its phases in
    ``torch.profiler.record_function(name)`` for the phase lane. Returns the path."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        activities.append(ProfilerActivity.CUDA)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with profile(activities=activities) as prof:
        step()
        if ProfilerActivity.CUDA in activities:
            torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return path


def load_events(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a chrome trace (``.json`` or ``.json.gz``)."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, non-overlapping cover of ``(start, end)`` intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(intervals) -> float:
    """Length covered by ``intervals``."""
    return sum(b - a for a, b in union(intervals))


def intersection(xs, ys) -> float:
    """Length covered by both interval sets."""
    xs, ys = union(xs), union(ys)
    i = j = 0
    covered = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        covered += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return covered


def merge_close(intervals, gap: float) -> list[tuple[float, float]]:
    """``union`` that also joins intervals less than ``gap`` apart (fewer bars to draw)."""
    out: list[list[float]] = []
    for a, b in union(intervals):
        if out and a - out[-1][1] < gap:
            out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def summarize(events: list[dict], *, lane: str = "GPU", draw_gap_ms: float = 0.05) -> dict:
    """Kernels and phases of one profiled step, in ms from the first GPU event.

    Returns:
        ``{"step_ms", "compute_ms", "comm_ms", "overlap_ms", "overlap_fraction", "idle_ms",
        "n_comm_kernels", "spans"}``: busy times are unions of kernel intervals; ``overlap_ms`` is the
        time NCCL kernels ran while a compute kernel ran too; ``idle_ms`` the time within the step when
        no kernel, memcpy or memset ran (the GPU waited: for the CPU to issue work); ``spans``
        (for ``plots.timeline_plot``) are the phases and the kernels merged where less than
        ``draw_gap_ms`` apart.

    Raises:
        ValueError: the trace holds no GPU kernel (a CPU-only trace, or CUDA activity not recorded).
    """
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    if not kernels:
        raise ValueError("the trace holds no GPU kernel. HINT: profile a step that runs on a GPU, with "
                         "ProfilerActivity.CUDA (trace.profile_step adds it when CUDA is in use).")
    phases = [e for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_user_annotation"
              and e.get("name") in PHASES]
    iv = lambda e: (float(e["ts"]) / 1e3, (float(e["ts"]) + float(e.get("dur", 0))) / 1e3)  # noqa: E731
    comm = [iv(e) for e in kernels if e["name"].lower().startswith("nccl")]
    compute = [iv(e) for e in kernels if not e["name"].lower().startswith("nccl")]
    copies = [iv(e) for e in events if e.get("ph") == "X" and e.get("cat") in ("gpu_memcpy", "gpu_memset")]
    t0 = min(a for a, _ in comm + compute + [iv(e) for e in phases])
    t1 = max(b for _, b in comm + compute + [iv(e) for e in phases])
    comm_ms, overlap_ms = total(comm), intersection(comm, compute)
    busy = total([(max(a, t0), min(b, t1)) for a, b in comm + compute + copies if b > t0 and a < t1])
    spans = [{"lane": f"{lane} phase", "start_ms": a - t0, "end_ms": b - t0, "kind": e["name"], "label": e["name"]}
             for e, (a, b) in ((e, iv(e)) for e in phases)]
    spans += [{"lane": f"{lane} compute kernels", "start_ms": a - t0, "end_ms": b - t0, "kind": "compute"}
              for a, b in merge_close(compute, draw_gap_ms)]
    spans += [{"lane": f"{lane} NCCL kernels", "start_ms": a - t0, "end_ms": b - t0, "kind": "NCCL"}
              for a, b in merge_close(comm, draw_gap_ms)]
    return {"step_ms": t1 - t0, "compute_ms": total(compute), "comm_ms": comm_ms, "overlap_ms": overlap_ms,
            "overlap_fraction": overlap_ms / comm_ms if comm_ms else 0.0,
            "idle_ms": (t1 - t0) - busy, "n_comm_kernels": len(comm), "spans": spans}
