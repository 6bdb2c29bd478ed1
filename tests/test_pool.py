"""RankPool on real gloo ranks (CPU): contract of launch, persistent state, faults, security, cleanup.

Run: pytest tests/test_pool.py -q   (about a minute on 2 cores; most tests share one pool,
and the fault tests check that the pool restarts itself and stays usable.)
"""
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from multiprocessing.connection import AuthenticationError, Client

import cloudpickle
import psutil
import pytest
import torch

from labutils import LaunchConfigError, RankError, RankPool, RankTimeout
from labutils.pool import RanksInterrupted, protocol, task

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file


def all_reduce_sum(rank, world_size, offset=0.0):
    import torch.distributed as dist
    t = torch.tensor([rank + 1.0 + offset])
    dist.all_reduce(t)
    print(f"sum is {t.item():g}")
    return t


@pytest.fixture(autouse=True)
def short_graces(monkeypatch):
    """The fault rules' waits are seconds in a notebook; a fraction is enough to test them."""
    monkeypatch.setattr(task, "STRAGGLER_GRACE_S", 0.5)
    monkeypatch.setattr(task, "INTERRUPT_GRACE_S", 1.0)


@pytest.fixture(scope="module")
def pool():
    p = RankPool(world_size=2, backend="gloo", timeout=30)
    yield p
    p.close()


def _sigint_main_thread_after(delay_s):
    main = threading.main_thread().ident
    timer = threading.Timer(delay_s, signal.pthread_kill, args=(main, signal.SIGINT))
    timer.start()
    return timer


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


# ---- the contract of launch -----------------------------------------------------------------
def test_run_returns_rank_order_and_prefixed_output(pool, capsys):
    out = pool.run(all_reduce_sum, 1.0)
    torch.testing.assert_close(out, [torch.tensor([5.0]), torch.tensor([5.0])])
    assert capsys.readouterr().out == "[rank 0] sum is 5\n[rank 1] sum is 5\n"
    assert pool.run(all_reduce_sum, kwargs={"offset": 2.0}, output="quiet")[1].item() == 7.0
    assert capsys.readouterr().out == ""


def test_output_belongs_to_the_task_that_printed_it(pool, capsys):
    pool.run(lambda r, w: print("first", end=""))  # no newline: must not leak into the next task
    assert capsys.readouterr().out == "[rank 0] first\n[rank 1] first\n"
    pool.run(lambda r, w: print("second"), ranks=[1])
    assert capsys.readouterr().out == "[rank 1] second\n"


def test_live_output(pool, capsys):
    pool.run(lambda r, w: print(f"live {r}"), output="live")
    assert sorted(capsys.readouterr().out.splitlines()) == ["[rank 0] live 0", "[rank 1] live 1"]


# ---- persistent per-rank namespaces (what %%ranks uses) ------------------------------------
def test_exec_keeps_state_and_fetches(pool, capsys):
    pool.exec("x = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\ncount = 1")
    pool.exec("count += 1\nx * count")
    assert capsys.readouterr().out == "[rank 0] tensor([6.])\n[rank 1] tensor([6.])\n"
    assert pool.fetch("count") == [2, 2]
    assert pool.exec("y = rank * world_size", ranks=[1], fetch=["y"]) == [{"y": 2}]
    pool.push(scale=10)
    assert pool.exec("z = scale + rank", fetch="z") == [{"z": 10}, {"z": 11}]
    assert pool.fetch("device") == [torch.device("cpu")] * 2


def test_syntax_error_is_raised_before_sending(pool):
    tasks = pool.tasks_run
    with pytest.raises(SyntaxError):
        pool.exec("x = = 1")
    assert pool.tasks_run == tasks


def test_fetch_of_missing_name_is_an_error_and_pool_stays(pool):
    pids = pool.status().pids
    with pytest.raises(RankError, match=r"rank 0 raised NameError: cannot fetch \['nope'\]"):
        pool.fetch("nope")
    assert pool.status().pids == pids


# ---- faults ---------------------------------------------------------------------------------
def test_exception_in_one_rank_keeps_the_pool(pool, capsys):
    pool.exec("kept = 'yes'")
    pids = pool.status().pids

    def fail_on_1(rank, world_size):
        print("before")
        if rank == 1:
            raise ValueError("bad value on rank 1")
        return rank

    with pytest.raises(RankError) as e:
        pool.run(fail_on_1)
    assert e.value.rank == 1 and e.value.exc_type == "ValueError" and e.value.ranks == [1]
    assert "keeps running with its state" in str(e.value)
    assert 'raise ValueError("bad value on rank 1")' in e.value.traceback
    assert capsys.readouterr().out == "[rank 0] before\n[rank 1] before\n"
    assert pool.status().pids == pids and pool.fetch("kept") == ["yes", "yes"]


def test_exception_while_others_compute_interrupts_them_and_keeps_pool(pool):
    pids = pool.status().pids
    with pytest.raises(RankError, match=r"rank 1 raised ValueError.*ranks \[0\] were still running "
                                        r"and were interrupted; the pool keeps running") as e:
        pool.exec("import time\nif rank == 1: raise ValueError('x')\nwhile True: time.sleep(0.01)")
    assert e.value.ranks == [0, 1]
    assert pool.status().pids == pids


def test_exception_while_others_wait_in_collective_restarts(pool):
    pids = pool.status().pids
    restarts = pool.restarts
    with pytest.raises(RankError, match=r"rank 0 raised ValueError.*ranks \[1\] were still waiting.*"
                                        r"the pool was restarted"):
        pool.exec("if rank == 0: raise ValueError('x')\nt = torch.ones(1)\ndist.all_reduce(t)")
    assert pool.restarts == restarts + 1
    assert not set(pool.status().pids) & set(pids) and all(_gone(p) for p in pids)
    assert pool.run(all_reduce_sum, output="quiet")[0].item() == 3.0


def test_hang_raises_rank_timeout_and_restarts(pool, capsys):
    pids = pool.status().pids
    t0 = time.monotonic()
    with pytest.raises(RankTimeout, match=r"ranks \[0\] did not finish within 1.5 s.*restarted") as e:
        pool.exec("print('waiting')\nif rank == 0:\n    dist.all_reduce(torch.ones(1))", timeout=1.5)
    assert e.value.ranks == [0] and time.monotonic() - t0 < 30
    assert capsys.readouterr().out == "[rank 0] waiting\n[rank 1] waiting\n"
    assert all(_gone(p) for p in pids)
    # the error came back at once: the fresh ranks start in the background, the next task waits
    status = pool.status()
    assert status.starting and status.running and "starting" in str(status) and pool.start_s == 0.0
    assert pool.run(all_reduce_sum, output="quiet")[1].item() == 3.0
    assert not pool.status().starting and pool.start_s > 0


def test_rank_dying_in_a_task_restarts(pool, capsys):
    pids = pool.status().pids
    with pytest.raises(RankError, match=r"rank 1 exited with code 3 .*restarted") as e:
        pool.run(lambda r, w: (print("bye"), os._exit(3)) if r == 1 else r, output="live")
    assert e.value.exit_code == 3 and e.value.traceback == "bye"  # its last words
    assert capsys.readouterr().out == "[rank 1] bye\n"
    assert all(_gone(p) for p in pids)
    assert pool.run(lambda r, w: r, output="quiet") == [0, 1]


def test_rank_dying_while_idle_is_detected(pool):
    pids = pool.status().pids
    os.kill(pids[0], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not pool.status().dead and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pool.status().dead == {0: -9}
    with pytest.raises(RankError, match=r"rank 0 was killed by SIGKILL.*died while the pool was idle"):
        pool.run(lambda r, w: r)
    assert pool.status().dead == {} and pool.run(lambda r, w: r, output="quiet") == [0, 1]


def test_keyboard_interrupt_stops_python_code_and_keeps_pool(pool, capsys):
    pool.exec("still_here = True")
    pids = pool.status().pids
    _sigint_main_thread_after(0.5)
    with pytest.raises(KeyboardInterrupt) as e:  # a RanksInterrupted: still a KeyboardInterrupt
        pool.exec("import time\nprint('sleeping')\ntime.sleep(60)")
    assert isinstance(e.value, RanksInterrupted) and e.value.ranks == [0, 1] and e.value.stuck == []
    assert str(e.value).startswith("interrupted while ranks [0, 1] ran a task; they stopped it and the "
                                   "pool keeps running with its state. HINT: ")
    assert e.value._render_traceback_() == [f"\x1b[31mRanksInterrupted\x1b[0m: {e.value}"]  # no frames
    captured = capsys.readouterr()
    assert captured.out == "[rank 0] sleeping\n[rank 1] sleeping\n" and captured.err == ""
    assert pool.status().pids == pids and pool.fetch("still_here") == [True, True]


def test_keyboard_interrupt_in_stuck_collective_restarts(pool, capsys):
    pids = pool.status().pids
    _sigint_main_thread_after(0.5)
    with pytest.raises(RanksInterrupted, match=r"ranks \[0\] did not stop .* the pool was restarted") as e:
        pool.exec("if rank == 0:\n    dist.all_reduce(torch.ones(1))")
    assert e.value.stuck == [0] and "HINT: a collective that not every rank calls" in str(e.value)
    assert all(_gone(p) for p in pids)
    assert pool.run(lambda r, w: r, output="quiet") == [0, 1]


def test_unpicklable_things(pool):
    import threading as th
    with pytest.raises(LaunchConfigError, match="cannot be sent to the ranks"):
        pool.run(lambda r, w, lock: r, th.Lock())
    pids = pool.status().pids
    with pytest.raises(RankError, match="return value could not be pickled"):
        pool.run(lambda r, w: th.Lock())
    assert pool.status().pids == pids


@pytest.mark.parametrize("kwargs, match", [
    ({"ranks": [2]}, "ranks must be ranks of this pool"),
    ({"ranks": []}, "ranks must be ranks of this pool"),
    ({"timeout": 0}, "timeout must be a positive number"),
    ({"output": "loud"}, "output must be one of"),
])
def test_bad_task_arguments(pool, kwargs, match):
    with pytest.raises(LaunchConfigError, match=match):
        pool.run(lambda r, w: r, **kwargs)


def test_bad_pool_arguments():
    with pytest.raises(LaunchConfigError, match="world_size must be >= 1"):
        RankPool(world_size=0)
    if torch.cuda.is_available():
        with pytest.raises(LaunchConfigError, match="needs 99 GPUs"):
            RankPool(backend="nccl", world_size=99)
    else:
        with pytest.raises(LaunchConfigError, match="needs CUDA GPUs"):
            RankPool(backend="nccl")
    with pytest.raises(LaunchConfigError, match="timeout must be"):
        RankPool(timeout=-1)


def test_start_in_the_background_and_close_while_fresh_ranks_start(no_leaks):
    with RankPool(world_size=1, backend="gloo", timeout=30, output="quiet", wait=False) as p:
        assert p.status().starting and p.start_s == 0.0  # returned at once
        assert p.run(lambda r, w: r + 10) == [10] and p.start_s > 0  # the first task waited
        with pytest.raises(RankTimeout, match="restarted"):
            p.exec("import time\ntime.sleep(30)", timeout=0.5)
        assert p.status().starting
        t0 = time.monotonic()
    assert p.closed and time.monotonic() - t0 < 2.0  # killed, not asked to stop: they could not hear it


def test_start_failures_raise_and_leave_nothing(no_leaks):
    with pytest.raises(RankTimeout, match=r"ranks \[0\] did not finish within 0.05 s.*start_timeout"):
        RankPool(world_size=1, backend="gloo", start_timeout=0.05)
    with pytest.raises(RankError, match=r"rank 0 raised .*could not start"):
        RankPool(world_size=1, backend="gloo", env={"GLOO_SOCKET_IFNAME": "no-such-if0"})
    with RankPool(world_size=1, backend="gloo", env={"GLOO_SOCKET_IFNAME": "no-such-if0"}, wait=False) as p:
        with pytest.raises(RankError, match=r"rank 0 raised .*could not start"):  # at the first task
            p.run(lambda r, w: r)
        assert not p.status().running


# ---- security and cleanup --------------------------------------------------------------------
def test_control_server_refuses_peers_without_the_token(monkeypatch):
    monkeypatch.setattr(protocol, "HANDSHAKE_S", 0.5)
    token = protocol.new_token()
    server = protocol.ControlServer(token)
    assert server.address[0] == "127.0.0.1"
    errors = []

    def wrong_key():
        try:
            Client(server.address, authkey=b"not the token")
        except AuthenticationError as exc:
            errors.append(exc)

    th = threading.Thread(target=wrong_key)
    th.start()
    assert server.accept(5) is None and server.refused == 1
    th.join(5)
    assert len(errors) == 1
    with socket.create_connection(server.address) as s:  # a peer that speaks no protocol
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert server.accept(5) is None
    with socket.create_connection(server.address):        # a peer that says nothing
        t0 = time.monotonic()
        assert server.accept(5) is None and time.monotonic() - t0 < 3
    assert server.refused == 3
    got = []
    th = threading.Thread(target=lambda: got.append(protocol.connect(server.address, token)))
    th.start()
    conn = server.accept(5)
    th.join(5)
    conn.send_bytes(b"ping")
    assert got[0].recv_bytes() == b"ping"
    conn.close()
    got[0].close()
    server.close()
    server.close()


def test_lifecycle_loopback_only_token_hidden_no_leaks(monkeypatch, no_leaks):
    token = protocol.new_token()
    monkeypatch.setattr(protocol, "new_token", lambda: token)
    with RankPool(world_size=2, backend="gloo") as p:
        pids = p.status().pids
        for proc in [psutil.Process(), *map(psutil.Process, pids)]:
            listening = [c.laddr for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN]
            assert all(a.ip == "127.0.0.1" for a in listening), listening
            if proc.pid in pids:
                assert token.hex() not in " ".join(proc.cmdline())
                assert token.hex() not in " ".join(proc.environ().values())
        assert repr(p) == "<RankPool running: 2 ranks, backend gloo>"
    assert p.closed and not p.status().running and all(_gone(x) for x in pids)
    p.close()  # idempotent
    with pytest.raises(LaunchConfigError, match="closed"):
        p.run(lambda r, w: r)


SCRIPT = """
import os, sys, time, labutils
pool = labutils.RankPool(world_size=1, backend="gloo")
print(*pool.status().pids, flush=True)
if sys.argv[1] == "hang":
    time.sleep(60)
"""


@pytest.mark.parametrize("how", ["exit", "kill -9"])
def test_no_rank_outlives_the_notebook(how):
    """Interpreter exit runs the finalizer; a SIGKILLed parent is noticed by the ranks."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(SCRIPT),
                             "hang" if how == "kill -9" else "exit"], stdout=subprocess.PIPE, text=True)
    pids = [int(x) for x in proc.stdout.readline().split()]
    assert len(pids) == 1
    if how == "kill -9":
        proc.kill()
    proc.wait(30)
    deadline = time.monotonic() + 10
    while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert all(_gone(p) for p in pids)


# ---- pure parts -------------------------------------------------------------------------------
def test_output_splitter_lines_marks_and_partial_lines():
    s = protocol.OutputSplitter()
    assert s.feed(0, b"he") == []
    assert s.feed(0, b"llo\nno newline" + protocol.end_marker(7) + b"next") == [
        ("line", 0, "hello\n"), ("line", 0, "no newline\n"), ("end", 0, 7)]
    assert s.feed(1, protocol.end_marker(8)) == [("end", 1, 8)]
    assert s.flush(0) == [("line", 0, "next\n")] and s.flush(0) == []
    assert s.feed(0, protocol.END_MARK + b"junk\n")[0][0] == "line"


def test_pack_roundtrip_and_token():
    assert protocol.unpack(protocol.pack("call", 3, b"x")) == ("call", 3, b"x")
    t = protocol.new_token()
    assert len(t) == 32 and t != protocol.new_token()
    assert re.fullmatch(rb"\x1elabutils-task-end:12\n", protocol.end_marker(12))
