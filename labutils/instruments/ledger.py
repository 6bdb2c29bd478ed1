"""A ledger of the communication one rank issues: every collective and point-to-point call, its size,
and the bytes it puts on the wire.

Inside a rank (gloo or NCCL; also in autograd's backward threads, where DDP and FSDP2 issue theirs)::

    import torch.distributed as dist
    from labutils.instruments.ledger import Ledger

    with Ledger("step") as book:
        dist.all_reduce(grad)                          # a collective, from Python or from C++ (DDP)
        dist.batch_isend_irecv([dist.P2POp(dist.isend, x, peer), dist.P2POp(dist.irecv, y, peer)])
    book.records       # [Record(op='all_reduce', ranks=(0, 1, 2), size_bytes=4096, wire_bytes=5461.33, ...), ...]
    book.summary()     # [{"phase": "step", "op": "all_reduce", "calls": 1, "size_bytes": 4096,
                       #   "wire_bytes": 5461.33}, {... "op": "send" ...}, {... "op": "recv" ...}]
    book.summary(by=("ranks", "op"))   # the same, one row per group and op
    book.counts()      # {"all_reduce": 1, "send": 1, "recv": 1}
    book.wire_bytes_per_rank()   # bytes this rank sent, all calls together (ops=(...) to pick some)
    book.unrecorded    # Counter of c10d ops seen that move no counted payload, e.g. {"barrier": 1}

The convention, one number of each kind per call:

* ``size_bytes`` -- the bytes handed over, counted as nccl-tests' size column counts them (the table
  in ``labutils.bandwidth``): the buffer of an all-reduce, broadcast or reduce; the *gathered output*
  of an all-gather; the *input* of a reduce-scatter; the send buffer of an all-to-all; the message of
  a send or a recv. It is the S of ``bandwidth.algbw_gbps`` and of the ZeRO paper's volume.
* ``wire_bytes`` -- the bytes *this rank sends* over its links for that call, in the ring model whose
  factors nccl-tests uses: ``bandwidth.bus_factor(op, n) * size_bytes`` with n the size of the call's
  group (2 (n-1)/n for an all-reduce, (n-1)/n for an all-gather or reduce-scatter, 1 for a broadcast
  or reduce); for an all-to-all exactly the bytes that go to other ranks (its own block is a local
  copy); for a send the message, for a recv 0 (the sender counts it).

``ranks`` are the global ranks of the call's group (a sub-group's collective is sized on its own
group); ``peer`` the global rank a send goes to or a recv comes from. What is counted is what the
dispatcher sees: every ``torch.distributed`` call is a ``c10d::`` operator (``c10d::allreduce_``,
``c10d::send``, ...), and DTensor's redistributions are functional collectives
(``_c10d_functional::all_gather_into_tensor``, ...); an op on a DTensor is let through so that the
collectives DTensor turns it into are the ones counted, as ``CommDebugMode`` does -- which, unlike
this ledger, does not see point-to-point calls. Ledgers nest: an outer one sees what an inner one saw.
"""
from __future__ import annotations

import collections
import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from .. import bandwidth, compat
from ..compat import TorchDispatchMode

# c10d operator -> (op name as bandwidth spells it, index of its process-group argument)
_C10D = {
    "allreduce_": ("all_reduce", 1), "allreduce_coalesced_": ("all_reduce", 1),
    "allgather_": ("all_gather", 2), "_allgather_base_": ("all_gather", 2),
    "allgather_coalesced_": ("all_gather", 2), "allgather_into_tensor_coalesced_": ("all_gather", 2),
    "reduce_scatter_": ("reduce_scatter", 2), "_reduce_scatter_base_": ("reduce_scatter", 2),
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 2),
    "alltoall_base_": ("all_to_all", 2), "alltoall_": ("all_to_all", 2),
    "broadcast_": ("broadcast", 1), "reduce_": ("reduce", 1),
    "send": ("send", 1), "recv_": ("recv", 1), "recv_any_source_": ("recv", 1),
}
# functional collectives (DTensor's redistribute, torch.distributed._functional_collectives):
# op name -> (our name, index of the group-name argument)
_FUNCOL = {
    "all_reduce": ("all_reduce", 2), "all_reduce_coalesced": ("all_reduce", 2),
    "all_gather_into_tensor": ("all_gather", 2), "all_gather_into_tensor_coalesced": ("all_gather", 2),
    "reduce_scatter_tensor": ("reduce_scatter", 3), "reduce_scatter_tensor_coalesced": ("reduce_scatter", 3),
    "all_to_all_single": ("all_to_all", 3), "broadcast": ("broadcast", 2),
}
_FUNCOL_NAMESPACES = ("_c10d_functional", "c10d_functional")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send", "recv")


@dataclasses.dataclass(frozen=True)
class Record:
    """One call: its op, its group's global ranks, the peer of a send/recv, ``size_bytes`` (handed
    over, nccl-tests' S), ``wire_bytes`` (sent by this rank), the element size, the ledger's phase."""
    op: str
    ranks: tuple
    peer: int | None
    size_bytes: int
    wire_bytes: float
    element_size: int
    phase: str


def _tensors(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _tensors(item)]
    return []


def _nbytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(x))


def _group(handle) -> tuple[tuple, int]:
    """(global ranks, this rank's index) of the group a dispatched op names; the world's where the
    group cannot be read."""
    pg = compat.process_group(handle)
    if pg is not None:
        try:
            return tuple(dist.get_process_group_ranks(pg)), pg.rank()
        except (RuntimeError, ValueError, KeyError):
            pass
    return tuple(range(dist.get_world_size())), dist.get_rank()


def _all_to_all_sent(inp: torch.Tensor, input_split_sizes, me: int, n: int) -> int:
    """Bytes of ``inp`` that go to *other* ranks (the block for this rank itself is a local copy)."""
    row = _nbytes(inp) // inp.shape[0] if inp.dim() and inp.shape[0] else 0
    splits = list(input_split_sizes or []) or [inp.shape[0] // n] * n
    return (sum(splits) - splits[me]) * row


class Ledger(TorchDispatchMode):
    """Record the communication issued while the context is active (see the module docstring).

    Args:
        phase: a label stored with every record ("forward", "backward", ...).
    """

    def __init__(self, phase: str = ""):
        super().__init__()
        self.phase = phase
        self.records: list[Record] = []
        self.unrecorded: collections.Counter = collections.Counter()

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
        ns, _, name = str(func.overloadpacket).partition(".")
        if ns == "c10d":
            if name not in _C10D:
                self.unrecorded[name.rstrip("_")] += 1
                return
            op, g = _C10D[name]
            ranks, me = _group(args[g])
            size, sent, peer = self._c10d_sizes(name, args, me, len(ranks))
            if peer is not None and 0 <= peer < len(ranks):  # else torch itself refuses the call, saying why
                peer = ranks[peer]
        elif ns in _FUNCOL_NAMESPACES and name in _FUNCOL:
            op, g = _FUNCOL[name]
            ranks, me = _group(args[g]) if len(args) > g else _group(None)
            n, inp, peer = len(ranks), args[0], None
            size = _nbytes(inp) * (args[1] if op == "all_gather" else 1)   # (input, group_size, ...)
            sent = _all_to_all_sent(inp, args[2], me, n) if op == "all_to_all" else None
        else:
            return
        if sent is None:
            sent = bandwidth.bus_factor(op, len(ranks)) * size if op not in ("send", "recv") else (
                size if op == "send" else 0)
        first = _tensors(args[0])
        elem = first[0].element_size() if first else 0
        self.records.append(Record(op, ranks, peer, int(size), float(sent), elem, self.phase))

    @staticmethod
    def _c10d_sizes(name, args, me, n):
        """(size_bytes, bytes sent or None for the ring model, peer's group rank or None)."""
        if name in ("allgather_", "_allgather_base_", "allgather_coalesced_", "allgather_into_tensor_coalesced_"):
            return _nbytes(args[0]), None, None                         # the gathered output
        if name in ("reduce_scatter_", "_reduce_scatter_base_", "reduce_scatter_tensor_coalesced_"):
            return _nbytes(args[1]), None, None                         # the input
        if name == "alltoall_base_":
            return _nbytes(args[1]), _all_to_all_sent(args[1], args[4], me, n), None
        if name == "alltoall_":                                         # (outputs, inputs, ...)
            size = _nbytes(args[1])
            return size, size - _nbytes(args[1][me]), None
        if name in ("send", "recv_"):
            return _nbytes(args[0]), None, args[2]
        return _nbytes(args[0]), None, None       # all_reduce, broadcast, reduce, recv from any source

    # ---- summaries -----------------------------------------------------------------------------
    def summary(self, by: tuple = ("phase", "op")) -> list[dict]:
        """One row per distinct ``by`` (fields of ``Record``; ``("ranks", "op")`` splits by group):
        those fields, the calls, total ``size_bytes`` and total ``wire_bytes``, in first-seen order."""
        fields = {f.name for f in dataclasses.fields(Record)} - {"size_bytes", "wire_bytes"}
        bad = [k for k in by if k not in fields]
        if bad or not by:
            raise ValueError(f"summary(by={by!r}): {bad or 'nothing'} is not a field to group by. "
                             f"HINT: any of {', '.join(sorted(fields))}.")
        out: dict[tuple, dict] = {}
        for r in self.records:
            key = tuple(getattr(r, k) for k in by)
            row = out.setdefault(key, dict(zip(by, key), calls=0, size_bytes=0, wire_bytes=0.0))
            row["calls"] += 1
            row["size_bytes"] += r.size_bytes
            row["wire_bytes"] += r.wire_bytes
        return list(out.values())

    def counts(self) -> dict[str, int]:
        """Number of calls per op, e.g. ``{"all_reduce": 3, "send": 1}``."""
        return dict(collections.Counter(r.op for r in self.records))

    def wire_bytes_per_rank(self, ops=None) -> float:
        """Bytes this rank sent in the recorded calls (of ``ops`` only, if given): ring model, nccl-tests'
        factors."""
        return sum(r.wire_bytes for r in self.records if ops is None or r.op in ops)
