"""Helpers for the fault-injection suite: what "the notebook process is still healthy" means.

``Health.snapshot()`` records what a launch must give back: threads, file descriptors, child
processes, listening sockets; ``before.check()`` waits briefly for them to settle and fails with
the difference. The ``healthy`` fixture wraps a test with that check, plus the run directories
the launches made (they must be gone). Rank functions live in the test modules (sent by
value, see ``cloudpickle.register_pickle_by_value`` there).
"""
from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
import time

import cloudpickle
import psutil
import pytest

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks get _noop by value


def _noop(rank, world_size):
    return rank


@pytest.fixture
def healthy(monkeypatch):
    """The notebook process gets back every resource a launch took, whatever happened in it."""
    import labutils
    labutils.launch(_noop, world_size=1, backend="gloo", init="none", output="quiet")  # warm-up
    made = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*a, **kw):
        made.append(real_mkdtemp(*a, **kw))
        return made[-1]
    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    before = Health.snapshot()
    yield
    before.check()
    assert not [d for d in made if os.path.exists(d)], f"run directories left: {made}"


@dataclasses.dataclass(frozen=True)
class Health:
    threads: int
    fds: int
    children: frozenset
    listening: frozenset

    @staticmethod
    def snapshot() -> "Health":
        me = psutil.Process()
        family = [me, *me.children(recursive=True)]
        listening = set()
        for p in family:
            try:
                listening |= {(p.pid, c.laddr) for c in p.net_connections(kind="inet")
                              if c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                pass
        return Health(me.num_threads(), me.num_fds(), frozenset(c.pid for c in family[1:]),
                      frozenset(listening))

    def check(self, settle_s: float = 5.0) -> None:
        """Assert that nothing grew since this snapshot (other processes' run dirs excepted)."""
        deadline = time.monotonic() + settle_s
        while True:
            now = Health.snapshot()
            problems = self.diff(now)
            if not problems or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert not problems, "the notebook process did not get back to where it was: " + "; ".join(problems)

    def diff(self, now: "Health") -> list[str]:
        problems = []
        if now.threads > self.threads:
            problems.append(f"threads {self.threads} -> {now.threads}")
        if now.fds > self.fds:
            problems.append(f"file descriptors {self.fds} -> {now.fds}")
        alive = []
        for pid in now.children - self.children:
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(" ".join(p.cmdline())[:120])
            except psutil.Error:
                pass
        if alive:
            problems.append(f"child processes left: {alive}")
        if now.listening - self.listening:
            problems.append(f"listening sockets left: {sorted(now.listening - self.listening)}")
        return problems


def processes_with(marker: str) -> list[psutil.Process]:
    """Live processes anywhere on the machine whose command line contains ``marker``."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        try:
            if p.info["status"] != psutil.STATUS_ZOMBIE and marker in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


class Stopwatch:
    """``with Stopwatch() as sw: ...`` then ``sw.s``: seconds taken (also when it raised)."""

    def __enter__(self):
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.s = time.monotonic() - self.t0
        return False
