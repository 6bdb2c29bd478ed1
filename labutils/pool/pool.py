"""``RankPool``: ranks started once and kept alive, so a cell costs milliseconds instead of a launch.

    import labutils, torch, torch.distributed as dist

    def total(rank, world_size):
        t = torch.tensor([rank + 1.0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
        dist.all_reduce(t)
        return t

    with labutils.RankPool() as pool:     # process group initialised once (one GPU per rank: NCCL)
        pool.run(total)                   # [tensor([3.]), tensor([3.])], like labutils.launch
        pool.run(total)                   # again, without starting anything

``run`` keeps the contract of ``labutils.launch``; ``exec`` runs source code in a namespace that
each rank keeps between calls (what ``%%ranks`` uses). Faults (docs of ``run``): an exception
in a rank raises ``RankError`` and keeps the pool if every other rank returned; a rank stuck
afterwards (in a collective with the failed one), a hang (``RankTimeout``) or a dead rank
restarts the pool -- fresh ranks, per-rank state gone, and the exception says so. Ctrl-C / kernel
interrupt sends SIGINT to the ranks: the pool survives if they stop, else it is restarted. A
restart after a fault returns at once: the fresh ranks start in the background while you read the
error, and the next task waits for them.
"""
from __future__ import annotations

import linecache
import threading
import time
import weakref

from .. import config as _config
from ..errors import LaunchConfigError, RankError, RankTimeout, hang_error
from ..procs import print_rank_lines
from . import protocol
from .ranks import Ranks
from .status import PoolStatus
from .task import RESTARTED, RanksInterrupted, Task

OUTPUTS = ("grouped", "live", "quiet")
LONGEST_TASK_S = 600.0  # a pool accepts tasks this long even when its default timeout is shorter


def _check_output(output):
    if output not in OUTPUTS:
        raise LaunchConfigError(f"output must be one of {OUTPUTS}, got {output!r}.")
    return output


def _shutdown(holder: list) -> None:  # weakref.finalize / atexit: must not refer to the pool
    ranks, holder[0] = holder[0], None
    if ranks is not None:
        ranks.kill()


class RankPool:
    """``world_size`` persistent ranks with an initialised process group.

    Args:
        world_size, backend: as in ``labutils.launch`` (``config.resolve`` picks the defaults).
        timeout: default seconds per ``run``/``exec`` before ``RankTimeout`` (and a restart).
            The ranks' process group is set up once, for the longest task accepted,
            ``max(timeout, LONGEST_TASK_S)``; torch's own timeout is longer by the margin launch
            uses (``config.process_group_timeout``), so that labutils always reports first. A task
            timeout beyond that is refused (``LaunchConfigError``).
        start_timeout: seconds for the ranks to start (``import torch`` + process group);
            default ``max(timeout, 120)``.
        output: ``"grouped"`` (each rank's lines together, in rank order, when the task ends),
            ``"live"`` (as they arrive) or ``"quiet"``.
        env: extra environment variables for the ranks.
        wait: wait in the constructor until the ranks are up (default). ``wait=False`` returns at
            once: the ranks start in the background -- meanwhile the notebook can do other work, or
            start a second pool -- and the first task waits for them (a failed start raises there).

    The ranks start in the constructor. ``close()`` (idempotent) stops them; so do leaving a
    ``with`` block, the interpreter's exit (kernel shutdown) and garbage collection; ranks also
    exit by themselves if the notebook's process dies.

    Raises:
        LaunchConfigError: bad arguments (nothing is started).
        RankError / RankTimeout: the ranks failed to start.
    """

    def __init__(self, world_size: int | None = None, backend: str | None = None,
                 timeout: float = 120.0, *, start_timeout: float | None = None,
                 output: str = "grouped", env: dict | None = None, wait: bool = True):
        self.timeout = _config.check_timeout(timeout)
        self.start_timeout = _config.check_timeout(start_timeout or max(self.timeout, 120.0), "start_timeout")
        self.output = _check_output(output)
        self.config: _config.LaunchConfig = _config.default_config(world_size, backend, verbose=backend is None)
        self.pg_timeout_s = _config.process_group_timeout(max(self.timeout, LONGEST_TASK_S))
        self._env = dict(env or {})
        self._holder: list = [None]
        self._finalizer = weakref.finalize(self, _shutdown, self._holder)
        self._lock = threading.Lock()
        self._closed = False
        self._task_id = 0
        self.tasks_run = 0
        self.restarts = 0
        self._start(wait=wait)

    # ---- lifecycle -------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def backend(self) -> str:
        return self.config.backend

    @property
    def start_s(self) -> float:
        """Seconds the current ranks took to start (process, ``import torch``, process group);
        0 while they are still starting."""
        r = self._holder[0]
        return r.start_s if r is not None else 0.0

    def _start(self, wait: bool = True) -> None:
        """Spawn fresh ranks; with ``wait``, wait until they are ready (else the next task does)."""
        ranks = Ranks(self.config.world_size, self.config.backend, self.pg_timeout_s, self._env)
        ranks.spawn()
        self._holder[0] = ranks
        if wait:
            self._wait_ready()

    def _wait_ready(self) -> None:
        ranks = self._holder[0]
        if ranks is None or ranks.ready:
            return
        try:
            lines = ranks.wait_ready(self.start_timeout)
        except BaseException as exc:  # the ranks are killed already (Ctrl-C included)
            self._holder[0] = None  # the next task starts afresh
            if isinstance(exc, (RankError, RankTimeout)) and self.output != "quiet":
                print_rank_lines(ranks.failed_output, True)  # what they said (NCCL's words)
            raise
        if lines and self.output != "quiet":
            print_rank_lines(lines, True)

    def _kill(self) -> None:
        _shutdown(self._holder)

    def restart(self) -> None:
        """Kill the ranks and start fresh ones (same configuration, empty namespaces)."""
        self._require_open()
        self._kill()
        self.restarts += 1
        self._start()

    def close(self) -> None:
        """Stop the ranks (idempotent): ask them to leave the process group, kill what remains."""
        self._closed = True
        ranks, self._holder[0] = self._holder[0], None
        if ranks is not None:
            ranks.stop() if ranks.ready else ranks.kill()  # starting ranks would not hear "stop"
        self._finalizer.detach()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> "RankPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "running"
        return f"<RankPool {state}: {self.world_size} ranks, backend {self.backend}>"

    def status(self) -> PoolStatus:
        """Liveness and counters; does not talk to the ranks (works while they are stuck)."""
        r = self._holder[0]
        dead = r.dead() if r else {}
        return PoolStatus(self.world_size, self.backend, r is not None,
                          [i for i in range(self.world_size) if r and i not in dead], dead,
                          r.pids if r else [], r.devices if r else [], self.tasks_run,
                          self.restarts, time.monotonic() - r.started_at if r and r.ready else 0.0,
                          starting=bool(r and not r.ready))

    def _require_open(self) -> None:
        if self._closed:
            raise LaunchConfigError("this RankPool is closed. HINT: create a new one "
                                    "(or %ranks start in a notebook).")

    # ---- tasks -----------------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, ranks=None, output: str | None = None,
            kwargs: dict | None = None) -> list:
        """Run ``fn(rank, world_size, *args, **kwargs)`` on the pool's ranks.

        Same contract as ``labutils.launch``: results in rank order (CUDA tensors come back on
        the CPU), each rank's output printed with ``[rank r]`` prefixes.

        Args:
            timeout: seconds (default: the pool's); then ``RankTimeout`` (with ``.where``,
                ``.stacks``, ``.flight``, as ``launch``'s) and a restart. At most the longest task
                the pool's process group was set up for (``RankPool(timeout=...)``).
            ranks: run on these ranks only (int or list); default all. Collectives must then be
                limited to them (``dist.new_group``), or they never return.
            output: ``"grouped"``/``"live"``/``"quiet"`` (default: the pool's).

        Raises:
            LaunchConfigError: bad arguments, closed pool, fn/args that cannot be pickled, or a
                timeout that the ranks' process group cannot honour (the HINT says what can).
            RankError: a rank raised (pool kept if every other rank returned, else restarted)
                or died (pool restarted). The message says which.
            RankTimeout: ranks did not finish in time; the pool was restarted.
            RanksInterrupted (a KeyboardInterrupt): the notebook was interrupted; the ranks were
                interrupted too (the pool kept) or did not stop (the pool restarted). The message says which.
        """
        if not callable(fn):
            raise LaunchConfigError(f"fn must be callable, got {fn!r}. "
                                    "HINT: pass the function itself: run(my_fn), not run(my_fn()).")
        from .._rank import source_map  # as launch: the ranks' tracebacks show the cells' lines
        kwargs = dict(kwargs or {})
        body = self._dumps((fn, args, kwargs, source_map((fn, args, kwargs))),
                           "the function or its arguments")
        return self._submit("call", body, ranks, timeout, output)

    def exec(self, code: str, *, ranks=None, timeout: float | None = None, output: str | None = None,
             push: dict | None = None, fetch=(), filename: str | None = None) -> list[dict]:
        """Run source ``code`` on the ranks, in each rank's persistent namespace.

        The namespace holds ``rank``, ``world_size``, ``device``, ``torch``, ``dist`` and every
        name earlier calls assigned. ``push`` assigns these values first (same on every rank);
        ``fetch`` names come back: the result is one ``{name: value}`` dict per selected rank, in
        rank order. A last bare expression has its ``repr`` printed, as in a REPL.
        Errors as in ``run``; invalid Python raises ``SyntaxError`` before anything is sent
        (IPython syntax such as ``%magics`` or ``!commands`` does not run on the ranks).
        """
        if not isinstance(code, str):
            raise LaunchConfigError(f"code must be a string, got {type(code).__name__}.")
        fetch = [fetch] if isinstance(fetch, str) else list(fetch)
        filename = filename or f"<ranks cell {self._task_id + 1}>"
        compile(code, filename, "exec")  # a SyntaxError is raised here, not once per rank
        if code:  # the cell's lines here too: RankTimeout.where / .stacks quote them
            linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        body = self._dumps((code, filename, dict(push or {}), fetch), "the pushed values")
        return self._submit("exec", body, ranks, timeout, output)

    def fetch(self, name: str, *, ranks=None, timeout: float | None = None) -> list:
        """The value of ``name`` in each selected rank's namespace, in rank order."""
        return [d[name] for d in self.exec("", ranks=ranks, timeout=timeout, fetch=[name])]

    def push(self, *, ranks=None, timeout: float | None = None, **values) -> None:
        """Assign ``values`` (same on every selected rank) in the ranks' namespaces."""
        self.exec("", ranks=ranks, timeout=timeout, push=values, output="quiet")

    def _dumps(self, obj, what: str) -> bytes:
        try:
            return protocol.dumps(obj)
        except Exception as exc:  # noqa: BLE001 - cloudpickle raises several types
            raise LaunchConfigError(
                f"{what} cannot be sent to the ranks: {type(exc).__name__}: {exc}. HINT: create "
                "locks, files, sockets or CUDA streams on the ranks instead of passing them in.") from exc

    def _check_ranks(self, ranks) -> list[int]:
        if ranks is None:
            return list(range(self.world_size))
        sel = [ranks] if isinstance(ranks, int) and not isinstance(ranks, bool) else ranks
        try:
            sel = sorted(set(int(r) for r in sel if not isinstance(r, bool)))
        except (TypeError, ValueError):
            sel = []
        if not sel or sel[0] < 0 or sel[-1] >= self.world_size:
            raise LaunchConfigError(f"ranks must be ranks of this pool (0..{self.world_size - 1}), "
                                    f"got {ranks!r}. HINT: e.g. ranks=[0] or ranks=None for all.")
        return sel

    def _submit(self, kind: str, body: bytes, ranks, timeout, output) -> list:
        timeout = self.timeout if timeout is None else _config.check_timeout(timeout)
        _config.check_task_timeout(timeout, self.pg_timeout_s)
        output = _check_output(output or self.output)
        sel = self._check_ranks(ranks)
        self._require_open()
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this RankPool is busy with another task (from another thread). "
                               "HINT: one task at a time per pool; create a second pool for more.")
        try:
            if self._holder[0] is None:  # a start that failed: try afresh
                self._start()
            self._wait_ready()  # fresh ranks of a restart may still be starting
            self._check_idle_deaths()
            self._task_id += 1
            self.tasks_run += 1
            task = Task(self._holder[0], self._task_id, sel, output)
            return self._finish(task, task.run(protocol.pack(kind, self._task_id, body), timeout))
        finally:
            self._lock.release()

    def _check_idle_deaths(self) -> None:
        ranks = self._holder[0]
        dead = ranks.dead()
        if not dead:
            return
        lines = ranks.collect_output()
        self._kill()
        self.restarts += 1
        self._start(wait=False)
        r = min(dead)
        tail = "".join(t for rr, t in lines if rr == r).splitlines()[-20:]
        raise RankError(r, exit_code=dead[r], ranks=list(dead), traceback="\n".join(tail),
                        hint=f"it died while the pool was idle (out of memory? killed?); {RESTARTED}. "
                             "Run the cell again.")

    def _finish(self, task: "Task", outcome: str) -> list:
        """Turn a task's outcome into results or the right exception; restart when needed."""
        task.collect_output()  # all of it: a dead rank's last words explain its death
        error = task.error(outcome) if (task.dead or task.failures) else None
        restart = outcome in ("dead", "stuck", "timeout", "interrupted-stuck")
        if outcome == "timeout":  # before the kill: where each rank is, as launch's RankTimeout says
            pending = sorted(task.pending or task.unended)
            error = hang_error(pending, task.timeout, [r for r in task.selected if r not in pending],
                               task.ranks.diagnose(task.selected), then=RESTARTED)
        if restart:
            self._kill()
        task.print_output()  # before the new ranks say anything
        if restart:  # in the background: the error comes back now, the next task waits for the ranks
            self.restarts += 1
            self._start(wait=False)
        if outcome in ("interrupted", "interrupted-stuck"):
            running = task.interrupted or task.selected
            stuck = sorted(set(task.pending) | set(task.dead)) or running
            raise RanksInterrupted(running, stuck if outcome == "interrupted-stuck" else [])
        if error is not None:
            raise error
        return [task.results[r] for r in task.selected]
