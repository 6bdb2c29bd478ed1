"""Honest timing: CUDA events around the timed region, warm-ups, repeats, medians, slowest rank.

* ``benchmark(fn)``: one device, one process. On GPU each sample is bracketed by two CUDA events
  on the current stream; on CPU by ``time.perf_counter``.
* ``benchmark_collective(op)``: the nccl-tests method (``src/common.cu``): warm-up calls, then
  ``iters`` back-to-back calls between two events, time / iters; repeated ``repeat`` times. Each
  rank measures its own time; the reported sample is the **slowest rank's** (nccl-tests averages
  over ranks by default, ``-a 1``; we report ``-a 3``, the max, because a collective is done only
  when its last rank is done). Call it on every rank.

Statistics are in ``summarize`` (pure; unit-tested without a GPU).
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Callable, Sequence


@dataclasses.dataclass(frozen=True)
class Timing:
    """Summary of repeated measurements, in milliseconds.

    Attributes:
        samples_ms: the raw samples, in measurement order.
        median_ms, min_ms, max_ms, p10_ms, p90_ms: order statistics of the samples.
    """
    samples_ms: tuple
    median_ms: float
    min_ms: float
    max_ms: float
    p10_ms: float
    p90_ms: float

    @property
    def median_us(self) -> float:
        return self.median_ms * 1e3

    @property
    def spread(self) -> float:
        """(p90 - p10) / median: the relative noise; above ~0.1 the numbers deserve suspicion."""
        return (self.p90_ms - self.p10_ms) / self.median_ms if self.median_ms > 0 else float("nan")

    def __str__(self) -> str:
        return (f"{_fmt_ms(self.median_ms)} median of {len(self.samples_ms)} "
                f"(p10 {_fmt_ms(self.p10_ms)}, p90 {_fmt_ms(self.p90_ms)})")


def _fmt_ms(ms: float) -> str:
    return f"{ms * 1e3:.1f} us" if ms < 1 else f"{ms:.3f} ms"


def _quantile(sorted_x: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of already sorted data (numpy's default method)."""
    pos = (len(sorted_x) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_x) - 1)
    return sorted_x[lo] + (sorted_x[hi] - sorted_x[lo]) * (pos - lo)


def summarize(samples_ms: Sequence[float]) -> Timing:
    """Summarise samples (ms) into a ``Timing``.

    Raises:
        ValueError: no samples, or a sample that is negative or not finite.
    """
    xs = [float(x) for x in samples_ms]
    if not xs:
        raise ValueError("summarize() needs at least one sample. HINT: use repeat >= 1.")
    bad = [x for x in xs if not (x >= 0 and x != float("inf"))]
    if bad:
        raise ValueError(f"timing samples must be finite and >= 0 ms, got {bad[:3]}. "
                         "HINT: did the timed region run on another device than the events?")
    s = sorted(xs)
    return Timing(tuple(xs), statistics.median(s), s[0], s[-1], _quantile(s, 0.1), _quantile(s, 0.9))


def check_counts(**counts: int) -> None:
    """Raise ValueError unless each count is an int >= 1 (``warmup`` may be 0)."""
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "warmup" else 1):
            lim = 0 if name == "warmup" else 1
            raise ValueError(f"{name} must be an int >= {lim}, got {v!r}.")


def _device_of(device) -> "object":
    import torch
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if (
            torch.cuda.is_available() and torch.cuda.is_initialized()) else torch.device("cpu")
    return torch.device(device)


def benchmark(fn: Callable[[], object], *, warmup: int = 3, repeat: int = 20, inner: int = 1,
              device=None) -> Timing:
    """Time ``fn()`` on one device.

    Args:
        fn: the work to time (no arguments). Its GPU work must be on the current stream.
        warmup: untimed calls first (compilation, caches, allocator, lazy init).
        repeat: number of samples.
        inner: calls per sample; the sample is the per-call mean (use it for very short ops,
            where one event pair costs about as much as the op).
        device: ``"cuda"``, ``"cuda:1"``, ``"cpu"`` or None (CUDA if already in use, else CPU).

    Returns:
        Timing of one call of ``fn``, in ms.
    """
    import torch
    check_counts(warmup=warmup, repeat=repeat, inner=inner)
    dev = _device_of(device)
    for _ in range(warmup):
        fn()
    samples = []
    if dev.type == "cuda":
        with torch.cuda.device(dev):
            torch.cuda.synchronize()
            pairs = []
            for _ in range(repeat):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(inner):
                    fn()
                stop.record()
                pairs.append((start, stop))
            torch.cuda.synchronize()
            samples = [a.elapsed_time(b) / inner for a, b in pairs]
    else:
        for _ in range(repeat):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) * 1e3 / inner)
    return summarize(samples)


def benchmark_collective(op: Callable[[], object], *, warmup: int = 5, iters: int = 20,
                         repeat: int = 5, group=None) -> Timing:
    """Time a collective the nccl-tests way; every rank of ``group`` must call this.

    Args:
        op: issues one collective (blocking or not; GPU work goes to the current stream).
        warmup: untimed calls (communicator set-up, NCCL channel/proxy start-up).
        iters: back-to-back calls between the two events of one sample.
        repeat: samples; a barrier precedes each so ranks start together.
        group: process group (default: the world).

    Returns:
        Timing of one call in ms, each sample being the **slowest rank's** time / iters.
    """
    import torch
    import torch.distributed as dist
    check_counts(warmup=warmup, iters=iters, repeat=repeat)
    on_gpu = dist.get_backend(group) == "nccl"
    for _ in range(warmup):
        op()
    mine = []
    for _ in range(repeat):
        if on_gpu:
            torch.cuda.synchronize()
            dist.barrier(group=group)
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                work = op()
                if work is not None and hasattr(work, "wait"):
                    work.wait()  # async_op=True: make the current stream wait for NCCL's
            stop.record()
            stop.synchronize()
            mine.append(start.elapsed_time(stop) / iters)
        else:
            dist.barrier(group=group)
            t0 = time.perf_counter()
            for _ in range(iters):
                work = op()
                if work is not None and hasattr(work, "wait"):
                    work.wait()
            mine.append((time.perf_counter() - t0) * 1e3 / iters)
    return summarize(slowest_rank(mine, group=group))


def slowest_rank(samples_ms, group=None) -> list[float]:
    """Sample by sample, the largest value over the ranks of ``group`` (every rank must call it):
    a collective is done only when its last rank is. Returns the same list on every rank."""
    import torch
    import torch.distributed as dist
    from .config import rank_device
    t = torch.tensor(list(samples_ms), dtype=torch.float64, device=rank_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()
