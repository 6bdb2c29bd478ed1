"""Choose and validate the world size and backend for a launch, before any process starts.

Rules (the contract the labs rely on):

* ``world_size=None`` -> the number of GPUs when there are at least 2, else 2 (CPU ranks);
* ``backend=None`` -> ``"nccl"`` with one GPU per rank when there are enough GPUs, else ``"gloo"``
  on CPU tensors;
* ``"nccl"`` needs CUDA and at least one GPU per rank: anything else is a ``LaunchConfigError``
  raised here, with the fix, instead of a hang or a cryptic NCCL error inside the ranks;
* ``"gloo"`` ranks are bounded by what this machine can hold (``cpu_rank_limit``: CPUs and available
  memory), unless ``LABUTILS_MAX_CPU_RANKS`` says otherwise -- a world size of a million is refused at
  once instead of starting ranks until the out-of-memory killer ends the notebook's kernel.

``check_world_size`` and ``check_timeout`` are the validators ``launch`` and ``RankPool`` share;
``default_config`` is what both call to resolve (and announce) their configuration.
"""
from __future__ import annotations

import dataclasses
import numbers
import os

import psutil

from .errors import LaunchConfigError

BACKENDS = ("nccl", "gloo")

# Memory one gloo rank holds: a fresh interpreter after `import torch` and `init_process_group`
# measured 225 MiB resident (146 MiB of it its own, the rest shared libraries; torch 2.13 CPU build,
# psutil's memory_full_info in the rank). Counted as 256 MiB: room for small tensors on top.
RANK_MEMORY_BYTES = 256 * 2**20
# Each rank's start costs about 1.5 s of CPU (import torch): 8 ranks per CPU start in ~12 s, well
# within the default timeout; more would spend the timeout starting rather than running.
RANKS_PER_CPU = 8
MAX_CPU_RANKS_ENV = "LABUTILS_MAX_CPU_RANKS"  # the override, for those who know better
_announced: set[str] = set()


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


def _arg(name: str, value, cli: bool) -> str:
    """How a person writes an argument: ``backend='gloo'`` in Python, ``--backend gloo`` on the command line."""
    return f"--{name.replace('_', '-')} {value}" if cli else f"{name}={value!r}"


def cpu_rank_limit(environ=None) -> tuple[int, str]:
    """How many gloo (CPU) ranks this machine can hold, and why: ``(limit, reason)``.

    The smaller of ``RANKS_PER_CPU`` per CPU this process may use and the available memory over
    ``RANK_MEMORY_BYTES``; ``LABUTILS_MAX_CPU_RANKS=N`` in the environment replaces both.

    Raises:
        LaunchConfigError: ``LABUTILS_MAX_CPU_RANKS`` is not a positive integer.
    """
    environ = os.environ if environ is None else environ
    override = environ.get(MAX_CPU_RANKS_ENV)
    if override is not None:
        if not override.strip().isdigit() or int(override) < 1:
            raise LaunchConfigError(f"{MAX_CPU_RANKS_ENV} must be a positive integer, got {override!r}. "
                                    f"HINT: e.g. {MAX_CPU_RANKS_ENV}=64, or unset it for the machine's bound.")
        return int(override), f"{MAX_CPU_RANKS_ENV}={int(override)}"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    available = psutil.virtual_memory().available
    by_cpu, by_memory = RANKS_PER_CPU * cpus, int(available // RANK_MEMORY_BYTES)
    if by_memory < by_cpu:
        return max(by_memory, 1), (f"{available / 2**30:.1f} GiB of memory available, about "
                                   f"{RANK_MEMORY_BYTES // 2**20} MiB per rank")
    return by_cpu, f"{cpus} CPUs, at most {RANKS_PER_CPU} ranks per CPU"


def check_world_size(world_size, backend: str, n_gpus: int | None = None, cli: bool = False) -> int:
    """Validate a world size for ``backend`` (``"nccl"`` or ``"gloo"``) before anything starts.

    NCCL: one GPU per rank (``n_gpus``, None = ask torch). gloo: at most ``cpu_rank_limit()``.
    ``cli=True`` words the HINTs as command-line options (``--world-size``) rather than arguments.

    Returns:
        ``world_size`` as an int.

    Raises:
        LaunchConfigError: not a positive int, or more ranks than the machine can hold.
    """
    if isinstance(world_size, bool) or not isinstance(world_size, numbers.Integral):
        raise LaunchConfigError(
            f"world_size must be a positive int, got {world_size!r} ({type(world_size).__name__}). "
            f"HINT: pass e.g. {_arg('world_size', 2, cli)}, or leave it out for the default.")
    world_size = int(world_size)
    if world_size < 1:
        raise LaunchConfigError(
            f"world_size must be >= 1, got {world_size}. HINT: ranks are processes, so at least one; "
            f"leave it out for the default.")
    if backend == "nccl":
        n_gpus = gpu_count() if n_gpus is None else n_gpus
        if n_gpus == 0:
            raise LaunchConfigError(
                f"{_arg('backend', 'nccl', cli)} needs CUDA GPUs, but torch sees none on this machine. "
                f"HINT: use {_arg('backend', 'gloo', cli)} (CPU tensors), or leave the backend out to "
                "pick it automatically.")
        if world_size > n_gpus:
            raise LaunchConfigError(
                f"{_arg('backend', 'nccl', cli)} with {_arg('world_size', world_size, cli)} needs {world_size} GPUs "
                f"(one per rank), but this machine has {n_gpus}. HINT: use "
                f"{_arg('world_size', n_gpus, cli)} or fewer, or {_arg('backend', 'gloo', cli)} to run "
                "more ranks on CPU tensors.")
    elif backend == "gloo":
        limit, why = cpu_rank_limit()
        if world_size > limit:
            raise LaunchConfigError(
                f"{_arg('world_size', world_size, cli)}: {world_size} gloo ranks are more than this machine can "
                f"hold, at most {limit} "
                f"({why}). HINT: use {_arg('world_size', min(limit, 4), cli)} or another number up to "
                f"{limit}; if you know the machine holds more, set {MAX_CPU_RANKS_ENV}=N in the "
                "environment (os.environ in a notebook, before the launch).")
    return world_size


def check_timeout(timeout, what: str = "timeout") -> float:
    """A positive number of seconds, as a float; else ``LaunchConfigError`` with a HINT."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise LaunchConfigError(
            f"{what} must be a positive number of seconds, got {timeout!r}. HINT: e.g. {what}=60; "
            "leave it out for the default.")
    return float(timeout)


def resolve(world_size: int | None = None, backend: str | None = None,
            n_gpus: int | None = None, cli: bool = False) -> LaunchConfig:
    """Resolve defaults and validate ``world_size``/``backend``.

    Args:
        world_size: number of ranks, or None for the default (GPU count if >= 2, else 2).
        backend: ``"nccl"``, ``"gloo"`` or None for the default.
        n_gpus: GPU count to assume (tests pass it); None = ask torch.
        cli: word the HINTs as command-line options (``--backend gloo``).

    Returns:
        LaunchConfig.

    Raises:
        LaunchConfigError: world_size not a positive integer, unknown backend, ``nccl`` without
            CUDA, ``nccl`` with more ranks than GPUs, or more gloo ranks than the machine holds.
    """
    if backend is not None:
        if not isinstance(backend, str) or backend.lower() not in BACKENDS:
            raise LaunchConfigError(
                f"backend must be one of {BACKENDS} or None, got {backend!r}. "
                f"HINT: {_arg('backend', 'nccl', cli)} for CUDA tensors (one GPU per rank), "
                f"{_arg('backend', 'gloo', cli)} for CPU tensors.")
        backend = backend.lower()
    if world_size is not None:
        world_size = check_world_size(world_size, "any", cli=cli)  # type and sign first
    if backend == "gloo" and world_size is not None:  # no need to ask torch about GPUs
        return LaunchConfig(check_world_size(world_size, "gloo", cli=cli), "gloo", "cpu",
                            "CPU tensors, chosen explicitly")
    n_gpus = gpu_count() if n_gpus is None else n_gpus
    if backend == "nccl":
        world_size = check_world_size(max(n_gpus, 1) if world_size is None else world_size, "nccl", n_gpus, cli)
        return LaunchConfig(world_size, "nccl", "cuda",
                            f"one GPU per rank: cuda:0..cuda:{world_size - 1}")
    if world_size is None:
        world_size = n_gpus if n_gpus >= 2 else 2
    if backend == "gloo":
        return LaunchConfig(check_world_size(world_size, "gloo", cli=cli), "gloo", "cpu",
                            "CPU tensors, chosen explicitly")
    # backend is None: choose
    if n_gpus >= 2 and world_size <= n_gpus:
        return LaunchConfig(world_size, "nccl", "cuda",
                            f"one GPU per rank: cuda:0..cuda:{world_size - 1}")
    if n_gpus >= 2:
        why = f"{world_size} ranks but only {n_gpus} GPUs, so CPU tensors"
    elif n_gpus == 1:
        why = "CPU tensors: NCCL needs one GPU per rank and this machine has 1 GPU"
    else:
        why = "CPU tensors: no CUDA GPU found"
    return LaunchConfig(check_world_size(world_size, "gloo", cli=cli), "gloo", "cpu", why)


def default_config(world_size: int | None = None, backend: str | None = None,
                   verbose: bool = True) -> LaunchConfig:
    """Resolve the configuration ``launch`` and ``RankPool`` would use and print it (once per
    distinct choice in this process)."""
    cfg = resolve(world_size, backend)
    line = cfg.describe()
    if verbose and line not in _announced:
        _announced.add(line)
        print(line)
    return cfg


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
