"""Lab 03's all-gather three ways, timed inside the ranks with ``timing.benchmark_collective`` (back-to-back calls
as nccl-tests times them, but CUDA events, the slowest rank, a median of samples): a ring of point-to-point steps,
NCCL's own collective, and (under NCCL) the same collective without NCCL -- gloo, through host memory.

``ring_vs_collective`` has the ``fn(rank, world_size, ...)`` form of ``labutils.launch`` / ``RankPool.run``
and runs on gloo (CPU tensors) and NCCL (one GPU per rank)::

    import labutils
    from labutils.labs.lab03_async_p2p import measure
    d = labutils.launch(measure.ring_vs_collective, my_ring_all_gather, [2**20, 2**26])[0]  # lab 03's exercise
    print(d["ring_busbw_gbps"], d["collective_busbw_gbps"], d["host_busbw_gbps"], d["ring_correct"])

The ring is a sequence of ``n - 1`` batched send/recv steps, each its own NCCL launch and synchronisation;
the collective is one NCCL kernel that pipelines every step. The host path is what moving GPU data between
processes costs without a GPU communication library: copy to host memory, gloo's all-gather over TCP
(loopback on one machine), copy back.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ... import bandwidth, timing
from ...compat import all_gather_into_tensor
from ...config import rank_device


def _host_all_gather(out: torch.Tensor, inp: torch.Tensor, group, host_out, host_in) -> None:
    """all_gather_into_tensor of GPU tensors without NCCL: to host memory, gloo, back to the GPU."""
    host_in.copy_(inp)
    all_gather_into_tensor(host_out, host_in, group=group)
    out.copy_(host_out)
    torch.cuda.synchronize()  # the copy back may still be running: the time includes it


def ring_vs_collective(rank: int, world_size: int, ring_fn, sizes_bytes: list[int],
                       warmup: int = 3, iters: int = 10, repeat: int = 5, host_repeat: int = 3) -> dict:
    """Time ``ring_fn(output, input)``, ``all_gather_into_tensor`` and (under NCCL) the host path on the
    same buffers.

    ``sizes_bytes`` are nccl-tests' all_gather sizes: the *gathered* float32 output. Times are the slowest
    rank's (``timing.benchmark_collective``); busbw = algbw x (n - 1) / n. The host path is slow: one call
    per sample, ``host_repeat`` samples after one warm-up.

    Returns:
        ``{"size_bytes", "ring_ms", "collective_ms", "host_ms", "ring_busbw_gbps", "collective_busbw_gbps",
        "host_busbw_gbps", "ring_correct", "host_correct", "world_size"}`` (lists in size order; the
        ``host_*`` lists are empty and ``host_correct`` None when the world's backend is not NCCL).
    """
    dev, n = rank_device(), world_size
    keys = ("size_bytes", "ring_ms", "collective_ms", "host_ms", "ring_busbw_gbps", "collective_busbw_gbps",
            "host_busbw_gbps")
    out = {k: [] for k in keys}
    gloo = dist.new_group(backend="gloo") if dist.get_backend() == "nccl" else None
    ring_ok, host_ok = True, True if gloo is not None else None
    for size in sizes_bytes:
        numel = max(1, size // (4 * n))
        inp = torch.full((numel,), float(rank), device=dev)
        got, ref = torch.empty(n * numel, device=dev), torch.empty(n * numel, device=dev)
        timed = {"ring": timing.benchmark_collective(lambda: ring_fn(got, inp), warmup=warmup, iters=iters,
                                                     repeat=repeat),
                 "collective": timing.benchmark_collective(lambda: all_gather_into_tensor(ref, inp),
                                                           warmup=warmup, iters=iters, repeat=repeat)}
        ring_ok &= torch.equal(got.cpu(), ref.cpu())
        if gloo is not None:
            via_host, h_in, h_out = torch.empty_like(ref), torch.empty(numel), torch.empty(n * numel)
            # timed like the others (CUDA events, NCCL barrier, slowest rank); only the gather goes through gloo
            timed["host"] = timing.benchmark_collective(
                lambda: _host_all_gather(via_host, inp, gloo, h_out, h_in), warmup=1, iters=1, repeat=host_repeat)
            host_ok &= torch.equal(via_host.cpu(), ref.cpu())
        s = 4 * n * numel
        out["size_bytes"].append(s)
        for key, t in timed.items():
            out[f"{key}_ms"].append(t.median_ms)
            out[f"{key}_busbw_gbps"].append(bandwidth.busbw_gbps("all_gather", s, t.median_ms, n))
    if gloo is not None:
        dist.destroy_process_group(gloo)
    return {**out, "ring_correct": ring_ok, "host_correct": host_ok, "world_size": n}
