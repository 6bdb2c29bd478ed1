"""Lab 01 on one GPU: the source's "optimised" program -- which runs entirely on ``cuda:0`` -- profiled with
a CUDA trace, and that trace kept (small) in the recording, so that a learner without a GPU opens the very
trace the recording machine took. Run it::

    from labutils.labs.lab01_cuda_comm import devices, one_gpu
    data = one_gpu.profile_program(lambda: program(x, y), devices.gpu_setup(1))
    data["kernels"]      # what ran on the GPU (analysis.device_kernels rows)
    one_gpu.write_trace(m, directory)   # m: its recorded.Measurement -> a Perfetto/Chrome trace file

The trace keeps the events a reader looks at (operators, CUDA runtime calls, kernels, copies, memsets and
the arrows between them), at most ``MAX_EVENTS``: enough for one call of a small program, small enough to
ship in a recording.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from .devices import CommSetup
from .measure import profile_kernels

MAX_EVENTS = 3000
KEPT_CATEGORIES = {"cpu_op", "user_annotation", "gpu_user_annotation", "cuda_runtime", "cuda_driver", "kernel",
                   "gpu_memcpy", "gpu_memset", "ac2g"}


def small_trace(trace: dict, max_events: int = MAX_EVENTS) -> dict:
    """``trace`` (Chrome trace JSON from ``export_chrome_trace``) with only the events in
    ``KEPT_CATEGORIES`` and the metadata (``"ph": "M"``: process and thread names), at most ``max_events``
    of the others (the first ones: the program runs once); ``"dropped_events"`` says how many went."""
    events = trace.get("traceEvents", [])
    meta = [e for e in events if e.get("ph") == "M"]
    kept = [e for e in events if e.get("ph") != "M" and e.get("cat") in KEPT_CATEGORIES]
    return {"traceEvents": meta + kept[:max_events], "displayTimeUnit": "ms",
            "dropped_events": len(events) - len(meta) - min(len(kept), max_events)}


def profile_program(fn: Callable[[], object], setup: CommSetup, *, trace_path=None) -> dict:
    """Run ``fn`` once (warm-up: allocator, kernels' first launch), then once under ``torch.profiler``
    with the CPU and (on a GPU) the CUDA activities.

    Returns:
        ``{"kernels": device_kernels rows, "devices": [indices of the GPUs that ran anything],
        "trace": small_trace(...)}`` (JSON-able); also writes the full trace to ``trace_path`` if given.
    """
    out = profile_kernels(fn, setup, trace_path=trace_path, keep_trace=True)
    kernels = out["kernels"]
    return {"kernels": kernels, "devices": sorted({k["device"] for k in kernels}), "trace": small_trace(out["trace"])}


def labelled_trace(trace: dict, source: str) -> dict:
    """``trace`` with its source (``recorded.Measurement.source``) in ``otherData`` and as a label on every
    process, so that Perfetto and ``chrome://tracing`` show where it was taken."""
    pids = sorted({e["pid"] for e in trace.get("traceEvents", []) if "pid" in e}, key=str)
    labels = [{"name": "process_labels", "ph": "M", "pid": pid, "args": {"labels": source}} for pid in pids]
    return {**trace, "traceEvents": labels + list(trace.get("traceEvents", [])), "otherData": {"source": source}}


def write_trace(m, directory: Path, stem: str = "01_optimised_one_gpu") -> Path:
    """Write the trace of ``m`` (the ``recorded.Measurement`` of ``profile_program``) to
    ``directory/<stem>.json`` when live, ``directory/<stem>.RECORDED.json`` when recorded, labelled with
    ``m.source`` either way; returns the path.

    Raises:
        ValueError: ``m`` holds no trace (a recording from before traces were kept).
    """
    if not m.data.get("trace"):
        raise ValueError(f"{m.name!r} ({m.source}) holds no trace. HINT: re-record it on a GPU with "
                         "LABUTILS_RECORD=1.")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stem}{'' if m.live else '.RECORDED'}.json"
    path.write_text(json.dumps(labelled_trace(m.data["trace"], m.source)))
    return path
