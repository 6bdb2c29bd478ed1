"""A ``torch.profiler`` run as a chrome trace, and what lab 06 reads in it: NCCL kernels (device time,
from CUPTI) and CPU ops (host time of the C++ op, e.g. ``c10d::allreduce_``).

    with torch.profiler.profile(activities=trace.activities()) as prof:
        for _ in range(20):
            dist.all_reduce(x)
        torch.cuda.synchronize()
    doc = trace.export(prof, "traces/06_alpha_rank0.json")   # also a file for Perfetto / chrome://tracing
    [k["dur"] for k in trace.nccl_kernels(doc)]               # us per NCCL kernel, in launch order
    trace.cpu_op_us(doc, "c10d::allreduce_")                  # us per CPU op

Timestamps (``ts``) and durations (``dur``) are microseconds, as in the chrome trace format. On one host
every rank's trace uses the same clock; the analysis here uses durations only, so it holds across nodes.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path

NCCL_KERNEL_PREFIXES = ("ncclDevKernel", "ncclKernel")


def activities() -> list:
    """CPU, plus CUDA when this process uses a GPU."""
    import torch
    from torch.profiler import ProfilerActivity
    acts = [ProfilerActivity.CPU]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        acts.append(ProfilerActivity.CUDA)
    return acts


def export(prof, path: str | Path | None = None) -> dict:
    """The chrome trace of a finished ``torch.profiler.profile`` as a dict; also written to ``path``
    (gzip'd if it ends in ``.gz``) when given, for Perfetto."""
    if path is not None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(path))
        return load(path)
    fd, tmp = tempfile.mkstemp(suffix=".json", prefix="labutils-trace-")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        return load(tmp)
    finally:
        os.unlink(tmp)


def load(path: str | Path) -> dict:
    """A chrome trace file (``.json`` or ``.json.gz``) as ``{"traceEvents": [...]}``."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        doc = json.load(f)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def nccl_kernels(doc: dict) -> list[dict]:
    """NCCL kernels (``{"name", "ts", "dur"}``, us), in the order they started."""
    ks = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"])} for e in doc["traceEvents"]
          if e.get("cat") == "kernel" and e.get("ph") == "X" and e["name"].startswith(NCCL_KERNEL_PREFIXES)]
    return sorted(ks, key=lambda k: k["ts"])


def cpu_op_us(doc: dict, name: str) -> list[float]:
    """Durations (us) of the CPU ops called ``name``, in the order they started."""
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e.get("ph") == "X" and e["name"] == name]
    return [float(e["dur"]) for e in sorted(ops, key=lambda e: e["ts"])]
