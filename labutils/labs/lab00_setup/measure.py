"""Lab 00's measurements: copy bandwidth of one process (host<->device, on one device, GPU to GPU)
and what joins the GPUs.

    from labutils.labs.lab00_setup import measure
    data = measure.measure_local([2**k for k in range(12, 31, 2)])   # needs 1 GPU
    data = measure.measure_peer([2**k for k in range(12, 31, 2)])    # needs 2 GPUs; + "topology"

Bandwidth here is *bytes copied / time* (what ``algbw`` means for a copy). A device-to-device copy
on one GPU reads and writes every byte, so its memory traffic is twice that figure.
Each size is timed with ``timing.benchmark`` (CUDA events, warm-up, median), with fewer repeats
for large sizes so the whole sweep stays short.
"""
from __future__ import annotations

from typing import Sequence

from ... import timing
from ...bandwidth import algbw_gbps, fit_alpha_beta
from ...hw import HardwareInfo, describe


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
        return torch.empty(n, dtype=torch.uint8, device="cuda:0"), torch.empty(n, dtype=torch.uint8, pin_memory=True)
    if kind == "H2D pageable":
        return torch.empty(n, dtype=torch.uint8, device="cuda:0"), torch.empty(n, dtype=torch.uint8)
    if kind == "D2H pinned":
        return torch.empty(n, dtype=torch.uint8, pin_memory=True), torch.empty(n, dtype=torch.uint8, device="cuda:0")
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


def topology(info: HardwareInfo) -> dict:
    """What joins GPU 0 and GPU 1, as JSON data (stored with the GPU-to-GPU sweep, so that a machine
    without GPUs shows the reference machine's): the ``nvidia-smi topo -m`` code, peer access, GPU 0's
    NVLinks (how many, what they end at, NVLink version, nvidia-smi's per-link line rate) and the two
    NVLink peaks of ``hw`` (line rate, datasheet data rate), plus the PCIe ceiling of the host link.
    Unknown values are None; ``nvlink_remote`` is ``{}`` without NVML."""
    line = info.nvlink_gbps.get(0, [])
    return {"link": info.links.get((0, 1)), "peer_access": info.peer_access.get((0, 1)),
            "nvlinks": len(line) or None, "nvlink_remote": info.nvlink_remote,
            "nvlink_version": info.nvlinks.get(0, {}).get("version"),
            "line_gbps_per_link": line[0] if line else None,
            "link_peak_gbps": info.link_peak_gbps, "link_data_peak_gbps": info.link_data_peak_gbps,
            "pcie_peak_gbps": info.pcie_peak_gbps}


def topology_rows(topo: dict) -> dict:
    """``topology()`` data as ``{field: text}`` for a table a learner reads."""
    remote = topo.get("nvlink_remote") or {}
    ends = ", ".join(f"{n} to {kind}" for kind, n in remote.items()) or "unknown (needs NVML: nvidia-ml-py)"

    def gbps(key, what):
        return f"{topo[key]:g} GB/s per direction ({what})" if topo.get(key) else "unknown"
    return {"nvidia-smi topo -m, GPU0-GPU1": topo.get("link") or "no GPU pair",
            "peer access (GPU0 -> GPU1)": str(topo.get("peer_access")),
            "GPU 0's active NVLinks": str(topo.get("nvlinks") or 0),
            "where they end (NVML)": ends,
            "NVLink version (NVML)": topo.get("nvlink_version") or "unknown",
            "NVLink line rate": gbps("link_peak_gbps", f"nvidia-smi: {topo.get('line_gbps_per_link')} per link"),
            "NVLink data rate": gbps("link_data_peak_gbps", "datasheet rate per link x links"),
            "PCIe host link": gbps("pcie_peak_gbps", "payload ceiling of its generation and width")}


def measure_peer(sizes: Sequence[int], info: HardwareInfo | None = None) -> dict:
    """GPU0<->GPU1 copies (needs 2 GPUs; peer access is used when available), and ``topology(info)``
    (default: ``hw.describe()``). The fit of ``cuda:0 -> cuda:1`` is also stored as
    ``fits["gpu0->gpu1"]`` for later labs."""
    import torch
    out = sweep(PEER_KINDS, sizes)
    out["fits"]["gpu0->gpu1"] = out["fits"]["cuda:0 -> cuda:1"]
    out["peer_access"] = bool(torch.cuda.can_device_access_peer(0, 1))
    out["topology"] = topology(info or describe())
    return out


BOTH = "both at once"
BIDIRECTIONAL_KINDS = (*PEER_KINDS, BOTH)


def copies_for(size_bytes: int) -> int:
    """Back-to-back copies in one sample of the two-way sweep: enough that the host's synchronize and
    clock read are small next to them, few for GiB copies."""
    return 20 if size_bytes <= 2**22 else (10 if size_bytes <= 2**26 else 4)


def measure_bidirectional(sizes: Sequence[int], repeat: int = 5) -> dict:
    """GPU0 -> GPU1 alone, GPU1 -> GPU0 alone, and both at once (needs 2 GPUs): does the pair carry
    both directions at the same time at the speed of one?

    Each direction has its own pair of streams (one on each GPU): PyTorch runs a copy between GPUs on
    the source GPU's current stream and makes the other GPU's current stream wait for it, so two copies
    on the default streams would run one after the other. One sample: synchronise both GPUs, read the
    host clock, issue ``copies_for(size)`` copies (of each direction, for ``BOTH``), synchronise both,
    read the clock; time / copies. This is nccl-tests' way (a host clock after a synchronize), which a
    region spanning two devices needs; the one-way copies are timed the same way so that the ratio
    compares like with like. The median of ``repeat`` samples, after two untimed rounds.

    Returns:
        ``{"size_bytes": [...], "time_ms": {kind: [...]}, "gbps": {kind: [...]}, "copies": [...]}``,
        kinds ``BIDIRECTIONAL_KINDS``; for ``BOTH`` the time is per pair of copies and the bandwidth
        per direction.
    """
    import statistics

    import torch
    devices = (torch.device("cuda", 0), torch.device("cuda", 1))
    streams = {PEER_KINDS[0]: [torch.cuda.Stream(d) for d in devices],
               PEER_KINDS[1]: [torch.cuda.Stream(d) for d in devices]}
    host = timing.Clock("cpu")

    def sync():
        for d in devices:
            torch.cuda.synchronize(d)

    out = {"size_bytes": list(map(int, sizes)), "time_ms": {k: [] for k in BIDIRECTIONAL_KINDS},
           "gbps": {k: [] for k in BIDIRECTIONAL_KINDS}, "copies": []}
    for s in sizes:
        bufs = {kind: _buffers(kind, s) for kind in PEER_KINDS}
        k = copies_for(s)

        def issue(kinds):
            for _ in range(k):
                for kind in kinds:
                    dst, src = bufs[kind]
                    s0, s1 = streams[kind]
                    with torch.cuda.stream(s0), torch.cuda.stream(s1):
                        dst.copy_(src, non_blocking=True)

        for kind, kinds in ((PEER_KINDS[0], PEER_KINDS[:1]), (PEER_KINDS[1], PEER_KINDS[1:]), (BOTH, PEER_KINDS)):
            samples = []
            for i in range(repeat + 2):
                sync()
                start = host.mark()
                issue(kinds)
                sync()
                if i >= 2:   # two untimed rounds first
                    samples.append(host.elapsed_ms(start, host.mark()) / k)
            t = statistics.median(samples)
            out["time_ms"][kind].append(t)
            out["gbps"][kind].append(algbw_gbps(s, t))
        out["copies"].append(k)
        del bufs
    return out
