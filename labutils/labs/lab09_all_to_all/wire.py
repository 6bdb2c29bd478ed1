"""Counting what a parallel layer sends and what it keeps for backward (lab 09's bookkeeping).

* ``WireLedger``: a ``TorchDispatchMode`` that records every collective issued inside it -- the c10d
  ops behind ``dist.all_reduce`` & co., and the functional collectives DTensor issues -- with the size
  S nccl-tests would report and the bytes one rank puts on the wire in a ring,
  ``bandwidth.bus_factor(op, n) * S`` (for all-to-all: exactly the bytes it sends to other ranks).
  It works inside backward too (autograd carries the mode into its worker threads).
* ``SavedTensors``: a ``saved_tensors_hooks`` context that adds up the distinct storages autograd keeps
  for backward, parameters excluded: the activation memory of a forward pass, counted.
* ``saved_bytes_predicted``: the same number from the shapes (Korthikanti et al. 2022, "Reducing
  Activation Recomputation in Large Transformer Models", section 4).

Example, inside a launched rank::

    with WireLedger() as fwd:
        y = block(x)
    fwd.wire_bytes()        # bytes this rank sent in the forward pass
    fwd.rows()              # [{"op": "all_reduce", "calls": 1, "size_bytes": ..., "wire_bytes": ...}]
"""
from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from ... import bandwidth, compat
from ...compat import TorchDispatchMode

# c10d ops (what torch.distributed's Python functions call) -> the collective's name in bandwidth.
_C10D = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather", "allgather_": "all_gather",
         "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
         "alltoall_base_": "all_to_all", "alltoall_": "all_to_all", "broadcast_": "broadcast",
         "reduce_": "reduce"}
# functional collectives (DTensor's redistribute, torch.distributed._functional_collectives)
_FUNCOL = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
           "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all",
           "broadcast": "broadcast"}
_FUNCOL_NAMESPACES = ("_c10d_functional", "c10d_functional")


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


def _all_to_all_sent(inp: torch.Tensor, input_split_sizes, rank: int, n: int) -> int:
    """Bytes of ``inp`` that go to *other* ranks (the block for ``rank`` itself is a local copy)."""
    row = _nbytes(inp) // inp.shape[0] if inp.dim() and inp.shape[0] else 0
    splits = list(input_split_sizes or []) or [inp.shape[0] // n] * n
    return (sum(splits) - splits[rank]) * row


@dataclasses.dataclass(frozen=True)
class Collective:
    """One recorded collective: its name, nccl-tests size S and the bytes this rank sent."""
    op: str
    size_bytes: int
    wire_bytes: float
    phase: str


class WireLedger(TorchDispatchMode):
    """Record the collectives issued while the context is active.

    Args:
        phase: a label stored with every record ("forward", "backward", ...).
        world_size, rank: of the group the collectives run on (default: the world). The ledger assumes
            one group; a layer that talks over several groups needs one ledger per group.
    """

    def __init__(self, phase: str = "", world_size: int | None = None, rank: int | None = None):
        super().__init__()
        self.phase = phase
        self.world_size = dist.get_world_size() if world_size is None else world_size
        self.rank = dist.get_rank() if rank is None else rank
        self.records: list[Collective] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if compat.is_higher_order_operator(func):
            return func(*args, **kwargs)
        if any(issubclass(t, DTensor) for t in types):
            # A mode runs before tensor subclasses: step aside, let DTensor turn the op into collectives
            # on plain tensors, and see those when they come back through here.
            return NotImplemented
        self._record(func, args)
        return func(*args, **kwargs)

    def _record(self, func, args) -> None:
        ns, name = str(func.overloadpacket).split(".", 1)
        n = self.world_size
        if ns == "c10d" and name in _C10D:
            op = _C10D[name]
            if name in ("allreduce_", "broadcast_", "reduce_"):
                size = sum(_nbytes(t) for t in args[0])
            elif name == "_allgather_base_":
                size = _nbytes(args[0])                        # the gathered output
            elif name == "allgather_":
                size = sum(_nbytes(t) for t in args[1]) * n    # n x the input
            elif name == "_reduce_scatter_base_":
                size = _nbytes(args[1])                        # the input
            elif name == "reduce_scatter_":
                size = sum(_nbytes(t) for t in args[0]) * n
            elif name == "alltoall_base_":
                size = _nbytes(args[1])
                self._add(op, size, _all_to_all_sent(args[1], args[4], self.rank, n))
                return
            else:  # alltoall_(outputs, inputs, ...)
                size = sum(_nbytes(t) for t in args[1])
                self._add(op, size, size - _nbytes(args[1][self.rank]))
                return
        elif ns in _FUNCOL_NAMESPACES and name in _FUNCOL:
            op = _FUNCOL[name]
            inp = args[0]
            if op == "all_to_all":
                self._add(op, _nbytes(inp), _all_to_all_sent(inp, args[2], self.rank, n))
                return
            size = _nbytes(inp) * (args[1] if op == "all_gather" else 1)
        else:
            return
        self._add(op, size, bandwidth.bus_factor(op, n) * size)

    def _add(self, op: str, size: int, wire: float) -> None:
        self.records.append(Collective(op, int(size), float(wire), self.phase))

    def wire_bytes(self) -> float:
        """Bytes this rank sent in all recorded collectives (ring model, nccl-tests' factors)."""
        return sum(r.wire_bytes for r in self.records)

    def rows(self) -> list[dict]:
        """One row per (phase, op): calls, total S and total wire bytes, in first-seen order."""
        out: dict[tuple, dict] = {}
        for r in self.records:
            row = out.setdefault((r.phase, r.op), {"phase": r.phase, "op": r.op, "calls": 0,
                                                   "size_bytes": 0, "wire_bytes": 0.0})
            row["calls"] += 1
            row["size_bytes"] += r.size_bytes
            row["wire_bytes"] += r.wire_bytes
        return list(out.values())


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
