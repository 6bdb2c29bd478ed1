"""GPU memory as the CUDA caching allocator counts it: what a piece of work leaves allocated and the
peak it needs, above a baseline; off CUDA every reading is None (or 0 for the plain readers).

    from labutils.instruments import memory
    with memory.Probe(device) as probe:     # synchronises, starts a new peak window, takes the baseline
        y = block(x)
        probe.held_now()                    # bytes allocated now above the baseline (synchronises first)
        y.backward(dy)
    probe.held_bytes, probe.peak_bytes      # at the exit, above the baseline

Between experiments in one process, ``settle`` (NCCL's references to finished collectives' tensors
dropped) and ``fresh_baseline`` (garbage and cached blocks freed) make ``allocated`` count only what
the program itself holds.
"""
from __future__ import annotations

import gc
import time


def _on_cuda(device) -> bool:
    return getattr(device, "type", str(device).split(":")[0]) == "cuda"


class Probe:
    """Bytes allocated on ``device`` by the work inside the context: ``held_bytes`` (allocated at the
    exit minus at the entry) and ``peak_bytes`` (the allocator's peak in between minus the entry's);
    None off CUDA. The device is synchronised at the entry and the exit."""

    def __init__(self, device):
        import torch
        self.device = torch.device(device)
        self.on_cuda = self.device.type == "cuda"
        self.base = self.held_bytes = self.peak_bytes = None

    def __enter__(self) -> "Probe":
        import torch
        if self.on_cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
        return self

    def held_now(self) -> int | None:
        """Bytes allocated now above the baseline (after a synchronise); None off CUDA."""
        import torch
        if not self.on_cuda:
            return None
        torch.cuda.synchronize(self.device)
        return torch.cuda.memory_allocated(self.device) - self.base

    def __exit__(self, *exc) -> None:
        import torch
        if self.on_cuda:
            self.held_bytes = self.held_now()
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self.base


# ProcessGroupNCCL's watchdog thread looks at its list of collectives every 100 ms (kWatchdogThreadSleepMillis)
WATCHDOG_PERIOD_S = 0.1


def settle(device, groups=(None,)) -> None:
    """Make ``torch.cuda.memory_allocated`` count only what the program itself holds: drop the references
    the process groups still keep to tensors of finished collectives. Every rank must call it (it issues
    one tiny collective per group). No-op off CUDA.

    An asynchronous NCCL collective (DDP's bucket all-reduces) keeps its tensors alive until the caller
    waits on its ``Work`` -- DDP waits on a future instead -- or until the group's watchdog thread has seen
    it finish; the watchdog then hands the references back and they are dropped at the group's next
    collective (``ProcessGroupNCCL::workEnqueue``). Until then a freed DDP's buckets, or the buckets DDP
    replaced when it rebuilt them, still count as allocated: a measurement that forgets this is off by
    whole buckets, by an amount that depends on thread timing. So: synchronize, wait out one watchdog
    period and a half, issue one collective on every group, collect garbage.
    """
    import torch
    import torch.distributed as dist
    if not _on_cuda(device):
        return
    gc.collect()  # objects freed in reference cycles (a DDP and its reducer) let go of their tensors first
    torch.cuda.synchronize(device)
    time.sleep(1.5 * WATCHDOG_PERIOD_S)
    for group in groups:
        dist.all_reduce(torch.zeros(1, device=device), group=group)
    torch.cuda.synchronize(device)
    gc.collect()


def fresh_baseline(device) -> int:
    """Free what the last experiment left (garbage, cached blocks), reset the peak, and return the
    bytes allocated now -- the zero from which an experiment's memory is counted. 0 off CUDA."""
    import torch
    gc.collect()
    if not _on_cuda(device):
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def allocated(device) -> int:
    """``torch.cuda.memory_allocated`` (0 off CUDA)."""
    import torch
    return torch.cuda.memory_allocated(device) if _on_cuda(device) else 0


def peak(device) -> int:
    """``torch.cuda.max_memory_allocated`` since the last reset (0 off CUDA)."""
    import torch
    return torch.cuda.max_memory_allocated(device) if _on_cuda(device) else 0


def reset_peak(device) -> None:
    """Start a new peak window (no-op off CUDA)."""
    import torch
    if _on_cuda(device):
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
