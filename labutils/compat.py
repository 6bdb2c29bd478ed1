"""One place for torch.distributed names that differ across the torch versions the course supports.

torch >= 2.13 renamed the tensor forms of all-gather and reduce-scatter (``all_gather_single``,
``reduce_scatter_single``) and made the old names emit a FutureWarning on every call; older torch
(the 2xH200 reference runs 2.11) only has the old names. Calling whichever exists keeps rank output
-- and so the notebooks' checked cells -- identical across versions. Same arguments, same NCCL call
(``ncclAllGather`` / ``ncclReduceScatter``: rank k's block is the k-th chunk of the big buffer).

``nccl_group(ctas)`` makes a communicator with a fixed number of NCCL CTAs through the NCCL options
torch exposes (``ProcessGroupNCCL.Options().config``), with a clear error where they do not exist.
"""
from __future__ import annotations

import copyreg
import importlib
import pickle
import sys

import cloudpickle
import torch
import torch.distributed as dist


def all_gather_into_tensor(output, input, group=None, async_op: bool = False):
    """``dist.all_gather_into_tensor(output, input)`` under the name this torch prefers."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(output, input, group=group, async_op=async_op)


def reduce_scatter_tensor(output, input, op=dist.ReduceOp.SUM, group=None, async_op: bool = False):
    """``dist.reduce_scatter_tensor(output, input, op)`` under the name this torch prefers."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(output, input, op=op, group=group, async_op=async_op)


_NEW_NAMES = {"all_gather_into_tensor": "all_gather_single", "reduce_scatter_tensor": "reduce_scatter_single"}


def nccl_group(ctas: int):
    """A new process group over all ranks, on its own NCCL communicator, whose collectives each use
    exactly ``ctas`` CTAs: NCCL's thread blocks, one per channel, each resident on one SM while the
    collective runs (NCCL's ``ncclConfig_t.minCTAs = maxCTAs``, set through
    ``ProcessGroupNCCL.Options().config``; NCCL >= 2.17). Fewer CTAs: fewer SMs taken from the kernels
    running beside the collective, and less bandwidth for the collective itself.

    Every rank must call it (``dist.new_group`` is collective); ``dist.destroy_process_group(group)``
    frees the communicator.

    Raises:
        ValueError: ``ctas`` is not an int >= 1.
        RuntimeError: the default process group is not NCCL (gloo has no CTAs to limit), or this
            torch's NCCL options have no ``config``.
    """
    if isinstance(ctas, bool) or not isinstance(ctas, int) or ctas < 1:
        raise ValueError(f"ctas must be an int >= 1 (NCCL thread blocks per collective), got {ctas!r}.")
    backend = dist.get_backend()
    if backend != "nccl":
        raise RuntimeError(f"nccl_group({ctas}) needs the NCCL backend; the default process group uses "
                           f"{backend}. HINT: CTAs are NCCL's thread blocks on a GPU; on {backend} use the "
                           "default group (group=None) instead.")
    opts = dist.ProcessGroupNCCL.Options()
    if not hasattr(opts, "config"):
        raise RuntimeError(f"torch {torch.__version__} has no ProcessGroupNCCL.Options().config, so NCCL's CTA "
                           "count cannot be set. HINT: a torch built with NCCL >= 2.17 (torch >= 2.2) has it.")
    opts.config.min_ctas = ctas
    opts.config.max_ctas = ctas
    return dist.new_group(backend="nccl", pg_options=opts)


def torch_function(name: str):
    """The ``torch.distributed`` function itself for ``"all_gather_into_tensor"`` or
    ``"reduce_scatter_tensor"``, under the name this torch prefers (for a timed loop that must pay for
    the torch call only, not for a wrapper around it)."""
    if name not in _NEW_NAMES:
        raise ValueError(f"no renamed torch.distributed function {name!r}. HINT: one of {', '.join(_NEW_NAMES)}.")
    return getattr(dist, _NEW_NAMES[name], None) or getattr(dist, name)


def dumps(obj) -> bytes:
    """``cloudpickle.dumps(obj)`` that also works for functions using ``dist`` and a global named like one of
    torch's config modules (``config``, ``_config``).

    cloudpickle sends, with a function, every submodule of a global module whose name the code uses as an
    attribute: a function that calls ``dist.get_rank()`` and ``config.rank_device()`` drags
    ``torch.distributed.config`` along. Since torch 2.13 that is a ``ConfigModuleInstance``, which pickle
    cannot copy ("cannot pickle 'ConfigModuleInstance' object"). Such modules are importable by name on
    every rank, so they are sent as a reference instead.
    """
    for mod in list(sys.modules.values()):
        kind = type(mod)
        if kind.__name__ == "ConfigModuleInstance" and kind not in copyreg.dispatch_table:
            copyreg.pickle(kind, _import_by_name)
    return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _import_by_name(module):
    return importlib.import_module, (module.__name__,)


def cuda_sleep(cycles: int) -> None:
    """``torch.cuda._sleep``: a kernel that spins ``cycles`` GPU clock cycles on the current stream
    (work that is late on purpose, without a host-side wait)."""
    torch.cuda._sleep(cycles)
