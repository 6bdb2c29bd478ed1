"""Process groups on their own NCCL communicator, set up for an experiment: ``nccl_group(ctas)``.

``nccl_group(ctas)`` makes a communicator with a fixed number of NCCL CTAs through the NCCL options
torch exposes (``ProcessGroupNCCL.Options().config``), with a clear error where they do not exist
(labs 02 and 08: the SMs NCCL takes from the compute beside it).
"""
from __future__ import annotations

import torch
import torch.distributed as dist


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
