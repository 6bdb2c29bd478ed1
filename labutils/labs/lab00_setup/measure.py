"""Lab 00's measurements: copy bandwidth of one process (host<->device, on one device, GPU to GPU)
and what starting a process costs.

    from labutils.labs.lab00_setup import measure
    data = measure.measure_local([2**k for k in range(12, 31, 2)])   # needs 1 GPU
    data = measure.measure_peer([2**k for k in range(12, 31, 2)])    # needs 2 GPUs

Bandwidth here is *bytes copied / time* (what ``algbw`` means for a copy). A device-to-device copy
on one GPU reads and writes every byte, so its memory traffic is twice that figure.
Each size is timed with ``timing.benchmark`` (CUDA events, warm-up, median), with fewer repeats
for large sizes so the whole sweep stays short.
"""
from __future__ import annotations

import subprocess
import sys
import time
from typing import Sequence

from ... import timing
from ...bandwidth import algbw_gbps, fit_alpha_beta


def repeats_for(size_bytes: int) -> int:
    """Samples per size: many for tiny copies (noisy), few for GiB copies (slow but stable)."""
    return 30 if size_bytes <= 2**20 else (10 if size_bytes <= 2**26 else 5)


def time_copy(dst, src, size_bytes: int) -> timing.Timing:
    """Median time of ``dst.copy_(src, non_blocking=True)`` (CUDA events on the destination's or
    source's GPU; the copy is on that device's current stream)."""
    dev = dst.device if dst.device.type == "cuda" else src.device
    return timing.benchmark(lambda: dst.copy_(src, non_blocking=True), warmup=3,
                            repeat=repeats_for(size_bytes), device=dev)


def _buffers(kind: str, size_bytes: int):
    import torch
    n = size_bytes
    if kind == "H2D pinned":
        return torch.empty(n, dtype=torch.uint8, device="cuda:0"), torch.empty(n, dtype=torch.uint8).pin_memory()
    if kind == "H2D pageable":
        return torch.empty(n, dtype=torch.uint8, device="cuda:0"), torch.empty(n, dtype=torch.uint8)
    if kind == "D2H pinned":
        return torch.empty(n, dtype=torch.uint8).pin_memory(), torch.empty(n, dtype=torch.uint8, device="cuda:0")
    if kind == "D2D (cuda:0)":
        return torch.empty(n, dtype=torch.uint8, device="cuda:0"), torch.empty(n, dtype=torch.uint8, device="cuda:0")
    if kind == "cuda:0 -> cuda:1":
        return torch.empty(n, dtype=torch.uint8, device="cuda:1"), torch.empty(n, dtype=torch.uint8, device="cuda:0")
    if kind == "cuda:1 -> cuda:0":
        return torch.empty(n, dtype=torch.uint8, device="cuda:0"), torch.empty(n, dtype=torch.uint8, device="cuda:1")
    raise ValueError(f"unknown copy kind {kind!r}.")


LOCAL_KINDS = ("H2D pinned", "H2D pageable", "D2H pinned", "D2D (cuda:0)")
PEER_KINDS = ("cuda:0 -> cuda:1", "cuda:1 -> cuda:0")


def sweep(kinds: Sequence[str], sizes: Sequence[int]) -> dict:
    """Time every copy kind at every size.

    Returns:
        ``{"size_bytes": [...], "time_ms": {kind: [...]}, "gbps": {kind: [...]},
        "fits": {kind: {"alpha_us", "beta_gbps", "max_rel_err"}}}`` (JSON types).
    """
    out = {"size_bytes": list(map(int, sizes)), "time_ms": {}, "gbps": {}, "fits": {}}
    for kind in kinds:
        times = []
        for s in sizes:
            dst, src = _buffers(kind, s)
            times.append(time_copy(dst, src, s).median_ms)
            del dst, src
        out["time_ms"][kind] = times
        out["gbps"][kind] = [algbw_gbps(s, t) for s, t in zip(sizes, times)]
        fit = fit_alpha_beta(sizes, times)
        out["fits"][kind] = {"alpha_us": fit.alpha_us, "beta_gbps": fit.beta_gbps,
                             "max_rel_err": fit.max_rel_err}
    return out


def measure_local(sizes: Sequence[int]) -> dict:
    """Host<->device and on-device copies on cuda:0 (needs 1 GPU)."""
    return sweep(LOCAL_KINDS, sizes)


def measure_peer(sizes: Sequence[int]) -> dict:
    """GPU0<->GPU1 copies (needs 2 GPUs; peer access is used when available). The fit of
    ``cuda:0 -> cuda:1`` is also stored as ``fits["gpu0->gpu1"]`` for later labs."""
    import torch
    out = sweep(PEER_KINDS, sizes)
    out["fits"]["gpu0->gpu1"] = out["fits"]["cuda:0 -> cuda:1"]
    out["peer_access"] = bool(torch.cuda.can_device_access_peer(0, 1))
    return out


def process_start_s(world_size: int, repeats: int = 3) -> dict:
    """Wall time of starting ``world_size`` bare ``python -c 'import torch'`` processes in parallel
    (median of ``repeats``): the floor under any one-shot launch."""
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        ps = [subprocess.Popen([sys.executable, "-c", "import torch, torch.distributed"])
              for _ in range(world_size)]
        for p in ps:
            p.wait()
        samples.append(time.perf_counter() - t0)
    return {"bare_start_s": sorted(samples)[len(samples) // 2], "samples_s": samples}
