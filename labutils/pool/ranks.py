"""One generation of a pool's ranks: processes, authenticated connections, output pipes, store.

The ranks are fresh interpreters (``python -m labutils.pool.worker``) in their own sessions, with
the environment of ``procs.rank_env`` (loopback networking, one GPU per rank under NCCL). They
rendezvous through a ``rendezvous.PrivateStore`` owned here (a FileStore only this user can open),
in the generation's run directory (``procs.make_run_dir``, as launch's: held by each live rank, the
last one out of a dead notebook removes it), and, once their process group is up, connect back to a ``protocol.ControlServer`` that is closed as
soon as all of them are in. So ``spawn`` can return at once and the ranks start by themselves while
the notebook does something else; ``wait_ready`` collects them. ``pump`` waits on every connection
and output pipe at once in the calling thread -- no reader threads, so a result wakes the notebook
the moment it arrives, and output is read in the order it was written.
"""
from __future__ import annotations

import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from multiprocessing import connection as mpc
from pathlib import Path

from .. import procs, rendezvous
from ..errors import RankError, RankTimeout
from . import protocol

START_HINT = ("the ranks could not start (import torch + process group set-up). Under NCCL check "
              "that every GPU is visible and free (nvidia-smi); run the same code with "
              "labutils.launch to see the error on its own.")
DIAGNOSE_WAIT_S = 2.0  # on a timeout, wait this long for the ranks to say where they are (as launch)


class Ranks:
    """One generation of pool ranks (see the module docstring). ``spawn`` then ``wait_ready``
    (which raises with every process killed); ``kill``/``stop`` are idempotent.

    Attributes:
        ready: every rank joined the process group and connected.
        start_s: seconds from ``spawn`` until ready (0 until then).
        pg_timeout_s: torch's process-group timeout in the ranks (``config.process_group_timeout``
            of the longest task they accept).
        run_dir: the generation's directory, where the ranks answer ``diagnose`` (removed by ``kill``).
    """

    def __init__(self, world_size: int, backend: str, pg_timeout_s: float, env: dict | None = None):
        self.world_size, self.backend, self.env = world_size, backend, env
        self.pg_timeout_s = float(pg_timeout_s)
        self.run_dir = ""
        self.procs: list[subprocess.Popen] = []
        self.conns: dict[int, mpc.Connection] = {}
        self.pids: list[int] = []
        self.devices: list[str] = [""] * world_size
        self.splitter = protocol.OutputSplitter()
        self.events: list[tuple] = []
        self._readers: dict = {}  # waitable object -> ("out" | "conn", rank)
        self._by_pid: dict[int, int] = {}
        self.store = None
        self.server: protocol.ControlServer | None = None
        self.spawned_at = 0.0
        self.started_at = 0.0
        self.start_s = 0.0
        self.ready = False
        self.failed_output: list[tuple[int, str]] = []

    def spawn(self) -> None:
        """Start the rank processes and return; they join the process group on their own."""
        token = protocol.new_token()
        self.server = protocol.ControlServer(token)
        self.spawned_at = time.monotonic()
        try:
            # as launch's: named for this process, 0700, held by each live rank (procs.RUN_LOCK), so
            # the last rank out of a dead notebook removes it; it holds the ranks' private store too
            procs.remove_stale_runs()
            self.run_dir = str(procs.make_run_dir())
            (Path(self.run_dir) / procs.RUN_LOCK).touch()
            hello = (json.dumps({"address": list(self.server.address), "token": token.hex()}) + "\n").encode()
            self.store = rendezvous.PrivateStore(self.pg_timeout_s, directory=self.run_dir)
            port_for_env = procs.free_loopback_port()  # MASTER_PORT, unused by the pool's own init
            for r in range(self.world_size):
                p = subprocess.Popen(
                    [sys.executable, "-u", "-m", "labutils.pool.worker", str(r), str(self.world_size),
                     self.backend, self.store.address, str(self.pg_timeout_s), self.run_dir],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    env=procs.rank_env(r, self.world_size, port_for_env, self.backend, self.env),
                    start_new_session=True, close_fds=True)
                self.procs.append(p)
                self.pids.append(p.pid)
                self._by_pid[p.pid] = r
                self._readers[p.stdout] = ("out", r)
                try:  # the token travels through the pipe, never argv or the environment
                    p.stdin.write(hello)
                    p.stdin.close()
                except OSError:
                    pass  # it died already: found by wait_ready with its output
        except BaseException:
            self.kill()
            raise

    def wait_ready(self, start_timeout_s: float) -> list[tuple[int, str]]:
        """Wait until every rank is connected with its process group up (``start_timeout_s`` from
        ``spawn``); returns their output. Raises RankError / RankTimeout with every process killed."""
        if self.ready:
            return []
        try:
            self._wait_ready(self.server, self.spawned_at + start_timeout_s, start_timeout_s)
        except BaseException:
            self.failed_output = self.collect_output()  # for the caller to show (NCCL's words)
            self.kill()
            raise
        finally:
            self._close_server()  # nothing listens once the ranks are connected
        self.ready = True
        self.started_at = time.monotonic()
        self.start_s = self.started_at - self.spawned_at
        return self.collect_output()

    def _close_server(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def _wait_ready(self, server: protocol.ControlServer, deadline: float, start_timeout_s: float) -> None:
        waiting = set(range(self.world_size))

        def read(timeout_s: float) -> None:
            for rank, kind, _, body in self.pump(timeout_s, server):
                if kind == "ready":
                    waiting.discard(rank)
                    self.devices[rank] = pickle.loads(body)
                elif kind == "failed":
                    info = pickle.loads(body)
                    raise RankError(rank, exc_type=info["exc_type"], remote_message=info["message"],
                                    traceback=info["traceback"], hint=START_HINT)

        while waiting:
            read(0.1)
            dead = {r: c for r, c in self.dead().items() if r in waiting}
            if dead:
                # a rank that reported its error and then exited: its report says more than its exit code
                for _ in range(3):
                    read(0.1)
                r = min(dead)
                lines = self.collect_output()
                tail = "".join(t for rr, t in lines if rr == r).splitlines()[-20:]
                raise RankError(r, exit_code=dead[r], ranks=list(dead), traceback="\n".join(tail),
                                hint=START_HINT)
            if time.monotonic() > deadline:
                for _ in range(4 * self.world_size):  # first used after the deadline: read what is waiting
                    read(0.01)
                if not waiting:
                    break
                raise RankTimeout(sorted(waiting), start_timeout_s, hint=START_HINT.replace(
                    "could not start", "did not finish starting") + " Or pass a larger start_timeout.")

    def _accept(self, server: protocol.ControlServer) -> None:
        conn = server.accept(0)
        if conn is None:
            return
        kind, pid = "", 0
        try:
            if conn.poll(protocol.HANDSHAKE_S):
                kind, pid, _ = protocol.unpack(conn.recv_bytes())
        except Exception:  # noqa: BLE001 - a peer with the token but not our protocol
            pass
        rank = self._by_pid.get(pid)
        if kind != "hello" or rank is None or rank in self.conns:
            conn.close()  # holds the token but is not one of our ranks: refuse it
            return
        self.conns[rank] = conn
        self._readers[conn] = ("conn", rank)

    def pump(self, timeout_s: float, server: protocol.ControlServer | None = None) -> list[tuple]:
        """Wait up to ``timeout_s`` for any rank; return messages ``(rank, kind, task_id, body)``.

        Output is split into ``self.events``; a closed connection gives ``(rank, "eof", 0, b"")``.
        """
        msgs: list[tuple] = []
        objs = list(self._readers) + ([server] if server is not None else [])
        for obj in mpc.wait(objs, timeout_s):
            if obj is server:
                self._accept(server)
                continue
            what, rank = self._readers[obj]
            if what == "out":
                self._read_output(obj, rank)
                continue
            try:
                msgs.append((rank, *protocol.unpack(obj.recv_bytes())))
            except (EOFError, OSError):
                del self._readers[obj]
                self.conns.pop(rank, None)
                obj.close()
                msgs.append((rank, "eof", 0, b""))
        return msgs

    def _read_output(self, pipe, rank: int) -> None:
        try:
            data = os.read(pipe.fileno(), 1 << 16)
        except OSError:
            data = b""
        if data:
            self.events += self.splitter.feed(rank, data)
        else:  # EOF: the rank has exited
            del self._readers[pipe]
            self.events += self.splitter.flush(rank)
            pipe.close()

    def take_events(self) -> list[tuple]:
        events, self.events = self.events, []
        return events

    def read_output(self) -> None:
        """Read whatever the ranks have written (all of it, for ranks that exited) into ``events``."""
        for _ in range(1024):  # bounded: a rank that never stops printing must not trap us here
            pipes = [o for o, (what, _) in self._readers.items() if what == "out"]
            ready = mpc.wait(pipes, 0) if pipes else []
            if not ready:
                return
            for pipe in ready:
                self._read_output(pipe, self._readers[pipe][1])

    def collect_output(self) -> list[tuple[int, str]]:
        """``read_output``, then every line not taken yet as ``(rank, line)``."""
        self.read_output()
        return [(r, text) for kind, r, text in self.take_events() if kind == "line"]

    def send(self, rank: int, data: bytes) -> bool:
        """Send a packed message; False if the rank's connection is gone (it died)."""
        conn = self.conns.get(rank)
        try:
            conn.send_bytes(data)
            return True
        except (AttributeError, OSError):
            return False

    def interrupt(self, ranks) -> None:
        """SIGINT to these ranks' processes (KeyboardInterrupt inside a running task)."""
        for r in ranks:
            if self.procs[r].poll() is None:
                try:
                    os.kill(self.procs[r].pid, signal.SIGINT)
                except ProcessLookupError:
                    pass

    def dead(self) -> dict[int, int | None]:
        """``{rank: exit status}`` of ranks whose process has ended."""
        return {r: p.returncode for r, p in enumerate(self.procs) if p.poll() is not None}

    def exit_code(self, rank: int, wait_s: float = 2.0) -> int | None:
        try:
            return self.procs[rank].wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def diagnose(self, ranks, wait_s: float = DIAGNOSE_WAIT_S) -> dict[int, dict]:
        """Ask these ranks where they are (``procs.request_diagnostics``, as ``launch`` does on a
        hang): ``{rank: {"frames", "user_from", "state", "flight"}}`` for those that answered. Each
        generation answers once: ask just before killing it."""
        if not self.run_dir:
            return {}
        return procs.request_diagnostics(self.run_dir, {r: self.procs[r] for r in ranks}, wait_s)

    def stop(self, grace_s: float = 3.0) -> None:
        """Ask every rank to leave the process group and exit; kill what is left after ``grace_s``."""
        for r in list(self.conns):
            self.send(r, protocol.pack("stop"))
        deadline = time.monotonic() + grace_s
        for p in self.procs:
            try:
                p.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                break
        self.kill()

    def kill(self) -> None:
        """SIGKILL every rank and whatever it started; close pipes, connections and the store."""
        procs.kill_tree(self.procs)
        for obj in list(self._readers):
            try:
                obj.close()
            except OSError:
                pass
        self._readers.clear()
        self.conns.clear()
        self._close_server()
        if self.store is not None:
            self.store.close()
            self.store = None
        if self.run_dir:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = ""
