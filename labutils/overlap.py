"""What ``wait()`` guarantees, and how much communication overlaps with compute.

    overlap efficiency  E = (t_compute + t_comm - t_overlapped) / min(t_compute, t_comm)

the fraction of the shorter activity hidden behind the longer one (defined for this course):
E = 1 when running both together takes max(t_compute, t_comm), E = 0 when it takes as long as back
to back, E < 0 when together is *slower* than back to back (they compete for SMs or memory).
The arithmetic is pure (``overlap_efficiency``); the measurement runs on every rank::

    labutils.launch(overlap.overlap_experiment, backend="nccl")     # >= 2 GPUs, ~1 s of work
    labutils.launch(overlap.wait_semantics_gloo, backend="gloo")    # wait() blocks the host

On GPUs the timed regions are bracketed by CUDA events on the streams that do the work; on CPU
(gloo, for tests) by ``time.perf_counter`` -- there a transfer's end is seen only at ``wait()``.
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch
import torch.distributed as dist

from . import timing
from .config import rank_device

MAX_REPEATS = 64  # cap on k, the compute kernel's repeats (tiny CPU kernels would ask for thousands)


def overlap_efficiency(t_compute_ms: float, t_comm_ms: float, t_overlapped_ms: float) -> float:
    """E = (t_compute + t_comm - t_overlapped) / min(t_compute, t_comm) (see module docstring).

    Raises:
        ValueError: a time that is not positive and finite.
    """
    ts = (t_compute_ms, t_comm_ms, t_overlapped_ms)
    if not all(isinstance(t, (int, float)) and 0 < t < float("inf") for t in ts):
        raise ValueError(f"times must be positive and finite (ms), got {ts!r}.")
    return (t_compute_ms + t_comm_ms - t_overlapped_ms) / min(t_compute_ms, t_comm_ms)


def describe_efficiency(e: float) -> str:
    """Words for an efficiency: hidden (>= 0.8), partly hidden, no overlap (|E| < 0.1), slower."""
    if e >= 0.8:
        return "shorter activity hidden"
    if e >= 0.1:
        return "partly hidden"
    return "no overlap" if e > -0.1 else "slower than back to back"


# ------------------------------------------------------------------------------------------------
# wait(): host or stream?
# ------------------------------------------------------------------------------------------------

def wait_semantics_gloo(rank: int, world_size: int, delay_s: float = 0.3) -> dict:
    """Ranks 0 -> 1 on gloo: the sender starts ``delay_s`` late.

    Returns (rank 1; other ranks ``{}``): ``wait_ms`` (host time inside ``req.wait()``),
    ``early_read_stale`` (a copy of the receive buffer taken before ``wait()`` still holds the old
    zeros), ``after_wait_ok``, and ``send_race_fraction``: the share of received elements that hold
    the value the sender wrote into its buffer *after* ``isend`` returned.
    """
    out, n = {}, 1 << 16
    if rank == 0:
        time.sleep(delay_s)
        dist.isend(torch.ones(n), dst=1).wait()
        x = torch.ones(n)
        req = dist.isend(x, dst=1)
        x.fill_(-1.0)  # BUG on purpose: the send has not necessarily read x yet
        req.wait()
    elif rank == 1:
        buf = torch.zeros(n)
        req = dist.irecv(buf, src=0)
        early = buf.clone()  # BUG on purpose: read before wait()
        t0 = time.perf_counter()
        req.wait()
        out = {"wait_ms": (time.perf_counter() - t0) * 1e3, "early_read_stale": bool((early == 0).all()),
               "after_wait_ok": bool((buf == 1).all())}
        time.sleep(delay_s)  # the receiver posts late: the sender's fill_(-1) runs first
        dist.irecv(buf, src=0).wait()
        out["send_race_fraction"] = float((buf == -1).double().mean())
    return out


def _sleep_cycles_per_ms() -> float:
    """Clock cycles of ``torch.cuda._sleep`` per millisecond on this GPU (measured, not assumed)."""
    torch.cuda._sleep(1000)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(20_000_000)
    b.record()
    b.synchronize()
    return 20_000_000 / a.elapsed_time(b)


def wait_semantics_nccl(rank: int, world_size: int, delay_ms: float = 100.0,
                        race_numel: int = 16 << 20) -> dict:
    """Ranks 0 -> 1 under NCCL; the sender's data is ready only after a ``delay_ms`` GPU sleep.

    Returns (rank 1; other ranks ``{}``): ``wait_ms`` (host time in ``req.wait()``), ``sync_ms``
    (host time until ``torch.cuda.synchronize()`` returned, from posting the irecv),
    ``early_read_stale`` (copy made on the current stream before ``wait()``),
    ``after_wait_ok`` (copy made on the current stream after ``wait()``), ``other_stream_stale``
    (copy made after ``wait()`` on a stream that ``wait()`` did not order), and
    ``send_race_fraction`` (share of ``race_numel`` received elements holding the value the sender
    wrote after ``isend`` returned, with the receiver posting its irecv ``delay_ms`` late).
    """
    dev, out = rank_device(), {}
    cycles = int(_sleep_cycles_per_ms() * delay_ms)
    dist.barrier()
    if rank == 0:
        x = torch.zeros(1 << 20, device=dev)
        torch.cuda._sleep(cycles)  # the data is "computed" late, on the GPU
        x.fill_(1.0)
        dist.isend(x, dst=1).wait()
    elif rank == 1:
        buf, side = torch.zeros(1 << 20, device=dev), torch.cuda.Stream()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        req = dist.irecv(buf, src=0)
        early = buf.clone()  # BUG on purpose: not ordered after the receive
        t1 = time.perf_counter()
        req.wait()
        wait_ms = (time.perf_counter() - t1) * 1e3
        after = buf.clone()  # ordered: wait() made the current stream wait for NCCL's
        with torch.cuda.stream(side):
            other = buf.clone()  # BUG on purpose: wait() ordered the current stream, not this one
        torch.cuda.synchronize()
        out = {"wait_ms": wait_ms, "sync_ms": (time.perf_counter() - t0) * 1e3,
               "early_read_stale": bool((early == 0).all()), "after_wait_ok": bool((after == 1).all()),
               "other_stream_stale": bool((other == 0).all())}
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        x = torch.ones(race_numel, device=dev)
        torch.cuda.synchronize()
        req = dist.isend(x, dst=1)
        x.fill_(-1.0)  # BUG on purpose: runs on the compute stream while the send is in flight
        req.wait()
    elif rank == 1:
        buf = torch.zeros(race_numel, device=dev)
        torch.cuda.synchronize()
        torch.cuda._sleep(cycles)  # the receive is posted late (NCCL's stream waits for ours)
        dist.irecv(buf, src=0).wait()
        out["send_race_fraction"] = float((buf == -1).double().mean())
    torch.cuda.synchronize()
    return out


# ------------------------------------------------------------------------------------------------
# Overlap, measured
# ------------------------------------------------------------------------------------------------

def _wait(works) -> None:
    for w in works or []:
        w.wait()


class _Clock:
    """Marks on a GPU stream (CUDA events) or on the host (perf_counter); ``ms(a, b)`` after ``sync``."""

    def __init__(self, on_gpu: bool):
        self.on_gpu = on_gpu

    def mark(self):
        if not self.on_gpu:
            return time.perf_counter()
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()  # on the current stream
        return ev

    def sync(self) -> None:
        if self.on_gpu:
            torch.cuda.synchronize()

    def ms(self, a, b) -> float:
        return a.elapsed_time(b) if self.on_gpu else (b - a) * 1e3


def _sample(mode: str, compute, transfer, clock: _Clock, side) -> dict:
    """One timed run; returns ``{"compute"|"comm"|"total": (mark, mark)}``."""
    a = clock.mark()
    if mode == "compute":
        compute()
        b = clock.mark()
        return {"compute": (a, b), "total": (a, b)}
    if mode == "comm":
        _wait(transfer())
        b = clock.mark()
        return {"comm": (a, b), "total": (a, b)}
    if mode == "serial":
        compute()
        b = clock.mark()
        _wait(transfer())
        c = clock.mark()
        return {"compute": (a, b), "comm": (b, c), "total": (a, c)}
    if clock.on_gpu:  # overlapped: the transfer on its own stream, compute on the current one
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            m0 = clock.mark()
            _wait(transfer())  # the side stream waits for NCCL's; the host does not
            m1 = clock.mark()
        compute()
        c1 = clock.mark()
        torch.cuda.current_stream().wait_stream(side)
        return {"compute": (a, c1), "comm": (m0, m1), "total": (a, clock.mark())}
    works = transfer()  # gloo: runs in its own threads while the host computes
    compute()
    c1 = clock.mark()
    _wait(works)
    e = clock.mark()
    return {"compute": (a, c1), "comm": (a, e), "total": (a, e)}


def measure_overlap(compute: Callable[[], object], transfer: Callable[[], list], *, warmup: int = 3,
                    repeat: int = 10, group=None) -> dict:
    """Time compute alone, transfer alone, both back to back, and both overlapped (every rank).

    Args:
        compute: issues the compute work on the current stream.
        transfer: issues the transfer with ``async_op=True`` and returns its works (or ``[]`` for
            stream-ordered work such as a peer copy).

    Returns:
        ``compute_ms``, ``comm_ms``, ``serial_ms``, ``overlapped_ms`` (medians over ``repeat``
        samples of the slowest rank), ``efficiency`` and ``spans`` (this rank's last back-to-back
        and overlapped samples, for ``plots.timeline_plot``).
    """
    on_gpu = rank_device().type == "cuda"
    clock, side = _Clock(on_gpu), torch.cuda.Stream() if on_gpu else None
    result, spans = {}, []
    for mode in ("compute", "comm", "serial", "overlapped"):
        mine = []
        for i in range(warmup + repeat):
            clock.sync()
            dist.barrier(group=group)
            marks = _sample(mode, compute, transfer, clock, side)
            clock.sync()
            if i >= warmup:
                mine.append(clock.ms(*marks["total"]))
        result[f"{mode}_ms"] = statistics.median(timing.slowest_rank(mine, group=group))
        if mode in ("serial", "overlapped"):
            name = "back to back" if mode == "serial" else "overlapped"
            t0 = marks["total"][0]
            for key, kind in (("compute", "compute"), ("comm", "transfer")):
                a, b = marks[key]
                spans.append({"lane": f"{name}: {kind}", "kind": kind, "start_ms": clock.ms(t0, a),
                              "end_ms": clock.ms(t0, b)})
    result["efficiency"] = overlap_efficiency(result["compute_ms"], result["comm_ms"],
                                              result["overlapped_ms"])
    return {**result, "spans": spans}


def _kernels(dev: torch.device) -> dict:
    """Compute-bound and memory-bound work on ``dev`` (small on CPU, where they only get tested)."""
    if dev.type == "cuda":
        a, b = (torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) for _ in range(2))
        c, big = torch.empty_like(a), torch.ones(64 << 20, device=dev)
        return {"matmul (bf16, 4096^3)": lambda: torch.mm(a, b, out=c),
                "memory-bound (256 MiB x *= 1)": lambda: big.mul_(1.0)}
    a, b = torch.randn(96, 96), torch.randn(96, 96)
    big = torch.ones(1 << 16)
    return {"matmul": lambda: torch.mm(a, b), "memory-bound": lambda: big.mul_(1.0)}


def _transfers(rank: int, world_size: int, dev: torch.device, numel: int) -> dict:
    """Transfers of ``numel`` float32: NCCL all_reduce, a ring send/recv pair, and (GPUs only) a
    copy to the next GPU done by the copy engines, which needs no SMs."""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    ar, src, dst = (torch.ones(numel, device=dev) for _ in range(3))
    lib = "NCCL" if dev.type == "cuda" else "gloo"
    out = {f"all_reduce ({lib})": lambda: [dist.all_reduce(ar, async_op=True)],
           f"send/recv ({lib})": lambda: dist.batch_isend_irecv(
               [dist.P2POp(dist.isend, src, right), dist.P2POp(dist.irecv, dst, left)])}
    if dev.type == "cuda" and torch.cuda.device_count() > 1:
        peer = torch.empty(numel, device=torch.device("cuda", (dev.index + 1) % torch.cuda.device_count()))
        out["peer copy (copy engine)"] = lambda: (peer.copy_(src, non_blocking=True), [])[1]
    return out


def overlap_experiment(rank: int, world_size: int, size_bytes: int = 256 << 20, warmup: int = 3,
                       repeat: int = 10) -> dict:
    """Every (compute kind x transfer kind) case through ``measure_overlap``.

    The transfer moves ``size_bytes`` (float32); the compute is one kernel repeated ``k`` times,
    ``k`` (at most ``MAX_REPEATS``) chosen so that compute alone lasts about as long as the
    transfer alone (the largest ``k`` of any rank), which is where overlap matters most.

    Returns:
        ``{"size_bytes", "world_size", "cases": [{"compute", "transfer", "k", ...measure_overlap}]}``.
    """
    dev = rank_device()
    numel = max(1, size_bytes // 4)
    clock, cases, kernels = _Clock(dev.type == "cuda"), [], _kernels(dev)
    for t_name, transfer in _transfers(rank, world_size, dev, numel).items():
        for c_name, kernel in kernels.items():
            times = []
            for _ in range(3):  # calibrate: one kernel vs one transfer, medians of 3
                clock.sync()
                dist.barrier()
                a = clock.mark()
                kernel()
                b = clock.mark()
                _wait(transfer())
                c = clock.mark()
                clock.sync()
                times.append((clock.ms(a, b), clock.ms(b, c)))
            k_one, m_one = (statistics.median(x) for x in zip(*times))
            k = torch.tensor([min(MAX_REPEATS, max(1, round(m_one / max(k_one, 1e-6))))], device=dev)
            dist.all_reduce(k, op=dist.ReduceOp.MAX)
            k = int(k.item())
            res = measure_overlap(lambda: [kernel() for _ in range(k)], transfer, warmup=warmup,
                                  repeat=repeat)
            cases.append({"compute": c_name, "transfer": t_name, "k": k, **res})
    return {"size_bytes": numel * 4, "world_size": world_size, "cases": cases}
