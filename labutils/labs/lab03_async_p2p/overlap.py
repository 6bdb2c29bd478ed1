"""How much communication overlaps with compute (what ``wait()`` guarantees is in ``wait``).

    overlap efficiency  E = (t_compute + t_comm - t_overlapped) / min(t_compute, t_comm)

the fraction of the shorter activity hidden behind the longer one (defined for this course):
E = 1 when running both together takes max(t_compute, t_comm), E = 0 when it takes as long as back
to back, E < 0 when together is *slower* than back to back (they compete for SMs or memory).
The arithmetic is pure (``overlap_efficiency``). The overlapped step itself -- start the transfer,
compute while it is in flight, then wait -- is the notebook's code (``overlapped_step(compute, transfer,
side)``); this module is the sweep around it, on every rank::

    POOL.run(overlap.overlap_experiment, overlapped_step)          # >= 2 GPUs, ~1 s of work

It times compute alone, the transfer alone, the two back to back, and the notebook's step. The timed
regions are bracketed by ``timing.Clock`` marks: on GPUs CUDA events on the streams that do the work; on
CPU (gloo, for tests) ``time.perf_counter`` -- there a transfer's end is seen only at ``wait()``. The marks
inside the step go where the step puts the work: ``transfer`` as handed to the step marks its start on the
stream it is issued on and returns the works wrapped so that waiting for the last of them marks its end
there; ``compute`` marks its end.

The transfers: NCCL all_reduce and send/recv (kernels on the SMs), and a copy into a buffer on the next
GPU done by the copy engines -- with ``Tensor.copy_`` on every rank, with ``copy_`` on rank 0 only, and as a
bare ``cudaMemcpyAsync`` (``copies.cuda_memcpy_async``, through ctypes) without the two-way stream barrier
that ``copy_`` adds between the devices (aten/src/ATen/native/cuda/Copy.cu). ``copies.profile_transfer``
records with ``torch.profiler`` which engine ran a copy and which CUDA runtime calls it made.
"""
from __future__ import annotations

import statistics
from typing import Callable

import torch
import torch.distributed as dist

from ... import timing
from ...config import rank_device
from .copies import cuda_memcpy_async, profile_transfer, wait_all

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


class _Waited:
    """A transfer's work as the step sees it: ``wait()`` waits for the real work once, and the last of a
    transfer's works to be waited marks the transfer's end on the stream that waits (the current one)."""

    def __init__(self, work, transfer: "_Transfer"):
        self.work, self.transfer, self.done = work, transfer, False

    def wait(self, *args, **kwargs):
        if not self.done:
            self.done = True
            if self.work is not None:   # a stream-ordered copy has no work: only the end mark
                self.work.wait(*args, **kwargs)
            self.transfer.waited()
        return True

    def is_completed(self) -> bool:
        return self.work is None or self.work.is_completed()


class _Transfer:
    """``transfer`` as handed to a step: marks the start where it is issued, hands back ``_Waited`` works."""

    def __init__(self, transfer: Callable[[], list], clock: timing.Clock):
        self.transfer, self.clock, self.marks, self.left = transfer, clock, [], 0

    def __call__(self) -> list:
        if self.marks:
            raise RuntimeError("the step issued the transfer twice. HINT: call transfer() once per step.")
        self.marks.append(self.clock.mark())
        works = [_Waited(w, self) for w in (self.transfer() or [])] or [_Waited(None, self)]
        self.left = len(works)
        return works

    def waited(self) -> None:
        self.left -= 1
        if self.left == 0:
            self.marks.append(self.clock.mark())


def _sample(mode: str, compute, transfer, clock: timing.Clock, side, step) -> dict:
    """One timed run; returns ``{"compute"|"comm"|"total": (mark, mark)}``."""
    a = clock.mark()
    if mode == "compute":
        compute()
        b = clock.mark()
        return {"compute": (a, b), "total": (a, b)}
    if mode == "comm":
        wait_all(transfer())
        b = clock.mark()
        return {"comm": (a, b), "total": (a, b)}
    if mode == "serial":
        compute()
        b = clock.mark()
        wait_all(transfer())
        c = clock.mark()
        return {"compute": (a, b), "comm": (b, c), "total": (a, c)}
    seen, ends = _Transfer(transfer, clock), []   # overlapped: the notebook's step

    def timed_compute():
        compute()
        ends.append(clock.mark())

    step(timed_compute, seen, side)
    e = clock.mark()
    if len(seen.marks) != 2 or len(ends) != 1:
        did = ("never called transfer()" if not seen.marks else "did not wait for the transfer"
               if len(seen.marks) == 1 else f"called compute() {len(ends)} times")
        raise RuntimeError(f"the step must call transfer() once, compute() once, and wait for every work "
                           f"transfer() returned; this one {did}. HINT: works = transfer(); compute(); then "
                           "w.wait() for each work (on GPUs, the transfer and its waits on the side stream).")
    return {"compute": (a, ends[0]), "comm": tuple(seen.marks), "total": (a, e)}


def measure_overlap(compute: Callable[[], object], transfer: Callable[[], list], step: Callable, *,
                    warmup: int = 3, repeat: int = 10, group=None) -> dict:
    """Time compute alone, transfer alone, both back to back, and both in ``step`` (every rank).

    Args:
        compute: issues the compute work on the current stream.
        transfer: issues the transfer with ``async_op=True`` and returns its works (or ``[]`` for
            stream-ordered work such as a peer copy).
        step: the notebook's overlapped step, ``step(compute, transfer, side)``: ``side`` is a CUDA stream
            for the transfer on GPUs, None on CPU.

    Returns:
        ``compute_ms``, ``comm_ms``, ``serial_ms``, ``overlapped_ms`` (medians over ``repeat``
        samples of the slowest rank), ``efficiency`` and ``spans`` (this rank's last back-to-back
        and overlapped samples, for ``plots.timeline_plot``).
    """
    clock = timing.Clock(rank_device())
    side = torch.cuda.Stream() if clock.on_gpu else None
    result, spans = {}, []
    for mode in ("compute", "comm", "serial", "overlapped"):
        mine = []
        for i in range(warmup + repeat):
            clock.synchronize()
            dist.barrier(group=group)
            marks = _sample(mode, compute, transfer, clock, side, step)
            clock.synchronize()
            if i >= warmup:
                mine.append(clock.elapsed_ms(*marks["total"]))
        result[f"{mode}_ms"] = statistics.median(timing.slowest_rank(mine, group=group))
        if mode in ("serial", "overlapped"):
            name = "back to back" if mode == "serial" else "overlapped"
            t0 = marks["total"][0]
            for key, kind in (("compute", "compute"), ("comm", "transfer")):
                a, b = marks[key]
                spans.append({"lane": f"{name}: {kind}", "kind": kind, "start_ms": clock.elapsed_ms(t0, a),
                              "end_ms": clock.elapsed_ms(t0, b)})
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


PEER_COPY = "peer copy_, both ranks"
PEER_COPY_ONE = "peer copy_, rank 0 only"
PEER_MEMCPY = "peer cudaMemcpyAsync, both ranks (no barrier)"
def _transfers(rank: int, world_size: int, dev: torch.device, numel: int) -> dict:
    """Transfers of ``numel`` float32: NCCL all_reduce, a ring send/recv pair, and (GPUs only) a copy into a
    buffer on the next GPU by the copy engines: ``copy_`` on every rank, ``copy_`` on rank 0 only (the other
    ranks transfer nothing), and a bare ``cudaMemcpyAsync`` on every rank."""
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    ar, src, dst = (torch.ones(numel, device=dev) for _ in range(3))
    lib = "NCCL" if dev.type == "cuda" else "gloo"
    out = {f"all_reduce ({lib})": lambda: [dist.all_reduce(ar, async_op=True)],
           f"send/recv ({lib})": lambda: dist.batch_isend_irecv(
               [dist.P2POp(dist.isend, src, right), dist.P2POp(dist.irecv, dst, left)])}
    if dev.type == "cuda" and torch.cuda.device_count() > 1:
        peer = torch.empty(numel, device=torch.device("cuda", (dev.index + 1) % torch.cuda.device_count()))
        peer.copy_(src)  # enables peer access and starts the other GPU's context here, not in a sample
        torch.cuda.synchronize(peer.device)

        def copy():
            peer.copy_(src, non_blocking=True)
            return []

        def memcpy():
            cuda_memcpy_async(peer, src)
            return []

        out[PEER_COPY] = copy
        out[PEER_COPY_ONE] = copy if rank == 0 else (lambda: [])
        out[PEER_MEMCPY] = memcpy
    return out


def overlap_experiment(rank: int, world_size: int, step: Callable, size_bytes: int = 256 << 20, warmup: int = 3,
                       repeat: int = 10) -> dict:
    """Every (compute kind x transfer kind) case through ``measure_overlap``, overlapped by ``step`` (the
    notebook's ``overlapped_step(compute, transfer, side)``).

    The transfer moves ``size_bytes`` (float32); the compute is one kernel repeated ``k`` times,
    ``k`` (at most ``MAX_REPEATS``) chosen so that compute alone lasts about as long as the
    transfer alone (the largest ``k`` of any rank), which is where overlap matters most.

    Returns:
        ``{"size_bytes", "world_size", "cases": [{"compute", "transfer", "k", ...measure_overlap}],
        "profiles": {transfer: profile_transfer(...)}}`` (profiles of the peer copies, rank 0's; empty on
        other ranks and without two GPUs).
    """
    dev = rank_device()
    numel = max(1, size_bytes // 4)
    clock, cases, kernels = timing.Clock(dev), [], _kernels(dev)
    transfers = _transfers(rank, world_size, dev, numel)
    for t_name, transfer in transfers.items():
        for c_name, kernel in kernels.items():
            times = []
            for _ in range(3):  # calibrate: one kernel vs one transfer, medians of 3
                clock.synchronize()
                dist.barrier()
                a = clock.mark()
                kernel()
                b = clock.mark()
                wait_all(transfer())
                c = clock.mark()
                clock.synchronize()
                times.append((clock.elapsed_ms(a, b), clock.elapsed_ms(b, c)))
            k_one, m_one = (statistics.median(x) for x in zip(*times))
            k = torch.tensor([min(MAX_REPEATS, max(1, round(m_one / max(k_one, 1e-6))))], device=dev)
            dist.all_reduce(k, op=dist.ReduceOp.MAX)
            k = int(k.item())
            res = measure_overlap(lambda: [kernel() for _ in range(k)], transfer, step, warmup=warmup,
                                  repeat=repeat)
            cases.append({"compute": c_name, "transfer": t_name, "k": k, **res})
    profiles = {name: profile_transfer(transfers[name]) for name in (PEER_COPY, PEER_MEMCPY)
                if name in transfers and rank == 0}
    return {"size_bytes": numel * 4, "world_size": world_size, "cases": cases, "profiles": profiles}
