"""``launch(fn, *args)``: run ``fn(rank, world_size, *args)`` on fresh ranks from a notebook cell.

Example (works with a function defined in a notebook cell)::

    import labutils, torch, torch.distributed as dist

    def hello(rank, world_size):
        t = torch.tensor([rank + 1.0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t)
        print(f"hello from rank {rank}")
        return t

    labutils.launch(hello)            # -> [tensor([3.]), tensor([3.])] with 2 ranks

Contract: results come back in rank order (CUDA tensors as CPU tensors); each rank's output is
printed with a ``[rank r]`` prefix; an exception in a rank raises ``RankError`` within seconds;
a hang raises ``RankTimeout`` after ``timeout`` seconds; every rank is killed on the way out
(also on KeyboardInterrupt), so no process is left behind. Under ``torchrun`` the function runs
in the current process instead, and the results of all ranks are gathered.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

import cloudpickle

from . import config as _config
from . import procs
from .errors import LaunchConfigError, RankError, RankTimeout

_announced: set[str] = set()
INIT_MODES = ("eager", "lazy", "none")


def default_config(world_size: int | None = None, backend: str | None = None,
                   verbose: bool = True) -> _config.LaunchConfig:
    """Resolve the configuration ``launch`` would use and print it (once per distinct choice)."""
    cfg = _config.resolve(world_size, backend)
    line = cfg.describe()
    if verbose and line not in _announced:
        _announced.add(line)
        print(line)
    return cfg


def _under_torchrun() -> bool:
    env = os.environ
    return "LABUTILS_RANK" not in env and ("TORCHELASTIC_RUN_ID" in env or
                                           {"RANK", "WORLD_SIZE", "MASTER_ADDR"} <= env.keys())


def _launch_in_process(fn, args, kwargs):
    """Inside torchrun: run this rank's share and gather every rank's result (rank order)."""
    import torch
    import torch.distributed as dist
    from ._rank import to_cpu
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend)
    value = to_cpu(fn(dist.get_rank(), dist.get_world_size(), *args, **kwargs))
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def _print_lines(lines: list[tuple[int, str]], grouped: bool) -> None:
    if grouped:
        lines = sorted(lines, key=lambda item: item[0])  # stable: keeps each rank's order
    for rank, line in lines:
        sys.stdout.write(f"[rank {rank}] {line if line.endswith(chr(10)) else line + chr(10)}")
    sys.stdout.flush()


def _load_result(path: Path, rank: int):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception as exc:  # noqa: BLE001
        return "error", {"exc_type": type(exc).__name__,
                         "message": f"its result could not be unpickled in the notebook: {exc}",
                         "traceback": "", "hint": "return plain data (tensors, numbers, lists, "
                         "dicts); classes defined inside the rank function cannot come back."}


def launch(fn, *args, world_size: int | None = None, backend: str | None = None,
           timeout: float = 120.0, init: str = "eager", output: str = "grouped",
           env: dict | None = None, kwargs: dict | None = None) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` in ``world_size`` fresh processes.

    Args:
        fn: the rank function; may be defined in a notebook cell (it is pickled by value).
        *args: positional arguments passed to every rank after ``rank, world_size``.
        world_size: number of ranks; default = GPU count if >= 2, else 2 (see ``config.resolve``).
        backend: ``"nccl"`` (one GPU per rank, ``cuda:<rank>`` is made current), ``"gloo"``
            (CPU tensors) or None for the default.
        timeout: seconds for the whole launch, process start included; then ``RankTimeout``.
        init: ``"eager"`` (default; NCCL communicator created in ``init_process_group`` via
            ``device_id``), ``"lazy"`` (PyTorch's default: created at the first collective) or
            ``"none"`` (fn initialises ``torch.distributed`` itself; ``MASTER_ADDR/PORT``,
            ``RANK``, ``WORLD_SIZE`` are set for ``env://``).
        output: ``"grouped"`` (each rank's lines together, in rank order, when the launch ends:
            deterministic), ``"live"`` (as they arrive) or ``"quiet"`` (discard).
        env: extra environment variables for the ranks (e.g. ``{"NCCL_DEBUG": "INFO"}``).
        kwargs: keyword arguments for ``fn``.

    Returns:
        The ranks' return values as a list in rank order; tensors on GPUs come back on the CPU.

    Raises:
        LaunchConfigError: bad arguments (before anything is started).
        RankError: a rank raised or died; names the rank and carries its traceback.
        RankTimeout: ranks did not finish within ``timeout`` seconds (all ranks were killed).
    """
    kwargs = dict(kwargs or {})
    if not callable(fn):
        raise LaunchConfigError(f"fn must be callable, got {fn!r}. "
                                "HINT: pass the function itself: launch(my_fn), not launch(my_fn()).")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise LaunchConfigError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    if init not in INIT_MODES:
        raise LaunchConfigError(f"init must be one of {INIT_MODES}, got {init!r}.")
    if output not in ("grouped", "live", "quiet"):
        raise LaunchConfigError(f"output must be 'grouped', 'live' or 'quiet', got {output!r}.")
    if _under_torchrun():
        return _launch_in_process(fn, args, kwargs)
    cfg = default_config(world_size, backend, verbose=backend is None)
    try:
        payload = cloudpickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - cloudpickle raises several types
        raise LaunchConfigError(
            f"the function or its arguments cannot be sent to the ranks: {type(exc).__name__}: {exc}. "
            "HINT: create locks, files, sockets or CUDA streams inside the rank function "
            "instead of passing them in.") from exc

    run_dir = Path(tempfile.mkdtemp(prefix="labutils-"))
    (run_dir / "payload.pkl").write_bytes(payload)
    # Functions from modules the caller imported via sys.path tweaks (pytest, notebooks' folders)
    # are pickled by reference: the ranks need the same import path to find them.
    (run_dir / "sys_path.json").write_text(json.dumps([p for p in sys.path if p]))
    store = procs.LoopbackStore(timeout_s=timeout)
    relay = procs.OutputRelay()
    ranks: list = []
    lines: list[tuple[int, str]] = []
    live = output == "live"
    results: dict[int, object] = {}
    failures: dict[int, dict] = {}
    try:
        port = store.port
        if init == "none":  # let fn's own env:// rendezvous use a port of its own
            port_for_env = procs.free_loopback_port()
        for r in range(cfg.world_size):
            child_env = procs.rank_env(r, cfg.world_size, port, cfg.backend, env)
            if init == "none":
                child_env["MASTER_PORT"] = str(port_for_env)
            p = procs.spawn_rank([str(run_dir), str(r), str(cfg.world_size), cfg.backend,
                                  str(port), str(timeout), init], child_env)
            ranks.append(p)
            relay.watch(r, p.stdout)
        deadline = time.monotonic() + timeout
        pending = set(range(cfg.world_size))
        while pending and not failures:
            item = relay.get(timeout=0.02)
            while item is not None:
                (_print_lines([item], False) if live else lines.append(item))
                item = relay.get(timeout=0)
            for r in sorted(pending):
                path = run_dir / f"result-{r}.pkl"
                exited = ranks[r].poll() is not None
                if path.exists():
                    status, value = _load_result(path, r)
                    pending.discard(r)
                    if status == "ok":
                        results[r] = value
                    else:
                        failures[r] = value
                elif exited:
                    pending.discard(r)
                    failures[r] = {"exit_code": ranks[r].returncode}
            if pending and time.monotonic() > deadline and not failures:
                procs.kill_tree(ranks)
                _flush(relay, lines, live, output)
                raise RankTimeout(sorted(pending), timeout)
        if failures:
            procs.kill_tree(ranks)
            _flush(relay, lines, live, output)
            raise _rank_error(failures, lines)
        for p in ranks:  # let the ranks finish destroy_process_group, then reap them
            try:
                p.wait(timeout=max(5.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001
                break
        procs.kill_tree(ranks)
        _flush(relay, lines, live, output)
        return [results[r] for r in range(cfg.world_size)]
    except KeyboardInterrupt:
        procs.kill_tree(ranks)
        _flush(relay, lines, live, output)
        print(f"labutils: interrupted; ranks {list(range(len(ranks)))} were killed.", file=sys.stderr)
        raise
    finally:
        procs.kill_tree(ranks)
        store.close()
        shutil.rmtree(run_dir, ignore_errors=True)


def _flush(relay: procs.OutputRelay, lines: list, live: bool, output: str) -> None:
    """Print what the ranks said (the rest of it, in live mode) once they are gone."""
    rest = relay.drain()
    if output == "quiet":
        return
    if live:
        _print_lines(rest, False)
    else:
        lines.extend(rest)
        _print_lines(lines, True)
        lines.clear()


def _rank_error(failures: dict[int, dict], lines: list) -> RankError:
    """Build the RankError for the first failed rank (reported exceptions before silent deaths)."""
    reported = [r for r in sorted(failures) if "exc_type" in failures[r]]
    rank = reported[0] if reported else min(failures)
    info = failures[rank]
    if "exc_type" in info:
        return RankError(rank, exc_type=info["exc_type"], remote_message=info["message"],
                         traceback=info["traceback"], ranks=list(failures), hint=info.get("hint", ""))
    tail = "".join(line for r, line in lines if r == rank).splitlines()[-20:]
    code = info["exit_code"]
    hint = ("a rank that dies without an exception was killed (SIGKILL: often the out-of-memory "
            "killer) or crashed in native code; its last output is in .traceback.")
    if code is not None and code >= 0:
        hint = ("the rank exited without returning (os._exit, or a crash in native code); "
                "every rank must return from the function.")
    return RankError(rank, exit_code=code, traceback="\n".join(tail), ranks=list(failures), hint=hint)
