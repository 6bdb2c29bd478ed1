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
parameter, split 4 + 4 + 8. ``bytes_per_param(scheme, N, precision)`` gives both. What a rank really
holds is read from the CUDA allocator by ``labutils.instruments.memory``.
"""
from __future__ import annotations

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
