"""Lab 01's measurements of ``torch.cuda.comm``: bandwidth sweep, dtypes, many small tensors,
redundant transfers, and which kernels run (``torch.profiler``). Pure analysis (fits, kernel
names) is in ``analysis``, the verdicts in ``claims``. Run it::

    from labutils.labs.lab01_cuda_comm import analysis, devices, measure
    setup = devices.gpu_setup()                      # >= 2 GPUs
    data = measure.sweep(setup)                      # 1 KiB .. 1 GiB, JSON-able
    analysis.fits(data)["comm.broadcast"]            # alpha-beta fit (labutils.bandwidth)

Method: one process drives every GPU, so a sample brackets ``iters`` back-to-back calls with a
``timing.Clock`` mark pair on *each* device's current stream (CUDA events) and takes the slowest
device's time / iters, the median of several samples. (nccl-tests also divides a loop of back-to-back calls
by ``iters``, but reads a host clock after a stream synchronize, runs the loop once, and reports the mean
over ranks unless ``-a 3`` asks for the maximum.) The host cost of a
call (Python, NCCL group launch, allocation) is part of what is measured: it is what a user of this
API pays. Every function also runs on ``devices.cpu_standin()`` (perf_counter), which is how it is
tested.
"""
from __future__ import annotations

import os
from typing import Callable

import torch

from ... import bandwidth, timing
from ...instruments import profiler
from .analysis import device_kernels
from .devices import CommSetup

SWEEP_OPS = ("comm.broadcast", "comm.reduce_add", "x.to(peer)")


def quiet_profiler_log(level: int = 6) -> None:
    """Keep ``torch.profiler`` from printing ``USDT: ... profiler_start`` / ``profiler_stop`` at every
    profile. Recent kineto (the profiler's library) logs those lines at its USDT level (5), above ERROR
    (4), the level torch's own suppression sets, so they get through; ``KINETO_LOG_LEVEL`` above 5 stops
    them. Kineto reads it when the first profile starts: call this before. A value you set is kept.
    Kineto's ERROR lines are hidden too; a profile that lost its GPU activity shows as no kernels."""
    os.environ.setdefault("KINETO_LOG_LEVEL", str(level))


def time_on_devices(fn: Callable[[], object], setup: CommSetup, *, warmup: int = 2, iters: int = 10,
                    repeat: int = 5) -> timing.Timing:
    """Time one call of ``fn`` (ms) across ``setup.devices``: per sample, ``iters`` calls between
    a pair of ``timing.Clock`` marks on every device's current stream (where torch.cuda.comm
    enqueues its work); the sample is the slowest device's time / iters. On the CPU stand-in every
    device is the CPU, so one clock (perf_counter) serves."""
    timing.check_counts(warmup=warmup, iters=iters, repeat=repeat)
    clocks = list({setup.device(i): timing.Clock(setup.device(i)) for i in setup.devices}.values())
    for _ in range(warmup):
        fn()
    setup.synchronize()
    samples = []
    for _ in range(repeat):
        starts = [c.mark() for c in clocks]
        for _ in range(iters):
            fn()
        stops = [c.mark() for c in clocks]
        setup.synchronize()
        samples.append(max(c.elapsed_ms(a, b) for c, a, b in zip(clocks, starts, stops)) / iters)
    return timing.summarize(samples)


def _t(t: timing.Timing) -> dict:
    return {"median_ms": t.median_ms, "p10_ms": t.p10_ms, "p90_ms": t.p90_ms, "n": len(t.samples_ms)}


def _need_two(setup: CommSetup) -> None:
    if len(setup.devices) < 2:
        raise ValueError(f"this experiment moves data between devices and needs >= 2, got "
                         f"{setup.devices}. HINT: run it on a multi-GPU machine, or show the recording.")


def plan(size_bytes: int) -> tuple[int, int, int]:
    """(warmup, iters, repeat) for one message size. Every sample holds several back-to-back calls
    (at least 10 below 256 MiB, 5 from there up), so that the host's work to issue a call overlaps the transfer of the call before it at
    every size, as in a loop of calls (a sample of one call would pay the host's work and then the
    transfer, one after the other): about 8 MiB of calls per sample for small messages (up to 50,
    so an event pair's ~us resolution does not matter), 10 calls x 5 samples up to 128 MiB, and
    5 calls x 3 samples from 256 MiB up (the largest sizes, whose transfer dwarfs the host's work)."""
    if size_bytes >= (256 << 20):
        return (1, 5, 3)
    return (2, max(10, min(50, (8 << 20) // max(int(size_bytes), 1))), 5)


def sweep(setup: CommSetup, sizes_bytes=None, dtype=torch.float32) -> dict:
    """Time ``comm.broadcast`` (to every device), ``comm.reduce_add`` (from every device) and a
    plain ``x.to(cuda:1)`` for each size (bytes; default 1 KiB .. 1 GiB, x2).

    Returns:
        ``{"sizes": [...], "n_devices": n, "ops": {op: {"median_ms": [...], "p10_ms": [...],
        "p90_ms": [...]}}}``.
    """
    _need_two(setup)
    sizes = list(sizes_bytes or bandwidth.size_sweep(1 << 10, 1 << 30, 2))
    comm, devs, dev = setup.comm, setup.devices, setup.device
    item = torch.tensor([], dtype=dtype).element_size()
    out = {"sizes": sizes, "n_devices": len(devs), "dtype": str(dtype).replace("torch.", ""),
           "ops": {op: {"median_ms": [], "p10_ms": [], "p90_ms": []} for op in SWEEP_OPS}}
    for size in sizes:
        xs = [torch.ones(max(1, size // item), dtype=dtype, device=dev(i)) for i in devs]
        ops = {"comm.broadcast": lambda: comm.broadcast(xs[0], devs),
               "comm.reduce_add": lambda: comm.reduce_add(xs, destination=devs[0]),
               "x.to(peer)": lambda: xs[0].to(dev(devs[1]))}
        warmup, iters, repeat = plan(size)
        for op, fn in ops.items():
            t = time_on_devices(fn, setup, warmup=warmup, iters=iters, repeat=repeat)
            for key in ("median_ms", "p10_ms", "p90_ms"):
                out["ops"][op][key].append(getattr(t, key))
        del xs, ops
    return out


def dtype_costs(setup: CommSetup, numel: int = 16 << 20) -> dict:
    """``reduce_add`` of ``numel`` elements from GPU 1 to GPU 0 in fp32 and fp16 (NCCL), the cast
    alone, cast-then-reduce, and the fallback path (non-contiguous inputs), same and mixed dtypes.

    Returns ``{"numel": n, "cases": {name: timing dict}, "bytes": {name: bytes over the link}}``.
    """
    _need_two(setup)
    comm, (d0, d1), dev = setup.comm, setup.devices[:2], setup.device
    rows = 1024
    numel = max(rows, numel // rows * rows)

    def ones(d, dt, transposed=False):
        t = torch.ones(rows, numel // rows, dtype=dt, device=dev(d))
        return t.t() if transposed else t.view(-1)  # .t(): same data, non-contiguous view
    a32, b32, a16, b16 = ones(d0, torch.float32), ones(d1, torch.float32), ones(d0, torch.half), ones(d1, torch.half)
    at32, bt32, bt16 = ones(d0, torch.float32, True), ones(d1, torch.float32, True), ones(d1, torch.half, True)
    cases = {
        "reduce_add fp32 (NCCL)": (lambda: comm.reduce_add([a32, b32], d0), 4),
        "reduce_add fp16 (NCCL)": (lambda: comm.reduce_add([a16, b16], d0), 2),
        "cast fp16 -> fp32 alone (GPU 1)": (lambda: b16.float(), 0),
        "cast, then reduce_add fp32 (NCCL)": (lambda: comm.reduce_add([a32, b16.float()], d0), 4),
        "fallback fp32 + fp32 (non-contiguous)": (lambda: comm.reduce_add([at32, bt32], d0), 4),
        "fallback fp32 + fp16 (non-contiguous, converts)": (lambda: comm.reduce_add([at32, bt16], d0), 2),
    }
    out = {"numel": numel, "cases": {}, "bytes": {}}
    for name, (fn, item) in cases.items():
        out["cases"][name] = _t(time_on_devices(fn, setup, warmup=2, iters=5, repeat=5))
        out["bytes"][name] = numel * item
    return out


def host_steps(pieces: list, setup: CommSetup) -> dict:
    """Time the two per-tensor steps ``broadcast_coalesced`` takes besides its broadcasts, on ``pieces``
    (tensors on one device): flatten (one ``torch.cat`` of every tensor into a bucket) and unflatten
    (a ``narrow`` + ``view`` per tensor, to hand the tensors back). They are the same ATen ops the C++
    ``broadcast_coalesced`` calls (``torch/csrc/cuda/comm.cpp``), run here alone: nothing is sent.

    Returns ``{"count": len(pieces), "steps": {name: timing dict}}``.
    """
    from ...compat import flatten_dense_tensors, unflatten_dense_tensors
    flat = flatten_dense_tensors(pieces)
    steps = {"flatten (one torch.cat)": lambda: flatten_dense_tensors(pieces),
             "unflatten (a view per tensor)": lambda: unflatten_dense_tensors(flat, pieces)}
    return {"count": len(pieces),
            "steps": {name: _t(time_on_devices(fn, setup, warmup=1, iters=1, repeat=3)) for name, fn in steps.items()}}


def many_small(setup: CommSetup, total_bytes: int = 16 << 20, counts=(1, 8, 64, 512, 4096)) -> dict:
    """Broadcast ``total_bytes`` of fp32 split into ``count`` tensors: one ``comm.broadcast`` per
    tensor (loop) vs one ``comm.broadcast_coalesced`` call, and one flat tensor of the same bytes;
    and, for the largest count, ``host_steps`` (where broadcast_coalesced's extra time goes).

    Returns ``{"total_bytes", "counts", "loop": [timing dict], "coalesced": [...], "flat": {...},
    "host_steps": {...}}``.
    """
    _need_two(setup)
    comm, devs, dev = setup.comm, setup.devices, setup.device
    flat = torch.ones(total_bytes // 4, device=dev(devs[0]))
    out = {"total_bytes": total_bytes, "counts": list(counts), "loop": [], "coalesced": [],
           "flat": _t(time_on_devices(lambda: comm.broadcast(flat, devs), setup, iters=10))}
    for count in counts:
        pieces = [torch.ones(total_bytes // 4 // count, device=dev(devs[0])) for _ in range(count)]

        def loop():
            for p in pieces:
                comm.broadcast(p, devs)
        reps = dict(warmup=1, iters=max(1, 32 // count), repeat=3 if count >= 512 else 5)
        out["loop"].append(_t(time_on_devices(loop, setup, **reps)))
        out["coalesced"].append(_t(time_on_devices(lambda: comm.broadcast_coalesced(pieces, devs),
                                                   setup, **reps)))
        if count == max(counts):
            out["host_steps"] = host_steps(pieces, setup)
        del pieces
    return out


def redundant(setup: CommSetup, sizes_bytes=(64 << 10, 64 << 20)) -> dict:
    """Redundant transfers, per size: broadcast to the other GPUs vs to all (source included);
    ``out=`` without vs with a tensor on the source GPU (that one forces the copy path);
    ``reduce_add`` + ``broadcast`` vs one ``nccl.all_reduce`` (same result on every GPU). Each case
    is timed as the sweep times its size (``plan``: at least 10 calls per sample).

    Returns ``{"sizes": [...], "cases": {name: [timing dict per size]}}``.
    """
    _need_two(setup)
    comm, nccl, devs, dev = setup.comm, setup.nccl, setup.devices, setup.device
    others = devs[1:]
    out = {"sizes": list(sizes_bytes), "n_devices": len(devs), "cases": {}}
    for size in sizes_bytes:
        numel = max(1, size // 4)
        x = torch.ones(numel, device=dev(devs[0]))
        remote = [torch.empty(numel, device=dev(i)) for i in others]
        with_local = [torch.empty(numel, device=dev(devs[0]))] + remote
        xs = [torch.zeros(numel, device=dev(i)) for i in devs]  # zeros: repeated sums stay finite
        cases = {
            "broadcast to the other GPUs": lambda: comm.broadcast(x, others),
            "broadcast to all GPUs (source included)": lambda: comm.broadcast(x, devs),
            "broadcast(out=) on the other GPUs": lambda: comm.broadcast(x, out=remote),
            "broadcast(out=) incl. one on the source GPU": lambda: comm.broadcast(x, out=with_local),
            "reduce_add + broadcast": lambda: comm.broadcast(comm.reduce_add(xs, destination=devs[0]), devs),
            "nccl.all_reduce": lambda: nccl.all_reduce(xs),
        }
        warmup, iters, repeat = plan(size)
        for name, fn in cases.items():
            out["cases"].setdefault(name, []).append(
                _t(time_on_devices(fn, setup, warmup=warmup, iters=iters, repeat=repeat)))
        del x, remote, with_local, xs, cases
    return out


def profile_kernels(fn: Callable[[], object], setup: CommSetup, *, trace_path=None,
                    table_rows: int = 0, keep_trace: bool = False) -> dict:
    """Run ``fn`` once (warm-up: NCCL communicators, allocator), then once under
    ``torch.profiler`` (activities CPU + CUDA). Returns ``{"kernels": device_kernels(...)}``,
    plus ``"table"`` (``key_averages().table``) if ``table_rows``, the trace itself as ``"trace"`` if
    ``keep_trace``, and writes a Chrome/Perfetto trace to ``trace_path`` if given."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    setup.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if setup.on_gpu else [])
    with profile(activities=activities) as prof:
        fn()
        setup.synchronize()
    trace = profiler.export(prof, trace_path)
    out = {"kernels": device_kernels(profiler.kernels(trace, copies=True))}
    if keep_trace:
        out["trace"] = trace
    if table_rows:
        out["table"] = prof.key_averages().table(
            sort_by="cuda_time_total" if setup.on_gpu else "cpu_time_total", row_limit=table_rows)
    return out


def profile_ops(setup: CommSetup, size_bytes: int = 4 << 20, extra: dict | None = None) -> dict:
    """``{op: device_kernels}`` for each ``torch.cuda.comm`` call (and ``extra``: name -> fn) on
    a ``size_bytes`` fp32 message, each in its own profiler session."""
    _need_two(setup)
    comm, nccl, devs, dev = setup.comm, setup.nccl, setup.devices, setup.device
    numel = size_bytes // 4
    xs = [torch.ones(numel, device=dev(i)) for i in devs]
    local = [torch.empty(numel, device=dev(devs[0]))] + [torch.empty(numel, device=dev(i)) for i in devs[1:]]
    pieces = [t.clone() for t in xs[0].chunk(64)]
    ops = {"comm.broadcast": lambda: comm.broadcast(xs[0], devs),
           "comm.broadcast(out=) incl. source GPU": lambda: comm.broadcast(xs[0], out=local),
           "comm.broadcast_coalesced (64 tensors)": lambda: comm.broadcast_coalesced(pieces, devs),
           "comm.reduce_add": lambda: comm.reduce_add(xs, destination=devs[0]),
           "torch.cuda.nccl.all_reduce": lambda: nccl.all_reduce(xs),
           "comm.scatter": lambda: comm.scatter(xs[0], devs),
           "comm.gather": lambda: comm.gather(xs, destination=devs[0]),
           "x.to(peer)": lambda: xs[0].to(dev(devs[1])),
           **(extra or {})}
    return {name: profile_kernels(fn, setup)["kernels"] for name, fn in ops.items()}
