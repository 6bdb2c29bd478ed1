"""Honest timing: CUDA events around the timed region, warm-ups, repeats, medians, slowest rank.

* ``benchmark(fn)``: one device, one process. On GPU each sample is bracketed by two CUDA events
  on the current stream; on CPU by ``time.perf_counter``.
* ``benchmark_collective(op)``: nccl-tests' loop (``src/common.cu``, ``BenchTime``) -- warm-up calls, a
  barrier, ``iters`` back-to-back calls, time / iters -- measured differently in three ways:

  - the clock: two CUDA events on the current stream around the calls (GPU time of the loop), where
    nccl-tests reads a host clock before the launches and again after a stream synchronize (so its
    time also holds the launches' host cost and the synchronize);
  - the ranks: each sample is the **slowest rank's** (nccl-tests' ``-a 3``; its default, ``-a 1``,
    is the mean over ranks), because a collective is done only when its last rank is done;
  - the samples: ``repeat`` samples and their median, where nccl-tests reports one per size.

  Call it on every rank. ``benchmark_loops`` does the same for several loops of calls in turn (a
  benchmark's call next to a bare loop, a replayed CUDA graph); ``repeated(fn)`` makes such a loop of
  a callable.
* ``Clock(device)``: the one clock every timed region in labutils uses -- marks are CUDA events on
  the device's current stream on a GPU, ``time.perf_counter`` on the CPU; ``SpanTimer`` records
  named spans on several devices with it (for ``plots.timeline_plot``).

Statistics are in ``summarize`` (pure; unit-tested without a GPU).
"""
from __future__ import annotations

import contextlib
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


def _deciles(sorted_x: Sequence[float]) -> tuple[float, float]:
    """p10 and p90, linearly interpolated (numpy's default method: ``statistics.quantiles``'
    "inclusive"); one sample is its own p10 and p90 (Python < 3.13 refuses it)."""
    if len(sorted_x) == 1:
        return sorted_x[0], sorted_x[0]
    cuts = statistics.quantiles(sorted_x, n=10, method="inclusive")
    return cuts[0], cuts[-1]


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
    return Timing(tuple(xs), statistics.median(s), s[0], s[-1], *_deciles(s))


def check_counts(**counts: int) -> None:
    """Raise ValueError unless each count is an int >= 1 (``warmup`` may be 0)."""
    for name, v in counts.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "warmup" else 1):
            lim = 0 if name == "warmup" else 1
            raise ValueError(f"{name} must be an int >= {lim}, got {v!r}.")


class Clock:
    """Marks on one device's timeline: CUDA events on its current stream on a GPU, ``perf_counter``
    on the CPU. Read a pair of marks only after ``synchronize()``::

        clock = timing.Clock("cuda:0")        # or "cpu", a torch.device, or None (see below)
        start = clock.mark(); work(); stop = clock.mark()
        clock.synchronize()
        clock.elapsed_ms(start, stop)

    A GPU mark is recorded on the stream that is current *when ``mark()`` is called* (inside
    ``with torch.cuda.stream(s)``: on ``s``), so it measures what that stream waited for.
    ``device=None`` means the current CUDA device if CUDA is already in use, else the CPU.

    Attributes:
        device: the resolved ``torch.device`` (``cuda:<index>`` or ``cpu``).
        on_gpu: True for a CUDA device.
    """

    def __init__(self, device=None):
        import torch
        if device is None:
            in_use = torch.cuda.is_available() and torch.cuda.is_initialized()
            device = torch.device("cuda", torch.cuda.current_device()) if in_use else torch.device("cpu")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device, self.on_gpu = device, device.type == "cuda"

    def mark(self):
        """Now, on this device's timeline."""
        if not self.on_gpu:
            return time.perf_counter()
        import torch
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def synchronize(self) -> None:
        """Wait until the device has reached every mark made so far (nothing to do on the CPU)."""
        if self.on_gpu:
            import torch
            torch.cuda.synchronize(self.device)

    def elapsed_ms(self, start, stop) -> float:
        """Milliseconds from mark ``start`` to mark ``stop`` (after ``synchronize()`` on a GPU)."""
        return start.elapsed_time(stop) if self.on_gpu else (stop - start) * 1e3


class SpanTimer:
    """Named spans of work on one or more devices, from a common zero, for ``plots.timeline_plot``.

    ``begin(devices)`` sets time 0 on every device (call it after a synchronize / barrier, so that
    the devices' zeros coincide); ``with timer.span(device, lane, kind, label): ...`` brackets work;
    ``spans()`` synchronises and returns ``[{"lane", "kind", "label", "start_ms", "end_ms"}]``.
    """

    def __init__(self):
        self._clocks: dict = {}
        self._zero: dict = {}
        self._marks: list = []

    def _clock(self, device) -> Clock:
        if device not in self._clocks:
            self._clocks[device] = Clock(device)
        return self._clocks[device]

    def begin(self, devices) -> None:
        self._marks = []
        self._zero = {d: self._clock(d).mark() for d in devices}

    @contextlib.contextmanager
    def span(self, device, lane: str, kind: str, label: str):
        clock = self._clock(device)
        start = clock.mark()
        yield
        self._marks.append((device, lane, kind, label, start, clock.mark()))

    def spans(self) -> list[dict]:
        for d in self._zero:
            self._clock(d).synchronize()

        def ms(device, mark):
            return self._clock(device).elapsed_ms(self._zero[device], mark)
        return [{"lane": lane, "kind": kind, "label": label, "start_ms": ms(d, a), "end_ms": ms(d, b)}
                for d, lane, kind, label, a, b in self._marks]


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
    clock = Clock(device)
    # on a GPU, fn's work goes to the clock's device, and so to the stream the events are on
    with torch.cuda.device(clock.device) if clock.on_gpu else contextlib.nullcontext():
        for _ in range(warmup):
            fn()
        clock.synchronize()
        pairs = []
        for _ in range(repeat):
            start = clock.mark()
            for _ in range(inner):
                fn()
            pairs.append((start, clock.mark()))
        clock.synchronize()
    return summarize([clock.elapsed_ms(a, b) / inner for a, b in pairs])


def benchmark_collective(op: Callable[[], object], *, warmup: int = 5, iters: int = 20,
                         repeat: int = 5, group=None) -> Timing:
    """Time a collective with nccl-tests' loop (events, slowest rank, median: see the module docstring); every
    rank of ``group`` must call this.

    Args:
        op: issues one collective (blocking or not; GPU work goes to the current stream).
        warmup: untimed calls (communicator set-up, NCCL channel/proxy start-up).
        iters: back-to-back calls between the two events of one sample.
        repeat: samples; a barrier precedes each so ranks start together.
        group: process group (default: the world).

    Returns:
        Timing of one call in ms, each sample being the **slowest rank's** time / iters.
    """
    def loop(k: int) -> None:
        for _ in range(k):
            work = op()
            if work is not None and hasattr(work, "wait"):
                work.wait()  # async_op=True: make the current stream wait for NCCL's
    return benchmark_loops({"op": loop}, warmup=warmup, iters=iters, repeat=repeat, group=group)["op"]


def repeated(fn: Callable[[], object]) -> Callable[[int], None]:
    """``loop(k)``: ``fn()`` called k times back to back -- the form ``benchmark_loops`` and a CUDA-graph
    capture take."""
    def loop(k: int) -> None:
        for _ in range(k):
            fn()
    return loop


def benchmark_loops(loops: dict, *, warmup: int = 5, iters: int = 20, repeat: int = 5,
                    group=None) -> dict:
    """Time loops of collectives with nccl-tests' loop (events, slowest rank, median), sample by sample in
    turn; every rank calls it.

    ``loops[name](k)`` issues k calls back to back (a bare ``for`` loop around a torch call, or a
    CUDA graph replayed k times). One sample of a loop: synchronise, barrier, synchronise, a mark,
    ``loop(iters)``, a mark; time / iters. The loops take turns sample by sample, so a drift of
    the machine (clocks, a noisy neighbour) affects them alike and their ratio stays honest.

    Returns:
        ``{name: Timing}`` of one call in ms, each sample being the **slowest rank's**.
    """
    import torch.distributed as dist
    check_counts(warmup=warmup, iters=iters, repeat=repeat)
    if not loops:
        raise ValueError("benchmark_loops needs at least one loop. HINT: {'name': loop}.")
    clock = Clock("cuda" if dist.get_backend(group) == "nccl" else "cpu")
    for loop in loops.values():
        loop(warmup)
    mine: dict = {name: [] for name in loops}
    for _ in range(repeat):
        for name, loop in loops.items():
            clock.synchronize()
            dist.barrier(group=group)
            clock.synchronize()
            start = clock.mark()
            loop(iters)
            stop = clock.mark()
            clock.synchronize()
            mine[name].append(clock.elapsed_ms(start, stop) / iters)
    flat = slowest_rank([x for name in loops for x in mine[name]], group=group)
    return {name: summarize(flat[i * repeat:(i + 1) * repeat]) for i, name in enumerate(loops)}


def slowest_rank(samples_ms, group=None) -> list[float]:
    """Sample by sample, the largest value over the ranks of ``group`` (every rank must call it):
    a collective is done only when its last rank is. Returns the same list on every rank."""
    import torch
    import torch.distributed as dist
    from .config import rank_device
    t = torch.tensor(list(samples_ms), dtype=torch.float64, device=rank_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.cpu().tolist()


def sleep_cycles_per_ms(device=None) -> float:
    """Clock cycles of ``compat.cuda_sleep`` per millisecond on this GPU (measured, not assumed)."""
    import torch
    from .compat import cuda_sleep
    clock = Clock("cuda" if device is None else device)
    with torch.cuda.device(clock.device):
        cuda_sleep(1000)
        a = clock.mark()
        cuda_sleep(20_000_000)
        b = clock.mark()
    clock.synchronize()
    return 20_000_000 / clock.elapsed_ms(a, b)


def gpu_sleep(ms: float, cycles_per_ms: float) -> None:
    """Keep the current CUDA stream busy for about ``ms`` while the host goes on at once: work queued
    behind it then starts back to back, with no gap left by the host (``cycles_per_ms`` from
    ``sleep_cycles_per_ms``)."""
    from .compat import cuda_sleep
    cuda_sleep(max(1, int(ms * cycles_per_ms)))
