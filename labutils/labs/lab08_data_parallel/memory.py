"""Bytes per parameter each scheme keeps on a rank, and the GPU memory actually allocated.

The ZeRO paper (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", SC'20, section 3.1 and figure 1) counts the *model states* of mixed-precision Adam per
parameter: 2 bytes of fp16 weights, 2 of fp16 gradients and K = 12 of optimizer state (fp32 master
weights, momentum, variance) -- 2 Psi + 2 Psi + 12 Psi = 16 Psi for Psi parameters. Sharding them
over N ranks (section 5):

    stage 0 (DDP)          2 + 2 + 12            P_os    (ZeRO-1)   2 + 2 + 12 / N
    P_os+g (ZeRO-2)        2 + (2 + 12) / N      P_os+g+p (ZeRO-3)  (2 + 2 + 12) / N

This lab trains in fp32 with bf16 autocast for the matmuls, so there is no separate master copy:
4 bytes of weights, 4 of gradients and 8 of Adam state (momentum, variance) -- the same 16 bytes per
parameter, split 4 + 4 + 8. ``bytes_per_param(scheme, N, precision)`` gives both.
"""
from __future__ import annotations

import gc
import time

# (weights, gradients, optimizer state) in bytes per parameter
PRECISIONS = {
    "fp32 Adam (this lab)": (4, 4, 8),
    "mixed-precision Adam (ZeRO paper)": (2, 2, 12),
}
OURS = "fp32 Adam (this lab)"
SCHEMES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 / FSDP")


def bytes_per_param(scheme: str, world_size: int, precision: str = OURS) -> float:
    """Model-state bytes per parameter that one rank holds.

    Raises:
        ValueError: unknown scheme or precision, or world_size < 1.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}. HINT: one of {', '.join(SCHEMES)}.")
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}. HINT: one of {', '.join(PRECISIONS)}.")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}.")
    w, g, o = PRECISIONS[precision]
    n = world_size
    return {"DDP": w + g + o, "ZeRO-1": w + g + o / n, "ZeRO-2": w + (g + o) / n,
            "ZeRO-3 / FSDP": (w + g + o) / n}[scheme]


def formula(scheme: str, precision: str = OURS) -> str:
    """The per-rank formula in Psi, e.g. ``"4Ψ + 4Ψ + 8Ψ/N"``."""
    w, g, o = PRECISIONS[precision]
    return {"DDP": f"{w}Ψ + {g}Ψ + {o}Ψ", "ZeRO-1": f"{w}Ψ + {g}Ψ + {o}Ψ/N",
            "ZeRO-2": f"{w}Ψ + ({g}Ψ + {o}Ψ)/N", "ZeRO-3 / FSDP": f"({w}Ψ + {g}Ψ + {o}Ψ)/N"}[scheme]


def predicted_bytes(scheme: str, n_params: int, world_size: int, precision: str = OURS) -> float:
    """``bytes_per_param * n_params``."""
    return bytes_per_param(scheme, world_size, precision) * n_params


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
    if getattr(device, "type", str(device)) != "cuda":
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
    if getattr(device, "type", str(device)) != "cuda":
        return 0
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device)


def allocated(device) -> int:
    """``torch.cuda.memory_allocated`` (0 off CUDA)."""
    import torch
    return torch.cuda.memory_allocated(device) if getattr(device, "type", str(device)) == "cuda" else 0


def peak(device) -> int:
    """``torch.cuda.max_memory_allocated`` since the last reset (0 off CUDA)."""
    import torch
    return torch.cuda.max_memory_allocated(device) if getattr(device, "type", str(device)) == "cuda" else 0


def reset_peak(device) -> None:
    """Start a new peak window (no-op off CUDA)."""
    import torch
    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
