"""Count what every collective moves, whoever calls it: DDP's reducer, a hand-written ZeRO step, FSDP2.

    with ledger.CollectiveLedger() as book:
        loss.backward()                      # DDP all-reduces its buckets in here
    book.calls                               # [("all_reduce", 52428800, 4), ...]  (op, bytes, element size)
    book.volume_in_params(n_params)          # 2.0 for DDP: the ZeRO paper's "2 Psi"

Every ``torch.distributed`` collective, from Python or from C++ (DDP's reducer), is dispatched as an
operator of the ``c10d`` namespace (``c10d::allreduce_``, ``c10d::_reduce_scatter_base_``, ...). A
``TorchDispatchMode`` sees each call with its tensors -- also in autograd's backward threads, where
DDP and FSDP2 issue theirs -- so the bytes are read off the tensors that were actually passed.

Volume, as the ZeRO paper counts it (Rajbhandari et al., SC'20, section 7): an all-reduce of S bytes
is a reduce-scatter plus an all-gather, 2 S; a reduce-scatter counts its input S, an all-gather its
output S. A ring puts (N - 1) / N of that on each rank's link (``wire_bytes``).
"""
from __future__ import annotations

import collections

import torch
from ...compat import TorchDispatchMode

# c10d operator -> (our name, which tensor argument is "S", volume factor)
_OPS = {
    "allreduce_": ("all_reduce", "first", 2),
    "_reduce_scatter_base_": ("reduce_scatter", "input", 1),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", "input", 1),
    "reduce_scatter_": ("reduce_scatter", "input", 1),
    "_allgather_base_": ("all_gather", "output", 1),
    "allgather_into_tensor_coalesced_": ("all_gather", "output", 1),
    "allgather_": ("all_gather", "output", 1),
    "broadcast_": ("broadcast", "first", 1),
}
VOLUME_FACTOR = {name: factor for name, _, factor in _OPS.values()}


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


class CollectiveLedger(TorchDispatchMode):
    """A dispatch mode that records ``(op, bytes, element_size)`` for every c10d collective.

    ``bytes`` is S in the ZeRO paper's sense: the all-reduced tensor, the reduce-scatter's input,
    the all-gather's output. Ops on DTensors are let through (``NotImplemented``) so that the
    collectives DTensor turns them into are the ones counted, as ``CommDebugMode`` does.
    """

    def __init__(self):
        super().__init__()
        self.calls: list[tuple[str, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if any(getattr(t, "__name__", "") == "DTensor" for t in types):
            return NotImplemented
        name = getattr(func, "namespace", None) == "c10d" and func.__name__.split(".")[0]
        if name in _OPS:
            op, which, _ = _OPS[name]
            if which == "first":
                ts = _tensors(args[0])
            elif which == "input":   # (output, input, ...): the list form puts inputs second too
                ts = _tensors(args[1])
            else:
                ts = _tensors(args[0])
            if ts:
                self.calls.append((op, _nbytes(ts), ts[0].element_size()))
        return func(*args, **kwargs)

    # ---- summaries -----------------------------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Number of calls per op, e.g. ``{"all_reduce": 3}``."""
        return dict(collections.Counter(op for op, _, _ in self.calls))

    def bytes_by_op(self) -> dict[str, int]:
        """S summed per op (bytes)."""
        out: dict[str, int] = collections.defaultdict(int)
        for op, nbytes, _ in self.calls:
            out[op] += nbytes
        return dict(out)

    def volume_bytes(self, ops=("all_reduce", "reduce_scatter", "all_gather")) -> int:
        """The ZeRO paper's communication volume: 2 S per all-reduce, S per reduce-scatter / all-gather."""
        return sum(VOLUME_FACTOR[op] * nbytes for op, nbytes, _ in self.calls if op in ops)

    def volume_in_params(self, n_params: int, bytes_per_element: int | None = None) -> float:
        """``volume_bytes`` in units of Psi elements (2.0 = "2 Psi"). ``bytes_per_element``: the
        gradients' element size (default: that of the first call)."""
        if n_params <= 0:
            raise ValueError(f"n_params must be > 0, got {n_params}.")
        if not self.calls:
            return 0.0
        size = bytes_per_element or self.calls[0][2]
        return self.volume_bytes() / (n_params * size)

    def wire_bytes(self, world_size: int) -> float:
        """Bytes each rank sends over its link in a ring: (N - 1) / N of the volume."""
        return self.volume_bytes() * (world_size - 1) / world_size
