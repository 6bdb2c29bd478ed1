"""Process plumbing shared by ``launch`` and ``RankPool``: rendezvous, spawning, output, killing.

* The ranks' rendezvous is ``rendezvous.PrivateStore`` (a FileStore only this user can open), not
  a TCP store, which any local user could connect to.
* Ranks are fresh interpreters (``python -m labutils._rank``), i.e. the *spawn* start method:
  they work after CUDA was initialised in the notebook, and each gets its own session so that a
  kill reaches everything it started.
* Each rank's stdout+stderr arrive through a pipe, line by line, tagged with the rank.
* Ranks watch their launcher and exit if it dies (kernel restart, SIGKILL, out-of-memory killer), so
  nothing is ever orphaned: ``rank_env`` names the launcher (``LABUTILS_PARENT``: pid and start time),
  so a rank that starts only after its launcher died exits at once too, and the last rank out of a
  dead launch removes its run directory (one left by a caller that died before any rank ran goes at
  the next launch: ``remove_stale_runs``); ``kill_tree`` also reaches what a rank started, even after
  the rank itself is gone.
* ``request_diagnostics`` asks live ranks where they are (and for their flight records) before a
  hang is torn down: that is what ``RankTimeout.where`` / ``.flight`` show.
* ``print_rank_lines`` prints ranks' output with ``[rank r]`` prefixes; ``leftover_ranks`` finds
  rank processes still alive below this one (a notebook's or a test's "nothing left behind" check).
"""
from __future__ import annotations

import os
import pickle
import queue
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil


# what a rank's command line contains: launch's ranks and RankPool's workers
RANK_MODULES = ("labutils._rank", "labutils.pool.worker")

PARENT_ENV = "LABUTILS_PARENT"  # a rank's launcher, "PID:START_TIME" (set by rank_env)
RUN_LOCK = "ranks.lock"         # in a launch's run directory: each live rank holds it shared
RUN_PREFIX = "labutils-"        # a launch's run directory: RUN_PREFIX + "<caller's pid>_" + random


def parent_alive(pid: int, started: float | None) -> bool:
    """True while process ``pid`` runs and is the one that started at ``started`` (psutil's
    ``create_time``; None: any process with that pid). A zombie -- dead, not yet reaped -- is gone."""
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - started) > 0.01:
            return False  # the pid was reused: that process is gone
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def make_run_dir() -> Path:
    """A launch's run directory in the temporary folder, named for this process (``remove_stale_runs``)."""
    import tempfile
    return Path(tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}_"))


def remove_stale_runs(directory: str | os.PathLike | None = None) -> list[Path]:
    """Remove the run directories in ``directory`` (default: the temporary folder) whose caller is gone
    and that no rank holds (``RUN_LOCK``): what a caller killed before its first rank ran left behind
    (after that, the last rank out removes the folder). Returns the folders removed."""
    import fcntl
    import shutil
    import tempfile
    removed = []
    for path in Path(directory or tempfile.gettempdir()).glob(f"{RUN_PREFIX}*_*"):
        pid = path.name[len(RUN_PREFIX):].split("_", 1)[0]
        try:
            if not pid.isdigit() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            made = path.stat().st_mtime
            # alive, and already running when the folder was made: its caller (pid reuse aside)
            if parent_alive(int(pid), None) and psutil.Process(int(pid)).create_time() <= made + 1:
                continue
            lock = path / RUN_LOCK
            if lock.exists():
                fd = os.open(lock, os.O_RDONLY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while a rank still holds it
                finally:
                    os.close(fd)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        except (OSError, psutil.Error):
            continue  # a rank holds it (it removes the folder itself), or it went meanwhile
    return removed


def torchrun_env(rank: int, world_size: int, port: int, extra: dict | None = None) -> dict:
    """This process's environment plus what ``torchrun`` gives one rank of a single-node job (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` = 127.0.0.1, ``MASTER_PORT``),
    unbuffered output, loopback-only networking, then ``extra``: what any script that reads torchrun's
    variables needs, nothing of labutils'.

    User settings win: ``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME`` are only set when absent.
    """
    env = dict(os.environ)
    env.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
               LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONUNBUFFERED="1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def rank_env(rank: int, world_size: int, port: int, backend: str, extra: dict | None = None) -> dict:
    """Environment for one labutils rank: ``torchrun_env`` plus this labutils on ``PYTHONPATH``, the
    rank's number for labutils (``LABUTILS_RANK``), quiet C++ logging and NCCL's async error handling.
    """
    env = torchrun_env(rank, world_size, port)
    pkg_root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH", "")) if p)
    env.update(LABUTILS_RANK=str(rank), **{PARENT_ENV: f"{os.getpid()}:{psutil.Process().create_time()!r}"})
    env.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")  # keep C++ INFO/WARNING chatter out of cells
    env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    if extra:
        env.update({k: str(v) for k, v in extra.items()})
    return env


def spawn_rank(args: list[str], env: dict, cwd: str | None = None) -> subprocess.Popen:
    """Start ``python -m labutils._rank <args>`` in its own session with piped output."""
    return subprocess.Popen(
        [sys.executable, "-u", "-m", "labutils._rank", *args],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=env, cwd=cwd, start_new_session=True, close_fds=True)


class OutputRelay:
    """Reads each rank's output lines in background threads into one queue.

    ``get(timeout)`` returns ``(rank, line)`` or None; lines keep their trailing newline.
    The printing itself is left to the caller's thread, so that in Jupyter the text lands in the
    cell that is running. The readers never block for long (``select`` with a short timeout), so
    ``drain`` can stop them even when a process the rank started (and that outlived it) keeps the
    pipe open: no thread or descriptor is left behind.
    """

    def __init__(self):
        self.queue: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def watch(self, rank: int, stream) -> None:
        t = threading.Thread(target=self._pump, args=(rank, stream), daemon=True,
                             name=f"labutils-out-{rank}")
        t.start()
        self._threads.append(t)

    def _pump(self, rank: int, stream) -> None:
        fd, partial = stream.fileno(), b""
        try:
            while True:
                ready, _, _ = select.select([fd], [], [], 0.1)
                if not ready:
                    if self._stop.is_set():
                        break
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                *lines, partial = (partial + chunk).split(b"\n")
                for raw in lines:
                    self.queue.put((rank, raw.decode("utf-8", errors="replace") + "\n"))
        except (OSError, ValueError):
            pass
        finally:
            if partial:
                self.queue.put((rank, partial.decode("utf-8", errors="replace") + "\n"))
            try:
                stream.close()
            except OSError:
                pass

    def get(self, timeout: float):
        try:
            return self.queue.get(timeout=timeout)
        except queue.Empty:
            return None

    def drain(self, join_timeout: float = 2.0) -> list[tuple[int, str]]:
        """Wait for the readers (the pipes close when the ranks die), stop them, return the rest."""
        deadline = time.monotonic() + join_timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        self._stop.set()  # a pipe still open (a leftover grandchild): stop reading it anyway
        for t in self._threads:
            t.join(timeout=1.0)
        out = []
        while True:
            item = self.get(0)
            if item is None:
                return out
            out.append(item)


def kill_tree(procs: list[subprocess.Popen], timeout_s: float = 5.0) -> None:
    """SIGKILL every process in ``procs`` and all their descendants, then reap them.

    Uses psutil to find descendants, plus ``killpg`` of each rank's session group, which also
    reaches daemonised grandchildren (re-parented to init) after the rank itself has exited.
    Safe to call on processes that already exited.
    """
    victims: list[psutil.Process] = []
    for p in procs:
        # A reaped rank's pid may already belong to someone else: look up only unreaped ones.
        if p.returncode is None:
            try:
                ps = psutil.Process(p.pid)
                victims += ps.children(recursive=True)
                victims.append(ps)
            except psutil.Error:
                pass
        # The rank's session group outlives the rank while a member remains (and Linux keeps its
        # id from being reused meanwhile). Once we have reaped the rank, a live process with its
        # pid is someone else (pid reuse): then the group is not ours to kill.
        if hasattr(os, "killpg") and (p.returncode is None or not psutil.pid_exists(p.pid)):
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for v in victims:
        try:
            v.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=timeout_s)
    for p in procs:
        try:
            p.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass


def kill_children_with(marker: str) -> list[int]:
    """SIGKILL this process's children whose command line contains ``marker`` (e.g. a run
    directory) and return their pids: a last sweep for ranks spawned but never registered
    (an interrupt between ``Popen`` and the bookkeeping)."""
    found = []
    for child in psutil.Process().children(recursive=False):
        try:
            if any(marker in part for part in child.cmdline()):
                child.kill()
                found.append(child)
        except psutil.Error:
            pass
    psutil.wait_procs(found, timeout=5.0)
    return [c.pid for c in found]


def request_diagnostics(run_dir: str, ranks: dict[int, subprocess.Popen],
                        wait_s: float = 2.0) -> dict[int, dict]:
    """Ask the live ranks where they are (``_rank.serve_diagnostics``) and collect the answers.

    Args:
        run_dir: the launch's run directory.
        ranks: ``{rank: process}``; ranks that already exited are skipped.
        wait_s: how long to wait for the answers (a rank holding the GIL in native code cannot).

    Returns:
        ``{rank: {"frames": [...], "flight": ...}}`` for the ranks that answered.
    """
    Path(run_dir, "diagnose").touch()
    alive = {r for r, p in ranks.items() if p.poll() is None}
    answers: dict[int, dict] = {}
    deadline = time.monotonic() + wait_s
    while alive - answers.keys() and time.monotonic() < deadline:
        for r in sorted(alive - answers.keys()):
            path = Path(run_dir, f"diag-{r}.pkl")
            if path.exists():
                try:
                    answers[r] = pickle.loads(path.read_bytes())
                except Exception:  # noqa: BLE001 - unreadable answer: skip this rank
                    answers[r] = {}
        time.sleep(0.02)
    return answers


def free_loopback_port() -> int:
    """A port that was free on 127.0.0.1 a moment ago (for code that must bind it itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def print_rank_lines(lines: list[tuple[int, str]], grouped: bool) -> None:
    """Print ``(rank, line)`` pairs as ``[rank r] line``; ``grouped`` sorts them by rank (stable,
    so each rank's lines keep their order)."""
    if grouped:
        lines = sorted(lines, key=lambda item: item[0])
    for rank, line in lines:
        sys.stdout.write(f"[rank {rank}] {line if line.endswith(chr(10)) else line + chr(10)}")
    sys.stdout.flush()


def leftover_ranks(ignore=(), wait_s: float = 0.0, launcher: int | None = None) -> list[psutil.Process]:
    """labutils rank processes (``launch``'s and ``RankPool``'s) still running below this process.

    Args:
        ignore: pids not to report (e.g. those alive before a test started).
        wait_s: give processes that are exiting this long to finish first.
        launcher: look at every process of this machine instead, for the ranks that the process
            with this pid launched (their ``LABUTILS_PARENT``): ranks whose launcher died are no
            longer below anyone.

    Returns:
        The live ones (zombies -- exited, not yet reaped -- do not count); ``[]`` when nothing is
        left behind.
    """
    def alive() -> list[psutil.Process]:
        found = []
        candidates = psutil.process_iter() if launcher is not None else psutil.Process().children(recursive=True)
        for proc in candidates:
            try:
                if (proc.pid not in ignore and proc.status() != psutil.STATUS_ZOMBIE
                        and any(m in " ".join(proc.cmdline()) for m in RANK_MODULES)
                        and (launcher is None
                             or proc.environ().get(PARENT_ENV, "").startswith(f"{launcher}:"))):
                    found.append(proc)
            except psutil.Error:  # exited while we looked, or not ours to read
                pass
        return found

    found = alive()
    if found and wait_s > 0:
        psutil.wait_procs(found, timeout=wait_s)
        found = alive()
    return found
