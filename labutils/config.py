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


# ---- how long to allow a deliberate wait: sized from this machine, not from the hardware mode ----------------

WAIT_MARGIN = 2.5   # a start-up measured once may be beaten by a slower one under load: 2.5x of it is allowed


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask, which a container or ``taskset`` narrows)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS, Windows
        return max(1, os.cpu_count() or 1)


_STARTUP_S: dict = {}   # cuda -> seconds, measured by startup_s


def _startup_code(cuda: bool) -> str:
    return "import torch" + ("; torch.cuda.init(); torch.ones(1, device='cuda')" if cuda else "")


def startup_s(cuda: bool = False, *, refresh: bool = False) -> float:
    """Seconds a fresh Python process takes, on this machine and under its present load, to import torch
    (with ``cuda=True`` also to create a CUDA context): what every rank pays before its first line. Measured
    once per process in a subprocess (about that long), then remembered; ``refresh=True`` measures again.

    Raises:
        RuntimeError: the subprocess failed (its stderr says why) or took more than 300 s.
    """
    import subprocess
    import sys
    import time
    if refresh or cuda not in _STARTUP_S:
        t0 = time.perf_counter()
        try:
            run = subprocess.run([sys.executable, "-c", _startup_code(cuda)], capture_output=True, text=True,
                                 timeout=300, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError("a process importing torch did not finish within 300 s. HINT: the machine is "
                               "overloaded or its file system stalls; try again when it is quieter.") from exc
        if run.returncode != 0:
            raise RuntimeError(f"measuring start-up failed: {run.stderr.strip()[-500:]}. HINT: "
                               f"`{sys.executable} -c \"{_startup_code(cuda)}\"` must run in this environment.")
        _STARTUP_S[cuda] = time.perf_counter() - t0
    return _STARTUP_S[cuda]


def wait_timeout_s(wait_s: float, *, processes: int = 2, startup: float | None = None, cuda: bool = False,
                   cores: int | None = None, margin: float = WAIT_MARGIN) -> float:
    """A launch timeout (s) for ranks that are meant to wait ``wait_s`` once started: ``wait_s`` plus
    ``margin`` times the start-up of ``processes`` processes started at once on this machine's cores.

    One process's start-up (``startup``, default ``startup_s(cuda)``, measured) runs on one core; started at
    once, ``p`` processes on ``c`` cores take about ``p / c`` times as long when ``p > c``, as long when not.
    So the same demo gets a short timeout on a workstation with 16 cores and a long one on a 2-core laptop,
    whatever its GPUs.

    Raises:
        ValueError: a negative or non-finite ``wait_s``, ``processes`` or ``cores`` not a positive int,
            ``margin`` or ``startup`` not positive.
    """
    if isinstance(wait_s, bool) or not isinstance(wait_s, numbers.Real) or not 0 <= wait_s < float("inf"):
        raise ValueError(f"wait_s must be a finite number of seconds >= 0, got {wait_s!r}. "
                         "HINT: how long the ranks wait on purpose once they run, e.g. 2.")
    for name, v in (("processes", processes), ("cores", cores)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1):
            raise ValueError(f"{name} must be a positive int, got {v!r}. HINT: count the rank processes that "
                             "start at the same time (every launch and pool of a cell).")
    for name, v in (("margin", margin), ("startup", startup)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, numbers.Real) or not 0 < v < float("inf")):
            raise ValueError(f"{name} must be a positive number, got {v!r}.")
    one = startup_s(cuda) if startup is None else float(startup)
    shared = max(1.0, processes / (cores or cpu_cores()))
    return round(float(wait_s) + margin * one * shared, 1)
