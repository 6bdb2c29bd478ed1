"""Run a callable under ``torch.profiler`` and read what the GPU ran: kernel spans, NCCL and compute,
per device and stream, from the chrome trace the profiler writes (the file Perfetto opens).

    from labutils.instruments import profiler
    doc = profiler.profile(step, calls=2, warmup=1, cpu=False, path="traces/step_rank0.json.gz")
    ks = profiler.kernels(doc)                  # [{"name", "kind", "device", "stream", "ts", "dur"}, ...]
    [k["dur"] for k in profiler.nccl_kernels(doc)]       # us per NCCL kernel, in the order they started
    profiler.by_stream(ks)                      # {(device, stream): [kernel, ...]}
    profiler.cpu_op_us(doc, "c10d::allreduce_") # host time of a CPU op, per call (needs cpu=True)

Times (``ts`` start, ``dur``) are microseconds, as in the chrome trace format; on one host every rank's
trace uses the same clock. ``kind`` is ``"nccl"`` for NCCL's kernels (their names start with ``nccl``:
``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ...), ``"compute"`` for every other kernel, and, with
``copies=True``, ``"memcpy"`` / ``"memset"`` for the copy engines' and memset activities.

With ``cpu=True`` the profiler also records every operator, hook and launch on the CPU thread (and slows
that thread); ``cpu=False`` records the GPU's activity only, through CUPTI. ``warmup`` calls run under the
profiler first and are dropped (``schedule(wait=0, warmup=...)``), so that its start-up cost falls there.
"""
from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Callable

_GPU_CATS = {"kernel": None, "gpu_memcpy": "memcpy", "gpu_memset": "memset"}


def cuda_in_use() -> bool:
    """True when this process already uses a GPU (CUDA initialised): its activity can be recorded."""
    import torch
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def activities(cpu: bool = True) -> list:
    """``ProfilerActivity.CPU`` (if ``cpu``), plus ``CUDA`` when this process uses a GPU."""
    from torch.profiler import ProfilerActivity
    return ([ProfilerActivity.CPU] if cpu else []) + ([ProfilerActivity.CUDA] if cuda_in_use() else [])


def profile(fn: Callable[[], object], *, calls: int = 1, warmup: int = 0, cpu: bool = True,
            path: str | Path | None = None) -> dict:
    """Run ``fn()`` ``warmup`` times (profiled, then dropped) and ``calls`` times back to back under the
    profiler; return the chrome trace as ``{"traceEvents": [...]}``, also written to ``path`` (gzip'd
    if it ends in ``.gz``) when given. On a GPU the device is synchronised after the warm-up (its work
    finishes before recording starts) and after the last call (every kernel is recorded).

    Raises:
        ValueError: ``calls`` < 1 or ``warmup`` < 0, or ``cpu=False`` without CUDA in use (there would be
            nothing to record).
    """
    import torch
    from torch.profiler import profile as torch_profile, schedule
    for name, value, least in (("calls", calls, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name}={value!r}: profile needs an int >= {least}. HINT: calls=1 profiles one call.")
    cuda = cuda_in_use()
    if not cpu and not cuda:
        raise ValueError("profile(cpu=False) records GPU activity only, and CUDA is not in use here. "
                         "HINT: profile work that runs on a GPU, or pass cpu=True.")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    plan = schedule(wait=0, warmup=warmup, active=calls, repeat=1) if warmup else None
    with torch_profile(activities=activities(cpu), schedule=plan) as prof:
        for _ in range(warmup):
            fn()
            sync()
            prof.step()                          # the last warm-up step ends here: recording starts
        for _ in range(calls):
            fn()
        sync()
    return export(prof, path)


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


def events(doc) -> list[dict]:
    """The ``traceEvents`` of a trace dict (a list of events is returned as it is)."""
    return doc["traceEvents"] if isinstance(doc, dict) else list(doc)


def is_nccl(name: str) -> bool:
    """True for an NCCL kernel's name (``ncclDevKernel_...``, ``ncclKernel_...``)."""
    return name.lower().startswith("nccl")


def kernels(doc, *, device: int | None = None, copies: bool = False) -> list[dict]:
    """The GPU's spans in ``doc`` (a trace dict or its events), in the order they started:
    ``{"name", "kind", "device", "stream", "ts", "dur"}`` (us). Kernels only, unless ``copies`` (then
    also memcpy and memset); on ``device`` only, when given."""
    out = []
    for e in events(doc):
        cat = e.get("cat")
        if e.get("ph") != "X" or cat not in _GPU_CATS or (_GPU_CATS[cat] and not copies):
            continue
        args = e.get("args") or {}
        dev = int(args.get("device", e.get("pid", -1)))
        if device is not None and dev != device:
            continue
        kind = _GPU_CATS[cat] or ("nccl" if is_nccl(e["name"]) else "compute")
        out.append({"name": e["name"], "kind": kind, "device": dev, "stream": int(args.get("stream", e.get("tid", -1))),
                    "ts": float(e["ts"]), "dur": float(e.get("dur", 0.0))})
    return sorted(out, key=lambda k: k["ts"])


def nccl_kernels(doc, *, device: int | None = None) -> list[dict]:
    """``kernels`` of kind ``"nccl"``."""
    return [k for k in kernels(doc, device=device) if k["kind"] == "nccl"]


def by_stream(spans: list[dict]) -> dict:
    """``{(device, stream): [span, ...]}`` in first-seen order (each list keeps its order)."""
    out: dict = {}
    for s in spans:
        out.setdefault((s["device"], s["stream"]), []).append(s)
    return out


def cpu_op_us(doc, name: str) -> list[float]:
    """Durations (us) of the CPU ops called ``name``, in the order they started (a ``cpu=True`` trace)."""
    ops = [e for e in events(doc) if e.get("cat") == "cpu_op" and e.get("ph") == "X" and e["name"] == name]
    return [float(e["dur"]) for e in sorted(ops, key=lambda e: e["ts"])]
