"""Counting what a parallel layer keeps for backward (lab 09's bookkeeping; what it sends is counted
by ``labutils.instruments.ledger.Ledger``).

* ``SavedTensors``: a ``saved_tensors_hooks`` context that adds up the distinct storages autograd keeps
  for backward, parameters excluded: the activation memory of a forward pass, counted.
* ``saved_bytes_predicted``: the same number from the shapes (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", section 4).
"""
from __future__ import annotations

import torch


def _storage_ptr(t: torch.Tensor) -> int | None:
    """Address of ``t``'s storage; None for a tensor subclass (DTensor) that wraps others."""
    if hasattr(t, "placements"):
        return None
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


class SavedTensors:
    """Add up what autograd saves for backward inside the context (distinct storages, parameters
    and ``exclude`` left out).

    Usage::

        with SavedTensors(exclude=block.parameters()) as saved:
            y = block(x)
        saved.nbytes       # bytes kept alive for backward
        saved.tensors      # [(shape, dtype, nbytes), ...] in the order they were saved
    """

    def __init__(self, exclude=()):
        with torch.no_grad():
            self._excluded = {_storage_ptr(t.to_local() if hasattr(t, "to_local") else t) for t in exclude}
        self._seen: set[int] = set()
        self.tensors: list[tuple[tuple, str, int]] = []
        self.skipped = 0   # tensor subclasses (DTensor) that have no storage of their own
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        ptr = _storage_ptr(t)
        if ptr is None:
            self.skipped += 1
        elif ptr not in self._excluded and ptr not in self._seen:
            self._seen.add(ptr)
            self.tensors.append((tuple(t.shape), str(t.dtype).replace("torch.", ""),
                                 t.untyped_storage().nbytes()))
        return t

    @property
    def nbytes(self) -> int:
        return sum(b for _, _, b in self.tensors)

    def __enter__(self) -> "SavedTensors":
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)


def dropout_mask_bytes(device_type: str, itemsize: int) -> int:
    """Bytes per element of the mask ``nn.Dropout`` keeps for backward: CUDA's fused kernel
    (``native_dropout``) keeps a bool mask; the CPU path keeps the scaled mask in the input's dtype."""
    return 1 if device_type == "cuda" else itemsize


def saved_bytes_predicted(tokens: int, hidden: int, ffn: int, world_size: int, *, itemsize: int,
                          sequence_parallel: bool, mask_bytes: int, stats_bytes: int = 4) -> dict:
    """Bytes one rank keeps for backward in ``x + Dropout(W2 GeLU(W1 LayerNorm(x)))`` under Megatron
    tensor parallelism, without or with sequence parallelism, from the shapes alone.

    Args:
        tokens: sequence x batch of the whole (unsharded) input.
        hidden, ffn: widths; ``ffn`` is split over the ``world_size`` ranks by both variants.
        itemsize: bytes per element of the activations.
        mask_bytes: bytes per element of the dropout mask (0 without dropout; ``dropout_mask_bytes``).
        stats_bytes: bytes per LayerNorm statistic (mean and 1/std per token; float32 for 16/32-bit input).

    Returns:
        ``{what: bytes}`` for each kept tensor and ``"total"``. Under sequence parallelism the
        LayerNorm input and statistics and the dropout mask cover ``tokens / world_size`` rows; the
        first linear layer still keeps the all-gathered, full-sequence input.
    """
    if tokens % world_size or ffn % world_size:
        raise ValueError(f"tokens ({tokens}) and ffn ({ffn}) must be divisible by world_size "
                         f"({world_size}). HINT: both variants split ffn; SP also splits the sequence.")
    local = tokens // world_size if sequence_parallel else tokens
    parts = {
        "LayerNorm input": local * hidden * itemsize,
        "LayerNorm mean and 1/std": 2 * local * stats_bytes,
        "first linear's input (full sequence)": tokens * hidden * itemsize,
        "GeLU input": tokens * (ffn // world_size) * itemsize,
        "second linear's input": tokens * (ffn // world_size) * itemsize,
        "dropout mask": local * hidden * mask_bytes,
    }
    parts["total"] = sum(parts.values())
    return parts
