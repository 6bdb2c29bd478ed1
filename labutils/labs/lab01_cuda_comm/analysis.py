"""Lab 01's analysis, pure (no GPU): alpha-beta fits of a sweep and profiler kernel names, computed from
recorded or live JSON data (the verdicts built on them are in ``claims``)::

    from labutils.labs.lab01_cuda_comm import analysis
    analysis.fits(sweep)["comm.broadcast"]            # AlphaBeta(alpha_us, beta_gbps)
    analysis.kernel_kind("Memcpy PtoP (Device -> Device)")   # "peer copy"
"""
from __future__ import annotations

import re

from ... import bandwidth


def fits(sweep: dict) -> dict:
    """``{op: bandwidth.AlphaBeta}`` fitted to the medians of a ``measure.sweep`` result."""
    return {op: bandwidth.fit_alpha_beta(sweep["sizes"], d["median_ms"]) for op, d in sweep["ops"].items()}


def algbw(sweep: dict, op: str) -> list[float]:
    """Algorithm bandwidth S / t (GB/s) of ``op`` at every size of the sweep."""
    return [bandwidth.algbw_gbps(s, t) for s, t in zip(sweep["sizes"], sweep["ops"][op]["median_ms"])]


def kernel_kind(name: str) -> str:
    """Classify a device activity: ``nccl``, ``peer copy`` (Memcpy PtoP), ``local copy``
    (Memcpy DtoD), ``host copy``, ``memset`` or ``compute kernel``."""
    if "nccl" in name.lower():
        return "nccl"
    if name.startswith("Memcpy"):
        return {"PtoP": "peer copy", "DtoD": "local copy"}.get(name.split()[1] if " " in name else "",
                                                               "host copy")
    return "memset" if name.startswith("Memset") else "compute kernel"


def short_kernel_name(name: str, width: int = 60) -> str:
    """``void at::native::f<4, X<float>>(int, ...)`` -> ``at::native::f<…>``; memcpy/memset
    names are kept; cut to ``width`` characters."""
    if name.startswith(("Memcpy", "Memset")):
        return name[:width]
    name = name[5:] if name.startswith("void ") else name
    out, depth = [], 0
    for ch in name:
        if ch == "(" and depth == 0:
            break
        if ch == "<":
            depth += 1
            if depth == 1:
                out.append("<…>")
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    short = re.sub(r"\s+", " ", "".join(out)).strip()
    return short if len(short) <= width else short[:width - 1] + "…"


def device_kernels(spans) -> list[dict]:
    """Device-side activities (``instruments.profiler.kernels(doc, copies=True)``: kernels, copies,
    memsets) grouped by (kind, short name, device): ``[{"kind", "name", "device", "count", "time_us"}]``
    sorted by device, kind, name."""
    agg: dict = {}
    for s in spans:
        key = (kernel_kind(s["name"]), short_kernel_name(s["name"]), int(s["device"]))
        row = agg.setdefault(key, {"kind": key[0], "name": key[1], "device": key[2], "count": 0,
                                   "time_us": 0.0})
        row["count"] += 1
        row["time_us"] += float(s["dur"])
    return sorted(agg.values(), key=lambda r: (r["device"], r["kind"], r["name"]))
