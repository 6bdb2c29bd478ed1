"""The rank side of ``python -m labutils bench``: buffers, op callables and the correctness check.

``sweep(rank, world_size, config)`` runs on every rank, under ``labutils.launch`` or ``torchrun``::

    import labutils
    from labutils import bench_ops
    result = labutils.launch(bench_ops.sweep, bench_ops.BenchConfig(maxbytes=2**20))[0]

Method (nccl-tests, ``src/common.cu``): per collective, buffers for the largest size are allocated
once and every size uses views of them; ``-w`` warm-up calls at the largest and the smallest size;
then per size and placement one untimed call and ``repeat`` samples of ``iters`` back-to-back calls
(``timing.benchmark_collective``: CUDA events, slowest rank, median). After timing, the inputs are
filled again with rank- and position-dependent values, the op runs once more and every element
of the result is compared with the value it must have: ``#wrong`` is the number of wrong elements,
summed over ranks. Sizes, counts and bandwidths follow ``labutils.bandwidth`` (nccl-tests' ``size``).

Placements are those torch.distributed offers: ``all_reduce``, ``broadcast`` and ``reduce`` take one
tensor (in place only); ``all_gather`` / ``reduce_scatter`` run in place when the per-rank buffer is
the rank's slice of the large one (NCCL's definition of in place); ``all_to_all`` and send/recv
need two buffers (nccl-tests does not check them in place either).

The pure part -- ``BenchConfig``, ``layout``, the input pattern and ``count_wrong`` -- lives in
``labutils.bench_config`` and is re-exported here.
"""
from __future__ import annotations

import dataclasses
import json
import socket
import time

from . import bandwidth, timing
from .config import rank_device
from .bench_config import (DTYPES, FORMS, REDUCING, ROOTED, BenchConfig, _fill, _need_bytes, _reduce_tiles,
                           _tile, count_wrong, layout)
from .bench_config import (  # noqa: F401 - re-exported for the labs
    PLACEMENTS, REDOPS, auto_iters, canonical_dtype, planned_points)


def _reduce_op(redop: str):
    import torch.distributed as dist
    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}[redop]


def _send_recv(c):
    """Ring exchange as nccl-tests' sendrecv: send to rank+1, receive from rank-1, one NCCL group."""
    import torch.distributed as dist
    n = c.world_size
    ops = [dist.P2POp(dist.isend, c.inp, (c.rank + 1) % n), dist.P2POp(dist.irecv, c.out, (c.rank - 1) % n)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()  # NCCL: the current stream waits for the transfer (the CPU does not)


def _runner(collective: str):
    import torch.distributed as dist
    from .compat import all_gather_into_tensor as all_gather, reduce_scatter_tensor as reduce_scatter
    return {
        "all_reduce": lambda c: dist.all_reduce(c.out, op=c.op),
        "all_gather": lambda c: all_gather(c.out, c.inp),
        "reduce_scatter": lambda c: reduce_scatter(c.out, c.inp, op=c.op),
        "all_to_all": lambda c: dist.all_to_all_single(c.out, c.inp),
        "broadcast": lambda c: dist.broadcast(c.out, src=c.root),
        "reduce": lambda c: dist.reduce(c.out, dst=c.root, op=c.op),
        "send_recv": _send_recv,
    }[collective]


@dataclasses.dataclass
class Case:
    """One (collective, size, placement) on this rank: views of the buffers and the op to run.

    ``run_fn(case)`` does the op; pass your own to check another implementation (``check_one``).
    """
    collective: str
    placement: str
    rank: int
    world_size: int
    count: int
    redop: str
    root: int
    inp: object
    out: object
    expected: object
    run_fn: object = None
    op: object = None

    def __post_init__(self):  # resolved once: the timed loop should only pay for the call itself
        self.run_fn = self.run_fn or _runner(self.collective)
        self.op = _reduce_op(self.redop)

    def run(self):
        return self.run_fn(self)

    def fill(self, seed: int) -> None:
        """Inputs as nccl-tests' InitData (outputs zeroed first), and the expected result."""
        coll, r, n, c = self.collective, self.rank, self.world_size, self.count
        tiles = [_tile(p, seed, coll, self.redop) for p in range(n)]
        if not (coll == "reduce_scatter" and self.placement == "in-place"):
            self.out.zero_()  # the in-place reduce_scatter output is a slice of its input
        if coll == "broadcast" and r != self.root:
            pass  # in place: a non-root's buffer (zeros) is only written by the broadcast
        else:
            _fill(self.inp, tiles[r], r * c if coll == "all_gather" else 0)
        if coll == "all_gather":
            for p in range(n):
                _fill(self.expected[p * c:(p + 1) * c], tiles[p], p * c)
        elif coll == "all_to_all":
            for p in range(n):
                _fill(self.expected[p * c:(p + 1) * c], tiles[p], r * c)
        elif coll in REDUCING:
            _fill(self.expected, _reduce_tiles(tiles, self.redop), r * c if coll == "reduce_scatter" else 0)
        else:  # broadcast, send_recv
            _fill(self.expected, tiles[self.root if coll == "broadcast" else (r - 1) % n], 0)

    def wrong(self) -> int:
        """Wrong elements on this rank (reduce: only the root's result is defined)."""
        if self.collective == "reduce" and self.rank != self.root:
            return 0
        return count_wrong(self.out, self.expected)


class Buffers:
    """Send, receive and expected buffers of one collective for the largest size (as nccl-tests)."""

    def __init__(self, collective: str, max_layout: dict, dtype, device):
        import torch
        self.collective = collective
        self.send = torch.empty(max_layout["in_numel"], dtype=dtype, device=device)
        self.recv = torch.empty(max_layout["out_numel"], dtype=dtype, device=device)
        self.expected = torch.empty(max_layout["out_numel"], dtype=dtype, device=device)

    def case(self, lay: dict, placement: str, rank: int, world_size: int, redop: str, root: int,
             run=None) -> Case:
        """Views for one point; in place = NCCL's definition (the rank's slice of the big buffer)."""
        coll, c = self.collective, lay["count"]
        inp, out = self.send[:lay["in_numel"]], self.recv[:lay["out_numel"]]
        if placement == "in-place":
            if coll == "all_gather":
                inp = out[rank * c:(rank + 1) * c]
            elif coll == "reduce_scatter":
                out = inp[rank * c:(rank + 1) * c]
            else:
                inp = out
        return Case(coll, placement, rank, world_size, c, redop, root, inp, out,
                    self.expected[:lay["out_numel"]], run)


def check_case(case: Case, repeats: int = 1, group=None) -> int:
    """Fill, run once, compare; returns the wrong elements summed over ranks (every rank calls it)."""
    import torch
    import torch.distributed as dist
    wrong = 0
    for rep in range(repeats):
        case.fill(seed=rep + 1)
        case.run()
        mine = torch.tensor([case.wrong()], dtype=torch.int64, device=case.out.device)
        dist.all_reduce(mine, group=group)
        wrong = int(mine.item())
        if wrong:
            break
    return wrong


def check_one(rank: int, world_size: int, collective: str, size_bytes: int, run=None, *,
              placement: str | None = None, datatype: str = "float", redop: str = "sum", root: int = 0) -> int:
    """Check one implementation of ``collective`` at one size (every rank calls it).

    ``run(case)`` must do the collective on ``case.inp`` -> ``case.out`` (the same tensor in place)
    with ``case.op`` (a ``dist.ReduceOp``) and ``case.root``; None = torch.distributed's own.

    Returns:
        Wrong elements summed over ranks (0 = correct).
    """
    import torch
    coll = bandwidth.canonical_op(collective)
    cfg = BenchConfig(datatype=datatype, redop=redop, root=root, collectives=(coll,))
    lay = layout(coll, size_bytes, cfg.itemsize, world_size)
    bufs = Buffers(coll, lay, getattr(torch, DTYPES[cfg.datatype][0]), rank_device())
    return check_case(bufs.case(lay, placement or FORMS[coll][0], rank, world_size, redop, root, run))


def _measure(bufs: Buffers, lay: dict, placement: str, cfg: BenchConfig, rank: int, n: int,
             type_name: str) -> dict:
    coll = bufs.collective
    case = bufs.case(lay, placement, rank, n, cfg.redop, cfg.root)
    row = {"collective": coll, "placement": placement, "size_bytes": lay["size_bytes"],
           "count": lay["count"], "type": type_name,
           "redop": cfg.redop if coll in REDUCING else "none", "root": cfg.root if coll in ROOTED else -1,
           "time_us": None, "p10_us": None, "p90_us": None, "algbw_gbps": None, "busbw_gbps": None,
           "wrong": None, "iters": None, "repeat": None}
    if cfg.timed:
        case.fill(seed=0)
        iters = cfg.iters_for(lay["size_bytes"])
        t = timing.benchmark_collective(case.run, warmup=1, iters=iters, repeat=cfg.repeat)
        row.update(time_us=t.median_us, p10_us=t.p10_ms * 1e3, p90_us=t.p90_ms * 1e3,
                   iters=iters, repeat=cfg.repeat)
        if t.median_ms > 0:
            row["algbw_gbps"] = bandwidth.algbw_gbps(lay["size_bytes"], t.median_ms)
            row["busbw_gbps"] = bandwidth.busbw_gbps(coll, lay["size_bytes"], t.median_ms, n)
    if cfg.check:
        row["wrong"] = check_case(case, cfg.check)
    return row


def _check_memory(cfg: BenchConfig, rank: int, n: int, device) -> None:
    import os
    import torch
    need = _need_bytes(cfg, n)
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
        ``{"meta", "latency", "rows", "elapsed_s"}`` (the same on every rank): one row per
        (collective, size, placement), times in us, bandwidths in GB/s, ``wrong`` elements.

    Raises:
        MemoryError: the largest size does not fit (raised on every rank before allocating).
    """
    import torch
    import torch.distributed as dist
    cfg = config if isinstance(config, BenchConfig) else BenchConfig(**config)
    t0 = time.perf_counter()
    backend, device = dist.get_backend(), rank_device()
    dtype = getattr(torch, DTYPES[cfg.datatype][0])
    if cfg.root >= world_size:
        raise ValueError(f"root {cfg.root} is not a rank of {world_size}. HINT: -r 0 .. {world_size - 1}.")
    send = _emitter(rank, progress_path, emit)
    me = {"rank": rank, "host": socket.gethostname(), "device": str(device),
          "name": torch.cuda.get_device_name(device) if device.type == "cuda" else ""}
    devices = [None] * world_size
    dist.all_gather_object(devices, me)
    _check_memory(cfg, rank, world_size, device)
    meta = {"world_size": world_size, "backend": backend, "config": cfg.to_dict(), "devices": devices,
            "nodes": len({d["host"] for d in devices}), "torch_version": torch.__version__}
    send({"event": "start", "meta": meta})
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def warm(bufs, lay, placement):
        case = bufs.case(lay, placement, rank, world_size, cfg.redop, cfg.root)
        case.fill(seed=0)
        for _ in range(cfg.warmup_iters):
            case.run()
        sync()

    latency = None
    if cfg.latency and cfg.timed:
        lay = layout("all_reduce", 8, cfg.itemsize, world_size)
        if lay["count"] > 0:
            bufs = Buffers("all_reduce", lay, dtype, device)
            warm(bufs, lay, "in-place")
            latency = _measure(bufs, lay, "in-place", cfg, rank, world_size, cfg.datatype)
            send({"event": "latency", "row": latency})
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
            pair = [_measure(bufs, lay, p, cfg, rank, world_size, cfg.datatype) for p in FORMS[coll]]
            rows += pair
            send({"event": "rows", "rows": pair})
        del bufs
    result = {"meta": meta, "latency": latency, "rows": rows,
              "elapsed_s": round(time.perf_counter() - t0, 3)}
    send({"event": "done", "elapsed_s": result["elapsed_s"]})
    return result
