"""Choose and validate the world size and backend for a launch, before any process starts.

Rules (the contract the labs rely on):

* ``world_size=None`` -> the number of GPUs when there are at least 2, else 2 (CPU ranks);
* ``backend=None`` -> ``"nccl"`` with one GPU per rank when there are enough GPUs, else ``"gloo"``
  on CPU tensors;
* ``"nccl"`` needs CUDA and at least one GPU per rank: anything else is a ``LaunchConfigError``
  raised here, with the fix, instead of a hang or a cryptic NCCL error inside the ranks.
"""
from __future__ import annotations

import dataclasses
import numbers
import os

from .errors import LaunchConfigError

BACKENDS = ("nccl", "gloo")


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """A resolved launch configuration.

    Attributes:
        world_size: number of ranks.
        backend: ``"nccl"`` or ``"gloo"``.
        device_type: ``"cuda"`` when each rank owns GPU ``cuda:<rank>``, else ``"cpu"``.
        reason: one line saying why this backend was chosen (printed once per session).
    """
    world_size: int
    backend: str
    device_type: str
    reason: str

    def describe(self) -> str:
        """One line for the notebook, e.g. ``2 ranks, backend nccl (one GPU per rank ...)``."""
        return f"labutils: {self.world_size} ranks, backend {self.backend} ({self.reason})"


def under_torchrun(env=None) -> bool:
    """True when this process is one rank of a job started by ``torchrun`` (or another ``env://``
    launcher), rather than a labutils rank or a plain process.

    torchrun sets ``TORCHELASTIC_RUN_ID``; other launchers at least the variables ``env://``
    rendezvous needs (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``). labutils' own ranks
    set those too, and ``LABUTILS_RANK``, so they never count.
    """
    env = os.environ if env is None else env
    if "LABUTILS_RANK" in env:
        return False
    return "TORCHELASTIC_RUN_ID" in env or {"RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"} <= env.keys()


def rank_device():
    """Inside a rank: the device its tensors live on -- ``cuda:<current>`` under NCCL, else the CPU."""
    import torch
    import torch.distributed as dist
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def gpu_count() -> int:
    """Number of CUDA GPUs torch can see (0 without CUDA). Does not create a CUDA context."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve(world_size: int | None = None, backend: str | None = None,
            n_gpus: int | None = None) -> LaunchConfig:
    """Resolve defaults and validate ``world_size``/``backend``.

    Args:
        world_size: number of ranks, or None for the default (GPU count if >= 2, else 2).
        backend: ``"nccl"``, ``"gloo"`` or None for the default.
        n_gpus: GPU count to assume (tests pass it); None = ask torch.

    Returns:
        LaunchConfig.

    Raises:
        LaunchConfigError: world_size not a positive integer, unknown backend, ``nccl`` without
            CUDA, or ``nccl`` with more ranks than GPUs.
    """
    n_gpus = gpu_count() if n_gpus is None else n_gpus
    if world_size is not None:
        if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
            raise LaunchConfigError(
                f"world_size must be a positive int, got {world_size!r} ({type(world_size).__name__}). "
                "HINT: pass e.g. world_size=2, or leave it out for the default.")
        if world_size < 1:
            raise LaunchConfigError(
                f"world_size must be >= 1, got {world_size}. "
                "HINT: a launch needs at least one rank; leave it out for the default "
                f"({max(n_gpus, 2) if n_gpus >= 2 else 2} on this machine).")
        world_size = int(world_size)
    if backend is not None:
        if not isinstance(backend, str) or backend.lower() not in BACKENDS:
            raise LaunchConfigError(
                f"backend must be one of {BACKENDS} or None, got {backend!r}. "
                "HINT: 'nccl' for CUDA tensors (one GPU per rank), 'gloo' for CPU tensors.")
        backend = backend.lower()

    if backend == "nccl":
        if n_gpus == 0:
            raise LaunchConfigError(
                "backend='nccl' needs CUDA GPUs, but torch sees none on this machine. "
                "HINT: use backend='gloo' (CPU tensors), or leave backend out to pick it automatically.")
        world_size = n_gpus if world_size is None else world_size
        if world_size > n_gpus:
            raise LaunchConfigError(
                f"backend='nccl' with world_size={world_size} needs {world_size} GPUs (one per rank), "
                f"but this machine has {n_gpus}. HINT: use world_size<={n_gpus}, or backend='gloo' "
                "to run more ranks on CPU tensors.")
        return LaunchConfig(world_size, "nccl", "cuda",
                            f"one GPU per rank: cuda:0..cuda:{world_size - 1}")
    if backend == "gloo":
        world_size = (n_gpus if n_gpus >= 2 else 2) if world_size is None else world_size
        return LaunchConfig(world_size, "gloo", "cpu", "CPU tensors, chosen explicitly")
    # backend is None: choose
    if world_size is None:
        world_size = n_gpus if n_gpus >= 2 else 2
    if n_gpus >= 2 and world_size <= n_gpus:
        return LaunchConfig(world_size, "nccl", "cuda",
                            f"one GPU per rank: cuda:0..cuda:{world_size - 1}")
    if n_gpus >= 2:
        why = f"{world_size} ranks but only {n_gpus} GPUs, so CPU tensors"
    elif n_gpus == 1:
        why = "CPU tensors: NCCL needs one GPU per rank and this machine has 1 GPU"
    else:
        why = "CPU tensors: no CUDA GPU found"
    return LaunchConfig(world_size, "gloo", "cpu", why)


# ----------------------------------------------------------------------------------------------
# torch's own timeouts in the ranks, one rule for launch and the pool

# torch's process-group (and store) timeout in a rank is this much longer than the time labutils
# gives the rank's work, so that a hang always ends as labutils' RankTimeout (same text under gloo
# and NCCL), with the ranks still alive to say where they are -- never as torch's watchdog first.
PG_TIMEOUT_MARGIN_S = 60.0


def process_group_timeout(timeout_s: float) -> float:
    """Seconds of torch's process-group timeout for ranks whose work labutils stops after
    ``timeout_s``: ``timeout_s + PG_TIMEOUT_MARGIN_S``. ``launch`` sets it per call; a ``RankPool``
    sets it once, when its ranks start, from the longest task it accepts."""
    return float(timeout_s) + PG_TIMEOUT_MARGIN_S


def check_task_timeout(timeout_s: float, pg_timeout_s: float) -> float:
    """``timeout_s`` if ranks whose process group times out after ``pg_timeout_s`` can honour it.

    Raises:
        LaunchConfigError: ``process_group_timeout(timeout_s)`` exceeds ``pg_timeout_s``: torch's
            watchdog could end the task before labutils' timeout does (and say less).
    """
    longest = pg_timeout_s - PG_TIMEOUT_MARGIN_S
    if process_group_timeout(timeout_s) > pg_timeout_s:
        raise LaunchConfigError(
            f"timeout={timeout_s:g} s is longer than this pool's ranks can wait: their process group "
            f"was set up with torch's timeout of {pg_timeout_s:g} s, which must exceed a task's timeout "
            f"by {PG_TIMEOUT_MARGIN_S:g} s, so the longest task is {longest:g} s. HINT: start the pool "
            f"with RankPool(timeout={timeout_s:g}) for tasks this long, or use labutils.launch, which "
            "sets torch's timeout for each call.")
    return float(timeout_s)
