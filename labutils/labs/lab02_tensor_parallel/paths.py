"""Why a collective gets less of the link than a copy: the same bytes between two GPUs, by every path.

Run inside launched ranks (every rank calls it; ranks 0 and 1 move the data, the others only join
the barriers), on NCCL with one GPU per rank::

    POOL.run(paths.link_paths, 2**30)[0]    # {"size_bytes", "rows": [{path, engine, ..., gbps_per_direction}]}

The paths, each timed in the nccl-tests style (``timing.benchmark_loops``: back-to-back calls, the paths
taking turns sample by sample, the slowest rank -- nccl-tests' ``-a 3``, not its default mean), except the last one (see there):

* **copy engine**, one way and both ways at once: ``copy_`` into a buffer this process allocated on
  the peer GPU -- a DMA engine moves the bytes, no SM runs;
* **NCCL send/recv**, one way and both ways at once (``batch_isend_irecv``): NCCL's kernel, on SMs,
  pushes the bytes through its buffers on the peer;
* **NCCL collectives** ``all_reduce`` and ``all_gather_into_tensor`` on the default communicator and on
  communicators made with a fixed number of CTAs (NCCL's ``min_ctas = max_ctas``: how many thread
  blocks, each driving one channel, a call may use);
* the same all-gather from **one process driving both GPUs** (``torch.cuda.nccl``), to see whether the
  process boundary matters. It is timed apart, after the others (``time_alone``): rank 0 runs it while
  every other rank waits in a barrier of a gloo group, on the host. Inside ``benchmark_loops`` rank 1
  would wait in the next sample's barrier instead -- an NCCL kernel of rank 1's process spinning on
  GPU 1 -- and two processes' kernels do not run side by side on one GPU (without MPS the GPU
  time-slices between their contexts), so the all-gather would have GPU 1 only part of the time.

"GB/s per direction" is bytes per second leaving one GPU: S / t for a copy or a send, and busbw for a
collective (on a ring, busbw is what each link carries in each direction).
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ... import bandwidth, timing
from ...compat import all_gather_into_tensor
from ...nccl_groups import nccl_group
from ...config import rank_device


ONE_PROCESS = "all_gather, one process driving both GPUs"


def _one_process_all_gather(elements: int):
    """``torch.cuda.nccl.all_gather`` over GPUs 0 and 1 from this one process (NCCL's single-process
    communicator, as lab 01's ``torch.cuda.comm``), on ``elements`` bf16 elements gathered."""
    import torch.cuda.nccl as nccl
    devices = [torch.device("cuda", 0), torch.device("cuda", 1)]
    inputs = [torch.zeros(elements // 2, dtype=torch.bfloat16, device=d) for d in devices]
    outputs = [torch.empty(elements // 2 * 2, dtype=torch.bfloat16, device=d) for d in devices]
    return lambda: nccl.all_gather(inputs, outputs)


def time_alone(rank: int, make_fn, cpu_group, *, warmup: int, iters: int, repeat: int,
               other_gpus=()) -> tuple[float, float]:
    """Rank 0 times ``make_fn()()`` with ``timing.benchmark`` (``iters`` calls back to back per sample,
    events on rank 0's device) while every other rank waits in a barrier of ``cpu_group``, a gloo group:
    a wait on the host, with no kernel on any GPU. Every rank must call it; all get rank 0's
    ``(median_ms, spread)`` (broadcast over the default group). ``other_gpus``: further GPU indices
    the function runs on, synchronised before the others go on.

    For ``torch.cuda.nccl``'s all-gather, GPU 0's events time the call on both GPUs: its kernel on GPU 0
    ends only when GPU 1's block has arrived, and back-to-back calls on the two GPUs pace each other."""
    result = torch.zeros(2, dtype=torch.float64, device=rank_device())
    if rank == 0:
        fn = make_fn()
        t = timing.benchmark(fn, warmup=warmup, repeat=repeat, inner=iters, device=rank_device())
        for index in other_gpus:
            torch.cuda.synchronize(index)
        result[0], result[1] = t.median_ms, t.spread
        del fn
    dist.barrier(group=cpu_group)
    dist.broadcast(result, src=0)
    return float(result[0]), float(result[1])


def link_paths(rank: int, world_size: int, size_bytes: int = 2**30, ctas=(8, 64), warmup: int = 2,
               iters: int = 5, repeat: int = 5) -> dict | None:
    """Time ``size_bytes`` between GPUs 0 and 1 by each path (see the module docstring).

    Returns:
        ``None`` on gloo (no GPU link to measure), else ``{"size_bytes", "rows": [{"path", "engine",
        "directions", "ctas", "time_ms", "spread", "gbps_per_direction"}]}``; ``ctas`` None means
        NCCL's own choice.
    """
    if dist.get_backend() != "nccl" or world_size < 2:
        return None
    dev, mover = rank_device(), rank < 2
    elements = size_bytes // 2 // world_size * world_size          # bf16 elements, a multiple of n
    n_bytes = 2 * elements
    local = torch.zeros(n_bytes, dtype=torch.uint8, device=dev)
    # this process's own buffer on the peer GPU (a copy into it is a device-to-device DMA)
    remote = torch.empty(n_bytes, dtype=torch.uint8, device=torch.device("cuda", 1 - rank)) if mover else local
    inbox = torch.empty(n_bytes, dtype=torch.uint8, device=dev)
    reduced = torch.zeros(elements, dtype=torch.bfloat16, device=dev)
    gathered = torch.empty(elements, dtype=torch.bfloat16, device=dev)
    shard = torch.zeros(elements // world_size, dtype=torch.bfloat16, device=dev)
    groups = {None: None, **{c: nccl_group(c) for c in ctas}}
    cpu_group = dist.new_group(backend="gloo")        # for time_alone's wait: no kernel on any GPU

    def p2p(both: bool):
        def go():
            if not mover:
                return
            ops = []
            if both or rank == 0:
                ops.append(dist.P2POp(dist.isend, local, 1 - rank))
            if both or rank == 1:
                ops.append(dist.P2POp(dist.irecv, inbox, 1 - rank))
            for work in dist.batch_isend_irecv(ops):
                work.wait()
        return go

    def copy(both: bool):
        def go():
            if mover and (both or rank == 0):
                remote.copy_(local, non_blocking=True)
        return go

    specs = [("copy engine, one way", "copy engine", 1, None, copy(False), n_bytes, None),
             ("copy engine, both ways", "copy engine", 2, None, copy(True), n_bytes, None),
             ("NCCL send/recv, one way", "SMs (NCCL)", 1, None, p2p(False), n_bytes, None),
             ("NCCL send/recv, both ways", "SMs (NCCL)", 2, None, p2p(True), n_bytes, None)]
    for c, g in groups.items():
        suffix = "" if c is None else f", {c} CTAs"
        specs += [(f"all_reduce{suffix}", "SMs (NCCL)", 2, c,
                   lambda g=g: dist.all_reduce(reduced, group=g), reduced.numel() * 2, "all_reduce"),
                  (f"all_gather_into_tensor{suffix}", "SMs (NCCL)", 2, c,
                   lambda g=g: all_gather_into_tensor(gathered, shard, group=g), gathered.numel() * 2,
                   "all_gather")]
    times = timing.benchmark_loops({s[0]: timing.repeated(s[4]) for s in specs}, warmup=warmup, iters=iters,
                                   repeat=repeat)
    rows = []
    for name, engine, directions, c, _, size, op in specs:
        t = times[name]
        rows.append(_row(name, engine, directions, c, size, op, world_size, t.median_ms, t.spread))
    for g in groups.values():
        if g is not None:
            dist.destroy_process_group(g)
    del local, remote, inbox, reduced, gathered, shard
    median_ms, spread = time_alone(rank, lambda: _one_process_all_gather(elements), cpu_group,
                                   warmup=warmup, iters=iters, repeat=repeat, other_gpus=(1,))
    rows.append(_row(ONE_PROCESS, "SMs (NCCL)", 2, None, 2 * elements, "all_gather", 2, median_ms, spread))
    dist.destroy_process_group(cpu_group)
    return {"size_bytes": n_bytes, "world_size": world_size, "rows": rows}


def _row(name, engine, directions, ctas, size, op, ranks, time_ms, spread) -> dict:
    """One path's row; ``ranks``: the GPUs a collective spans (busbw's n)."""
    gbps = bandwidth.busbw_gbps(op, size, time_ms, ranks) if op else bandwidth.algbw_gbps(size, time_ms)
    return {"path": name, "engine": engine, "directions": directions, "ctas": ctas, "size_bytes": size,
            "time_ms": time_ms, "spread": spread, "gbps_per_direction": gbps}
