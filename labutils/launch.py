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
printed with a ``[rank r]`` prefix (at most 2000 + 500 lines per rank); an exception in a rank
raises ``RankError`` within seconds, naming the rank that failed by itself; a hang raises
``RankTimeout`` after ``timeout`` seconds, saying where each rank was; every rank -- and whatever
it started -- is killed on the way out (also on KeyboardInterrupt), so no process, port or
thread is left behind (tests/test_faults.py); if the caller itself dies (a kernel restart, the
out-of-memory killer), the ranks notice and exit, and the last one out removes the run's temporary
folder (0700, named for the caller), which also holds the private store the ranks meet in
(``rendezvous``). The ranks import with the caller's ``sys.path``.
Under ``torchrun`` the function runs in the current process instead, and the results of all
ranks are gathered.
"""
from __future__ import annotations

import collections
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

from . import errors, procs, rendezvous
from . import config as _config
from .errors import LaunchConfigError

INIT_MODES = ("eager", "lazy", "none")
FAILURE_GRACE_S = 1.0   # after the first failure, wait this long for the others (to find the cause)
DIAGNOSE_WAIT_S = 2.0   # on a timeout, wait this long for the ranks to say where they are
EXIT_WAIT_S = 10.0      # after success, wait this long for the ranks to tear down before killing


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


class _Transcript:
    """What the ranks printed: shown live, grouped at the end, or not at all; bounded per rank.

    A rank that prints a wall of text (``NCCL_DEBUG=INFO`` with COLL, a print in a hot loop) keeps
    its first ``head`` and last ``tail`` lines; the middle is counted, not kept or printed.
    """

    def __init__(self, output: str, head: int = 2000, tail: int = 500):
        self.output, self.head_n, self.tail_n = output, head, tail
        self.head: dict[int, list[str]] = collections.defaultdict(list)
        self.tail: dict[int, collections.deque] = collections.defaultdict(
            lambda: collections.deque(maxlen=tail))
        self.seen: collections.Counter = collections.Counter()

    def add(self, rank: int, line: str) -> None:
        self.seen[rank] += 1
        if len(self.head[rank]) < self.head_n:
            self.head[rank].append(line)
            if self.output == "live":
                procs.print_rank_lines([(rank, line)], False)
        else:
            self.tail[rank].append(line)

    def pump(self, relay: procs.OutputRelay, wait_s: float) -> None:
        item = relay.get(timeout=wait_s)
        while item is not None:
            self.add(*item)
            item = relay.get(timeout=0)

    def text(self, rank: int) -> str:
        return "".join(self.head[rank]) + "".join(self.tail[rank])

    def finish(self, relay: procs.OutputRelay) -> None:
        """Read what is left (the ranks are gone) and print what was not printed yet."""
        for item in relay.drain():
            self.add(*item)
        if self.output == "quiet":
            return
        out = []
        for r in sorted(self.seen):
            if self.output == "grouped":
                out += [(r, ln) for ln in self.head[r]]
            omitted = self.seen[r] - len(self.head[r]) - len(self.tail[r])
            if omitted:
                out.append((r, f"... {omitted} lines not shown (labutils keeps the first "
                               f"{self.head_n} and the last {self.tail_n} of each rank) ..."))
            out += [(r, ln) for ln in self.tail[r]]
        procs.print_rank_lines(out, False)


def _load_result(path: Path, rank: int):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception as exc:  # noqa: BLE001
        return "error", {"exc_type": type(exc).__name__,
                         "message": f"its result could not be unpickled in the notebook: {exc}",
                         "traceback": "", "hint": "return plain data (tensors, numbers, lists, "
                         "dicts); classes defined inside the rank function cannot come back."}


def _pickle_payload(fn, args: tuple, kwargs: dict) -> bytes:
    """cloudpickle ``(fn, args, kwargs)``, or say which of them cannot be sent and why."""
    from ._rank import source_map  # lazy: `python -m labutils._rank` must not import it twice
    from . import pickling         # lazy: cloudpickle, needed only to send a payload
    try:
        payload = pickling.dumps((fn, args, kwargs, source_map((fn, args, kwargs))))
        # the ranks put this sys.path first (as multiprocessing's spawn does), so that what the
        # caller can import -- test modules, sys.path.append(...) in a notebook -- they can too
        return pickle.dumps({"sys_path": list(sys.path), "payload": payload},
                            protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:  # noqa: BLE001 - cloudpickle raises several types
        parts = [("the function (through a global or closure variable it uses)", fn),
                 *((f"argument {i + 1} ({type(a).__name__})", a) for i, a in enumerate(args)),
                 *((f"keyword argument {k!r} ({type(v).__name__})", v) for k, v in kwargs.items())]
        what = "the function or its arguments"
        for label, obj in parts:
            try:
                pickling.dumps(obj)
            except Exception:  # noqa: BLE001
                what = label
                break
        raise LaunchConfigError(
            f"{what} cannot be sent to the ranks: {type(exc).__name__}: {exc}. "
            "HINT: create locks, files, sockets, threads or CUDA streams inside the rank function "
            "instead of passing them in (or using them as globals).") from exc


def launch(fn, *args, world_size: int | None = None, backend: str | None = None,
           timeout: float = 120.0, init: str = "eager", output: str = "grouped",
           env: dict | None = None, kwargs: dict | None = None) -> list:
    """Run ``fn(rank, world_size, *args, **kwargs)`` in ``world_size`` fresh processes.

    Args:
        fn: the rank function; may be defined in a notebook cell (it is pickled by value).
        *args: positional arguments passed to every rank after ``rank, world_size``.
        world_size: number of ranks; default = GPU count if >= 2, else 2 (see ``config.resolve``);
            refused at once beyond what the machine holds (``config.check_world_size``).
        backend: ``"nccl"`` (one GPU per rank, ``cuda:<rank>`` is made current), ``"gloo"``
            (CPU tensors) or None for the default.
        timeout: seconds for the whole launch, process start included; then ``RankTimeout``.
            torch's own timeouts (process group, store) are set longer, so a hang ends here.
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
        LaunchConfigError: bad arguments, or more ranks than the machine can hold (NCCL: GPUs;
            gloo: ``config.cpu_rank_limit``, ``LABUTILS_MAX_CPU_RANKS`` overrides), before anything
            is started.
        RankError: a rank raised or died; names the rank that failed first by itself (not one
            that only lost its peers) and carries its traceback. Raised within seconds.
        RankTimeout: ranks did not finish within ``timeout`` seconds; says where each rank was
            (``.where``) and, where torch records them, its collectives (``.flight``).
        KeyboardInterrupt: re-raised after every rank was killed (and told where it was).
    """
    kwargs = dict(kwargs or {})
    if not callable(fn):
        raise LaunchConfigError(f"fn must be callable, got {fn!r}. "
                                "HINT: pass the function itself: launch(my_fn), not launch(my_fn()).")
    timeout = _config.check_timeout(timeout)
    if init not in INIT_MODES:
        raise LaunchConfigError(f"init must be one of {INIT_MODES}, got {init!r}. HINT: 'eager' (the "
                                "default) unless the lesson is about when NCCL sets up its communicator.")
    if output not in ("grouped", "live", "quiet"):
        raise LaunchConfigError(f"output must be 'grouped', 'live' or 'quiet', got {output!r}. "
                                "HINT: 'live' shows lines as they arrive, 'quiet' discards them.")
    if _config.under_torchrun():
        return _launch_in_process(fn, args, kwargs)
    cfg = _config.default_config(world_size, backend, verbose=backend is None)
    payload = _pickle_payload(fn, args, kwargs)

    relay, transcript = procs.OutputRelay(), _Transcript(output)
    ranks: dict[int, object] = {}
    store = run_dir = None
    try:
        # once a rank runs, the last rank out of a dead launch removes the folder (_rank.watch_parent);
        # a caller killed before that leaves it to the next launch's remove_stale_runs
        procs.remove_stale_runs()
        run_dir = procs.make_run_dir()  # 0700: it also holds the ranks' private store
        (run_dir / "payload.pkl").write_bytes(payload)
        (run_dir / procs.RUN_LOCK).touch()  # each live rank holds it shared
        store = rendezvous.PrivateStore(_config.process_group_timeout(timeout), directory=run_dir)
        port_for_env = procs.free_loopback_port()  # MASTER_PORT: init="none" fn's own rendezvous
        for r in range(cfg.world_size):
            child_env = procs.rank_env(r, cfg.world_size, port_for_env, cfg.backend, env)
            ranks[r] = procs.spawn_rank([str(run_dir), str(r), str(cfg.world_size), cfg.backend,
                                         store.address, str(timeout), init], child_env)
            relay.watch(r, ranks[r].stdout)
        return _supervise(ranks, run_dir, relay, transcript, timeout)
    except KeyboardInterrupt:
        _interrupted(ranks, run_dir, relay, transcript)
        raise
    finally:
        procs.kill_tree(list(ranks.values()))
        relay.drain(join_timeout=0)
        if store is not None:
            store.close()
        if run_dir is not None:
            procs.kill_children_with(str(run_dir))  # spawned, but interrupted before registered
            shutil.rmtree(run_dir, ignore_errors=True)


def _supervise(ranks: dict, run_dir: Path, relay, transcript: _Transcript, timeout: float) -> list:
    """Wait for every rank's result; turn failures and hangs into RankError / RankTimeout."""
    deadline = time.monotonic() + timeout
    pending = set(ranks)
    results: dict[int, object] = {}
    failures: dict[int, dict] = {}
    first_failure = None
    while True:
        transcript.pump(relay, 0.02)
        for r in sorted(pending):
            path = run_dir / f"result-{r}.pkl"
            if not path.exists():
                if ranks[r].poll() is None or path.exists():  # written just before it exited?
                    continue
                pending.discard(r)
                failures[r] = {"exit_code": ranks[r].returncode}
                continue
            status, value = _load_result(path, r)
            pending.discard(r)
            (results if status == "ok" else failures)[r] = value
        now = time.monotonic()
        if failures:  # wait a moment for the failures that follow, to name the one that caused them
            first_failure = first_failure or now
            if not pending or now - first_failure > FAILURE_GRACE_S:
                break
        elif not pending:
            break
        elif now > deadline:
            diagnostics = procs.request_diagnostics(str(run_dir), ranks, DIAGNOSE_WAIT_S)
            procs.kill_tree(list(ranks.values()))
            transcript.finish(relay)
            raise errors.hang_error(sorted(pending), timeout, sorted(results), diagnostics)
    if failures:
        procs.kill_tree(list(ranks.values()))
        transcript.finish(relay)
        raise errors.failure_error(failures, {r: transcript.text(r) for r in failures},
                                   sorted(results))
    (run_dir / "release").touch()  # every rank has its result: let them tear down and exit
    stop = time.monotonic() + EXIT_WAIT_S
    for p in ranks.values():
        try:
            p.wait(timeout=max(0.1, stop - time.monotonic()))
        except subprocess.TimeoutExpired:
            break  # a teardown that hangs (NCCL) is not the user's problem: kill_tree ends it
    procs.kill_tree(list(ranks.values()))
    transcript.finish(relay)
    return [results[r] for r in sorted(ranks)]


def _interrupted(ranks: dict, run_dir: Path, relay, transcript: _Transcript) -> None:
    """Ctrl-C / kernel interrupt: say where the ranks were, kill them, print their output."""
    where: dict[int, str] = {}
    try:
        diagnostics = procs.request_diagnostics(str(run_dir), ranks, wait_s=1.0)
        where = {r: errors.describe_frames(d["frames"], d.get("state", "")) for r, d in diagnostics.items()
                 if d.get("frames")}
    except KeyboardInterrupt:  # a second interrupt: skip the diagnosis, not the cleanup
        pass
    finally:
        procs.kill_tree(list(ranks.values()))
    transcript.finish(relay)
    lines = [f"labutils: interrupted; ranks {sorted(ranks)} were killed."]
    lines += [f"  rank {r} was at {w}" for r, w in sorted(where.items())]
    print("\n".join(lines), file=sys.stderr)
