"""Learners kept apart: another Unix user cannot join or disturb a running launch or pool.

A throw-away user (made with useradd, removed at the end) runs an intruder while the owner's
ranks are mid-run: it finds the ranks' rendezvous (a rank's command line names it, as ``ps``
shows every user), tries to open, join and write the store, to read or write the run's files,
and connects to every socket the ranks listen on, sending junk and trying to use each as a torch
store. Every attempt must fail, and the owner's run must still finish with the right sums.

    pytest -n 0 tests/test_isolation.py -q      # root only (skipped otherwise, with the reason)
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time

import cloudpickle
import psutil
import pytest

import labutils
from labutils import procs
import unix_users

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

pytestmark = [pytest.mark.skipif(unix_users.reason_unavailable() is not None,
                                 reason=str(unix_users.reason_unavailable())),
              pytest.mark.timeout(300)]

# Runs as the other user: argv[1] is JSON {"ports": [...]}. Prints JSON {attempt: outcome}.
INTRUDER = r'''
import faulthandler, json, os, socket, sys, threading
from datetime import timedelta
import psutil, torch.distributed as dist
faulthandler.dump_traceback_later(90, exit=True)  # a hang shows where it was
given = json.loads(sys.argv[1])
ports = given["ports"]
out = {}
def attempt(name, fn, limit_s=8):
    def go():
        try:
            fn()
            out[name] = "SUCCEEDED"
        except Exception as exc:
            out[name] = "denied: " + type(exc).__name__ + ": " + (str(exc).splitlines() or [""])[0][:120]
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(limit_s)
    out.setdefault(name, f"denied: no answer in {limit_s} s")  # e.g. a peer socket that never replies
stores, run_dirs = set(), set()
for pid in given["pids"]:
    cmd = psutil.Process(pid).cmdline()
    if "labutils._rank" in cmd:
        run_dirs.add(cmd[cmd.index("labutils._rank") + 1]); stores.add(cmd[cmd.index("labutils._rank") + 5])
    if "labutils.pool.worker" in cmd:
        stores.add(cmd[cmd.index("labutils.pool.worker") + 4])
out["found"] = {"stores": len(stores), "run_dirs": len(run_dirs), "ports": len(ports)}
for k, path in enumerate(sorted(stores)):
    attempt(f"list store dir {k}", lambda: os.listdir(os.path.dirname(path)))
    attempt(f"read store {k}", lambda: open(path, "rb").read())
    def join():
        s = dist.FileStore(path, -1); s.set_timeout(timedelta(seconds=3)); s.set("labutils/init_done/0", "1")
    attempt(f"join store {k}", join)
for k, d in enumerate(sorted(run_dirs)):
    attempt(f"read payload {k}", lambda: open(os.path.join(d, "payload.pkl"), "rb").read())
    attempt(f"write release {k}", lambda: open(os.path.join(d, "release"), "w").write("x"))
for port in ports:
    def junk():
        with socket.create_connection(("127.0.0.1", port), timeout=3) as s:
            s.sendall(os.urandom(4096)); s.settimeout(3)
            if not s.recv(1):
                raise ConnectionError("closed without answering")
    attempt(f"junk to port {port}", junk)
    def as_store():
        s = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=3))
        s.set("labutils/init_done/0", "1"); s.get("labutils/init_done/0")
    attempt(f"use port {port} as a store", as_store)
print(json.dumps(out), flush=True)
os._exit(0)  # threads stuck on a silent socket must not keep it alive
'''


@pytest.fixture(scope="module")
def intruder():
    with unix_users.throwaway_user("labiso") as user:
        why = unix_users.python_usable_by(user)
        if why:
            pytest.skip(why)
        yield user


def listening_ports(pids) -> list[int]:
    """TCP ports these processes (the owner's kernel, here the test, and its ranks) listen on."""
    ports = set()
    for pid in pids:
        try:
            for proc in [psutil.Process(pid)]:
                ports |= {c.laddr.port for c in proc.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}
        except psutil.Error:
            pass
    return sorted(ports)


def rank_pids() -> list[int]:
    return [p.pid for p in procs.leftover_ranks()]


def intrude(user) -> dict:
    pids = rank_pids()  # the owner's ranks (other users' ranks may run on this machine too)
    r = unix_users.run_as(user, [sys.executable, "-c", INTRUDER,
                                 json.dumps({"ports": listening_ports([os.getpid(), *pids]), "pids": pids})], timeout_s=120)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    return report


def assert_all_denied(report: dict, want_run_dirs: bool) -> None:
    found = report.pop("found")
    assert found["stores"] >= 1, "the intruder did not even find the rendezvous: the test tests nothing"
    assert found["ports"] >= 1, "no listening socket of the ranks found: the test tests nothing"
    assert (found["run_dirs"] >= 1) == want_run_dirs
    succeeded = [k for k, v in report.items() if v == "SUCCEEDED"]
    assert not succeeded, f"another user could: {succeeded}"
    assert any(k.startswith("join store") for k in report)


def _two_phase(rank, world_size, flags):
    """all_reduce, say it is up, wait for the go, all_reduce again: the intruder runs in between."""
    import torch
    import torch.distributed as dist
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    open(os.path.join(flags, f"up-{rank}"), "w").close()
    deadline = time.monotonic() + 100
    while not os.path.exists(os.path.join(flags, "go")) and time.monotonic() < deadline:
        time.sleep(0.05)
    u = torch.tensor([10.0 * (rank + 1)])
    dist.all_reduce(u)
    return t.item(), u.item()


def test_other_user_cannot_join_or_disturb_a_launch(intruder, tmp_path):
    result, error = [], []

    def owner():
        try:
            result.extend(labutils.launch(_two_phase, str(tmp_path), world_size=2, backend="gloo", timeout=110))
        except BaseException as exc:  # noqa: BLE001
            error.append(exc)

    th = threading.Thread(target=owner)
    th.start()
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"up-{r}").exists() for r in range(2)) and time.monotonic() < deadline and th.is_alive():
            time.sleep(0.05)
        assert th.is_alive() and all((tmp_path / f"up-{r}").exists() for r in range(2)), error
        report = intrude(intruder)
    finally:
        (tmp_path / "go").touch()
        th.join(120)
    assert not error, error
    assert result == [(3.0, 30.0), (3.0, 30.0)]
    assert_all_denied(report, want_run_dirs=True)


def _up(rank, world_size):
    import torch
    import torch.distributed as dist
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return t.item()


def test_other_user_cannot_join_or_disturb_a_pool(intruder):
    with labutils.RankPool(world_size=2, backend="gloo", timeout=60, output="quiet") as pool:
        assert pool.run(_up) == [3.0, 3.0]
        report = intrude(intruder)
        assert pool.run(_up) == [3.0, 3.0]  # the same ranks, undisturbed
    assert_all_denied(report, want_run_dirs=False)
    assert procs.leftover_ranks(wait_s=5) == []
