"""The rank side of a benchmark run: every collective at every size, timed and verified.

``sweep(rank, world_size, config)`` runs on every rank, under ``labutils.launch`` or ``torchrun``::

    import labutils
    from labutils.bench import sweep
    from labutils.bench.config import BenchConfig
    result = labutils.launch(sweep.sweep, BenchConfig(maxbytes=2**20))[0]

Method (nccl-tests, ``src/common.cu``): per collective, buffers for the largest size are allocated
once and every size uses views of them; ``-w`` warm-up calls at the largest and the smallest size;
then per size and placement one untimed call and ``repeat`` samples of ``iters`` back-to-back calls
(``timing.benchmark_loops``: CUDA events, slowest rank, median). At each collective's smallest size
(and for the 8-byte all_reduce timed first) a bare loop of the same torch call is timed in turn with the
benchmark's own loop, so the table can say what the benchmark adds to the call. With
``cuda_graph=N`` (nccl-tests' ``-G``) each point's ``iters`` calls are captured in one CUDA graph and
replayed N times per sample instead (``labutils.bench.graph``); the 8-byte all_reduce timed first is then
measured both ways. After timing, the inputs are filled again with rank- and position-dependent values, the
op runs once more (replayed from a graph in graph mode) and every element of the result is compared
with the value it must have (``ops.verify_case``): ``#wrong`` is the number of wrong elements, summed
over ranks. Sizes, counts and bandwidths follow ``labutils.bandwidth`` (nccl-tests' ``size``).
"""
from __future__ import annotations

import json
import socket
import time

from .. import bandwidth, timing
from ..config import rank_device
from . import graph
from .config import DTYPES, FORMS, REDUCING, ROOTED, BenchConfig, bytes_per_rank, layout
from .ops import Buffers, Case, bare_loop, verify_case


def _measure(bufs: Buffers, lay: dict, placement: str, cfg: BenchConfig, rank: int, n: int,
             type_name: str, *, mode: str, bare: bool = False) -> dict:
    """One row: time (eager, with a bare loop beside it if ``bare``, or replayed from a CUDA graph),
    bandwidths, and the check."""
    coll = bufs.collective
    case = bufs.case(lay, placement, rank, n, cfg.redop, cfg.root)
    row = {"collective": coll, "placement": placement, "size_bytes": lay["size_bytes"],
           "count": lay["count"], "type": type_name,
           "redop": cfg.redop if coll in REDUCING else "none", "root": cfg.root if coll in ROOTED else -1,
           "time_us": None, "p10_us": None, "p90_us": None, "algbw_gbps": None, "busbw_gbps": None,
           "wrong": None, "iters": None, "repeat": None, "mode": mode, "bare_us": None}
    if cfg.timed:
        case.fill(seed=0)
        iters = cfg.iters_for(lay["size_bytes"])
        if mode == "graph":
            t = graph.measure(case, iters, cfg.cuda_graph, cfg.repeat)
            row["replays"] = cfg.cuda_graph
        else:
            loops = {"bench": timing.repeated(case.run)}   # the benchmark's own loop: the table's time
            if bare:
                loops["bare"] = bare_loop(case)
            ts = timing.benchmark_loops(loops, warmup=1, iters=iters, repeat=cfg.repeat)
            t = ts["bench"]
            if bare:
                row["bare_us"] = ts["bare"].median_us
        row.update(time_us=t.median_us, p10_us=t.p10_ms * 1e3, p90_us=t.p90_ms * 1e3,
                   iters=iters, repeat=cfg.repeat)
        if t.median_ms > 0:
            row["algbw_gbps"] = bandwidth.algbw_gbps(lay["size_bytes"], t.median_ms)
            row["busbw_gbps"] = bandwidth.busbw_gbps(coll, lay["size_bytes"], t.median_ms, n)
    if cfg.check:
        row["wrong"] = graph.verify(case, cfg.check) if mode == "graph" else verify_case(case, cfg.check)
    return row


def _sample_start_us(case: Case, iters: int, repeat: int) -> float:
    """What one sample adds once, whatever its length: t(1 call) - t(iters calls) per call, scaled
    (t(k) = per_call + fixed / k). Mostly the first call after the barrier waiting for the other ranks."""
    loop = bare_loop(case)
    one = timing.benchmark_loops({"one": loop}, warmup=1, iters=1, repeat=repeat)["one"].median_us
    many = timing.benchmark_loops({"many": loop}, warmup=1, iters=iters, repeat=repeat)["many"].median_us
    return max(0.0, (one - many) * iters / (iters - 1)) if iters > 1 else 0.0


def _check_memory(cfg: BenchConfig, rank: int, n: int, device) -> None:
    import os
    import torch
    need = bytes_per_rank(cfg, n)
    if device.type == "cuda":
        free = torch.cuda.mem_get_info(device)[0]
        where = f"{device} has {free / 2**30:.1f} GiB free"
    else:
        import psutil
        local = int(os.environ.get("LOCAL_WORLD_SIZE", n))
        free = psutil.virtual_memory().available // max(local, 1)
        where = f"this host has {free * local / 2**30:.1f} GiB available for {local} ranks"
    if need > 0.9 * free:
        raise MemoryError(
            f"rank {rank}: sizes up to {bandwidth.format_size(cfg.maxbytes)} need about "
            f"{need / 2**30:.1f} GiB per rank, but {where}. HINT: lower -e/--maxbytes.")


def _emitter(rank: int, progress_path, emit):
    def send(event: dict) -> None:
        if rank != 0:
            return
        if emit is not None:
            emit(event)
        if progress_path:
            with open(progress_path, "a") as f:
                f.write(json.dumps(event) + "\n")
    return send


def sweep(rank: int, world_size: int, config, progress_path: str | None = None, emit=None) -> dict:
    """Run the benchmark on this rank (call it on every rank of an initialised process group).

    Args:
        config: ``BenchConfig`` or a dict of its fields.
        progress_path: rank 0 appends one JSON event per line (start, latency, rows, done), for a
            parent process that shows progress while the ranks run.
        emit: rank 0 calls ``emit(event)`` with the same events (torchrun: print as we go).

    Returns:
        ``{"meta", "mode", "latency", "graph_latency", "rows", "elapsed_s"}`` (the same on every rank):
        one row per (collective, size, placement), times in us, bandwidths in GB/s, ``wrong``
        elements; ``bare_us`` where a bare loop was timed beside; ``latency`` is the eager 8-byte
        all_reduce timed first, before the table, with the table's own loop (the table's 8 B row is the same
        loop later), ``graph_latency`` the same replayed from a CUDA graph (graph mode only).

    Raises:
        MemoryError: the largest size does not fit (raised on every rank before allocating).
        ValueError: a root that is not a rank, or ``cuda_graph`` on a backend without CUDA graphs.
    """
    import torch
    import torch.distributed as dist
    cfg = config if isinstance(config, BenchConfig) else BenchConfig(**config)
    t0 = time.perf_counter()
    backend, device = dist.get_backend(), rank_device()
    dtype = getattr(torch, DTYPES[cfg.datatype][0])
    if cfg.root >= world_size:
        raise ValueError(f"root {cfg.root} is not a rank of {world_size}. HINT: -r 0 .. {world_size - 1}.")
    if cfg.cuda_graph:
        graph.require_graphs(backend)
    mode = "graph" if cfg.cuda_graph else "eager"
    send = _emitter(rank, progress_path, emit)
    me = {"rank": rank, "host": socket.gethostname(), "device": str(device),
          "name": torch.cuda.get_device_name(device) if device.type == "cuda" else ""}
    devices = [None] * world_size
    dist.all_gather_object(devices, me)
    _check_memory(cfg, rank, world_size, device)
    meta = {"world_size": world_size, "backend": backend, "config": cfg.to_dict(), "devices": devices,
            "nodes": len({d["host"] for d in devices}), "torch_version": torch.__version__, "mode": mode}
    send({"event": "start", "meta": meta})
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def warm(bufs, lay, placement):
        case = bufs.case(lay, placement, rank, world_size, cfg.redop, cfg.root)
        case.fill(seed=0)
        for _ in range(cfg.warmup_iters):
            case.run()
        sync()

    latency = graph_latency = None
    if cfg.latency and cfg.timed:
        lay = layout("all_reduce", 8, cfg.itemsize, world_size)
        if lay["count"] > 0:
            bufs = Buffers("all_reduce", lay, dtype, device)
            warm(bufs, lay, "in-place")
            latency = _measure(bufs, lay, "in-place", cfg, rank, world_size, cfg.datatype, mode="eager",
                               bare=cfg.bare)
            if cfg.bare:
                case = bufs.case(lay, "in-place", rank, world_size, cfg.redop, cfg.root)
                latency["sample_start_us"] = _sample_start_us(case, latency["iters"], cfg.repeat)
            send({"event": "latency", "row": latency})
            if mode == "graph":
                graph_latency = _measure(bufs, lay, "in-place", cfg, rank, world_size, cfg.datatype, mode=mode)
                send({"event": "latency", "row": graph_latency})
    rows = []
    for coll in cfg.collectives:
        lays = [layout(coll, s, cfg.itemsize, world_size) for s in cfg.sizes()]
        lays = [lay for lay in lays if lay["count"] > 0]
        if not lays:
            continue
        bufs = Buffers(coll, lays[-1], dtype, device)
        for lay in (lays[-1], lays[0]):  # nccl-tests: warm up at the largest, then the smallest size
            warm(bufs, lay, FORMS[coll][0])
        for lay in lays:
            bare = cfg.bare and mode == "eager" and lay is lays[0]
            pair = [_measure(bufs, lay, p, cfg, rank, world_size, cfg.datatype, mode=mode,
                             bare=bare and p == FORMS[coll][0]) for p in FORMS[coll]]
            rows += pair
            send({"event": "rows", "rows": pair})
        del bufs
    result = {"meta": meta, "mode": mode, "latency": latency, "graph_latency": graph_latency, "rows": rows,
              "elapsed_s": round(time.perf_counter() - t0, 3)}
    send({"event": "done", "elapsed_s": result["elapsed_s"]})
    return result
