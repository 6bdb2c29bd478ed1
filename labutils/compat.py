"""One place for the torch names that differ across the torch versions the course supports, and for
the ones torch does not make public: labutils reaches them only from here.

torch 2.13 renamed the tensor forms of all-gather and reduce-scatter -- ``all_gather_into_tensor`` ->
``all_gather_single``, ``reduce_scatter_tensor`` -> ``reduce_scatter_single`` (pytorch/pytorch#186123, which
added the new names and deprecated the old ones in one change) -- and the old names now emit a FutureWarning
on every call; older torch (the 2xH200 reference runs 2.11; the course supports >= 2.4) only has the old
names. Same signatures (``(output, input, group=None, async_op=False)``; reduce-scatter with ``op`` after
``input``), same dispatcher ops (``c10d::_allgather_base_`` / ``c10d::_reduce_scatter_base_``, which is what
``instruments.ledger`` counts), same NCCL call (``ncclAllGather`` / ``ncclReduceScatter``: rank k's block is
the k-th chunk of the big buffer). Calling whichever exists keeps rank output -- and so the notebooks'
checked cells -- identical across versions, with no warning.

``ALL_GATHER_NAME`` / ``REDUCE_SCATTER_NAME`` are the names this torch prefers, for a notebook that teaches
the call (``print(f"dist.{compat.ALL_GATHER_NAME}(output, input)")``); they differ between torch versions, so
print them only in a cell tagged ``nbval-ignore-output``.

The private ones (``torch.utils._pytree``, ``torch._utils``' bucket flattening, ``torch._ops``,
``TorchDispatchMode``, ``torch.cuda._sleep``, the flight-recorder dumpers of ``torch._C._distributed_c10d``, a process group's timeout) are wrapped
here, so that a torch that moves them breaks one module, with a clear error.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode  # the base class of a dispatch mode

__all__ = ["all_gather_into_tensor", "reduce_scatter_tensor", "ALL_GATHER_NAME", "REDUCE_SCATTER_NAME",
           "preferred_name", "torch_function", "TorchDispatchMode",
           "tree_map", "flatten_dense_tensors", "unflatten_dense_tensors", "is_higher_order_operator",
           "cuda_sleep", "flight_recorder_dumpers", "process_group_timeout_s"]


_NEW_NAMES = {"all_gather_into_tensor": "all_gather_single", "reduce_scatter_tensor": "reduce_scatter_single"}


def preferred_name(name: str) -> str:
    """The name this torch prefers for ``"all_gather_into_tensor"`` or ``"reduce_scatter_tensor"``: the
    torch >= 2.13 one where it exists, else ``name`` itself.

    Raises:
        ValueError: a name that was not renamed.
    """
    if name not in _NEW_NAMES:
        raise ValueError(f"no renamed torch.distributed function {name!r}. HINT: one of {', '.join(_NEW_NAMES)}.")
    return _NEW_NAMES[name] if hasattr(dist, _NEW_NAMES[name]) else name


ALL_GATHER_NAME = preferred_name("all_gather_into_tensor")   # "all_gather_single" on torch >= 2.13
REDUCE_SCATTER_NAME = preferred_name("reduce_scatter_tensor")  # "reduce_scatter_single" on torch >= 2.13


def all_gather_into_tensor(output, input, group=None, async_op: bool = False):
    """``dist.all_gather_into_tensor(output, input)`` under the name this torch prefers (``ALL_GATHER_NAME``)."""
    return getattr(dist, ALL_GATHER_NAME)(output, input, group=group, async_op=async_op)


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    """``dist.reduce_scatter_tensor(output, input, op)`` under the name this torch prefers
    (``REDUCE_SCATTER_NAME``)."""
    return getattr(dist, REDUCE_SCATTER_NAME)(output, input, op=op, group=group, async_op=async_op)


def process_group(handle):
    """The ``ProcessGroup`` a dispatched communication op names: the boxed group a ``c10d`` op carries,
    or the group name a functional collective carries; ``None`` where this torch cannot unbox or
    resolve it (the caller then assumes the world)."""
    try:
        if isinstance(handle, str):
            from torch.distributed.distributed_c10d import _resolve_process_group
            return _resolve_process_group(handle)
        return dist.ProcessGroup.unbox(handle)
    except (AttributeError, ImportError, RuntimeError, TypeError, ValueError):
        return None


def torch_function(name: str):
    """The ``torch.distributed`` function itself for ``"all_gather_into_tensor"`` or
    ``"reduce_scatter_tensor"``, under the name this torch prefers (for a timed loop that must pay for
    the torch call only, not for a wrapper around it)."""
    return getattr(dist, preferred_name(name))


# ---------------------------------------------------------------------------------------------
# torch's private names

def tree_map(fn, tree):
    """``torch.utils._pytree.tree_map``: ``fn`` applied to every leaf of nested lists/tuples/dicts."""
    from torch.utils import _pytree
    return _pytree.tree_map(fn, tree)


def flatten_dense_tensors(tensors):
    """``torch._utils._flatten_dense_tensors``: one ``torch.cat`` of the tensors into a flat bucket
    (what DDP's and ``broadcast_coalesced``'s buckets do)."""
    from torch import _utils
    return _utils._flatten_dense_tensors(tensors)


def unflatten_dense_tensors(flat, tensors):
    """``torch._utils._unflatten_dense_tensors``: views of ``flat`` shaped like ``tensors``."""
    from torch import _utils
    return _utils._unflatten_dense_tensors(flat, tensors)


def is_higher_order_operator(func) -> bool:
    """True for ``torch._ops.HigherOrderOperator`` (control-flow ops a dispatch mode must pass on)."""
    kind = getattr(getattr(torch, "_ops", None), "HigherOrderOperator", None)
    return kind is not None and isinstance(func, kind)


def cuda_sleep(cycles: int) -> None:
    """``torch.cuda._sleep``: a kernel that spins ``cycles`` GPU clock cycles on the current stream
    (work that is late on purpose, without a host-side wait)."""
    torch.cuda._sleep(cycles)


def flight_recorder_dumpers(backend: str | None) -> list:
    """torch's flight-recorder dump functions for ``backend``, most specific first:
    ``_dump_nccl_trace`` (NCCL) and ``_dump_fr_trace`` (any backend, torch >= 2.8); those this torch
    lacks are left out. Each returns the pickled dump (``pickle.loads`` it)."""
    import torch._C._distributed_c10d as c10d
    names = ["_dump_nccl_trace", "_dump_fr_trace"] if backend in (None, "nccl") else ["_dump_fr_trace"]
    return [getattr(c10d, n) for n in names if getattr(c10d, n, None) is not None]


def process_group_timeout_s(group=None) -> float:
    """Seconds of torch's timeout on this rank's process group (``group``; default: the world), as
    ``init_process_group(timeout=...)`` set it: torch keeps it on the group's backend options."""
    pg = group or dist.group.WORLD
    device = torch.device("cuda") if dist.get_backend(pg) == "nccl" else torch.device("cpu")
    backend = pg._get_backend(device)
    return backend.options._timeout.total_seconds()
