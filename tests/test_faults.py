"""Fault injection for ``labutils.launch``: every classic way a rank can fail, on real gloo ranks.

Each scenario asserts (1) a clear error naming the rank(s) that caused it, (2) a bounded time to
that error, and (3) that the calling process -- the notebook kernel -- is as healthy as before:
no thread, file descriptor, child process, listening socket or run directory left behind (the
``healthy`` fixture); the last tests launch 50 more times and check nothing grows.

    pytest tests/test_faults.py -v --durations=0     # about 2 minutes on 2 CPU cores

The NCCL-only cases (GPU out of memory, CPU tensor on NCCL, the NCCL watchdog) are in
tests/gpu/test_faults_nccl.py.
"""
from __future__ import annotations

import _thread
import os
import socket
import subprocess
import sys
import threading
import time
import types

import cloudpickle
import psutil
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils import LaunchConfigError, RankError, RankTimeout, debugging
from faults_helpers import Health, Stopwatch, healthy, processes_with  # noqa: F401 - fixture

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks get these functions by value

HANG_S = 10      # launch timeout for the hang scenarios (process start included)
FAST_S = 30      # an error must arrive well before this (the launch timeout is 120 s)


def _noop(rank, world_size):
    return rank


# ---------------------------------------------------------------------------------------------
# 1. Exceptions

def _raise_on_last(rank, world_size):
    t = torch.ones(1)
    if rank == world_size - 1:
        raise ValueError(f"bad value on rank {rank}")
    dist.all_reduce(t)  # the others wait here; gloo then fails them with "Connection closed"


def test_exception_in_one_rank_names_it_not_its_peers(healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_raise_on_last, world_size=3, backend="gloo", timeout=120)
    e = info.value
    assert (e.rank, e.exc_type) == (2, "ValueError")
    assert str(e).startswith("rank 2 raised ValueError: bad value on rank 2. HINT:")
    assert "Connection" not in str(e)  # the peers' "Connection closed by peer" is a consequence
    assert 'raise ValueError(f"bad value on rank {rank}")' in e.traceback
    assert sw.s < FAST_S


def _raise_everywhere(rank, world_size):
    raise RuntimeError(f"broken on rank {rank}")


def test_exception_in_all_ranks_names_the_lowest_and_lists_the_others(healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_raise_everywhere, world_size=2, backend="gloo", timeout=120)
    assert info.value.rank == 0 and info.value.ranks == [0, 1]
    assert str(info.value).startswith("rank 0 raised RuntimeError: broken on rank 0 (ranks [1] failed too).")
    assert sw.s < FAST_S


def _exit_with(rank, world_size, how):
    if rank == 1:
        if how == "sys.exit":
            sys.exit(3)
        if how == "os._exit":
            os._exit(0)
        if how == "SIGKILL":
            os.kill(os.getpid(), 9)
        if how == "KeyboardInterrupt":
            raise KeyboardInterrupt
    dist.barrier()


@pytest.mark.parametrize("how, message", [
    ("sys.exit", "rank 1 raised SystemExit: sys.exit(3) was called. HINT: return from the function"),
    ("os._exit", "rank 1 exited with code 0 before returning a result. HINT: the rank exited"),
    ("SIGKILL", "rank 1 was killed by SIGKILL before returning a result. HINT: SIGKILL comes from outside"),
    ("KeyboardInterrupt", "rank 1 raised KeyboardInterrupt. HINT:"),
])
def test_rank_that_exits_or_is_killed(how, message, healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_exit_with, how, world_size=2, backend="gloo", timeout=120)
    assert str(info.value).startswith(message), str(info.value)
    assert info.value.rank == 1  # never rank 0, whose barrier only lost its peer
    assert sw.s < FAST_S


def _allocate_too_much(rank, world_size):
    if rank == 0:
        torch.empty(2 ** 48, dtype=torch.uint8)  # 256 TiB: more than any address space allows
    dist.barrier()


def test_out_of_memory_in_a_rank(healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_allocate_too_much, world_size=2, backend="gloo", timeout=120)
    e = info.value
    assert e.rank == 0 and "can't allocate memory" in e.remote_message
    assert "ran out of memory" in str(e)
    assert sw.s < FAST_S


# ---------------------------------------------------------------------------------------------
# 2. Hangs and mismatches: RankTimeout says who waits where, the flight recorder says on what

def _mismatched_order(rank, world_size):
    a = torch.ones(4)
    dist.all_reduce(a)
    if rank == 0:
        dist.all_reduce(a)
    else:
        dist.broadcast(a, src=0)


def test_mismatched_collectives_hang_and_say_where(healthy):
    with Stopwatch() as sw, pytest.raises(RankTimeout) as info:
        labutils.launch(_mismatched_order, world_size=2, backend="gloo", timeout=HANG_S)
    e = info.value
    assert e.ranks == [0, 1] and e.finished == []
    assert "are all waiting inside torch.distributed" in str(e)
    assert e.where[0].endswith("dist.all_reduce(a) (inside torch.distributed)")
    assert e.where[1].endswith("dist.broadcast(a, src=0) (inside torch.distributed)")
    assert "test_faults.py" in e.where[0]
    if e.flight:  # torch >= 2.8 records gloo collectives too
        assert debugging.first_divergence(e.flight) == (
            "collective #2: rank 0 called all_reduce([4], Float); rank 1 called broadcast([4], Float)")
    assert HANG_S <= sw.s < HANG_S + 10


def _returns_early(rank, world_size):
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(t)  # rank 1 has returned: this never completes
    return t


def test_rank_that_returns_early_leaves_the_others_waiting(healthy):
    with Stopwatch() as sw, pytest.raises(RankTimeout) as info:
        labutils.launch(_returns_early, world_size=2, backend="gloo", timeout=HANG_S)
    e = info.value
    assert e.ranks == [0] and e.finished == [1]
    assert str(e) == (f"ranks [0] did not finish within {HANG_S} s. HINT: ranks [1] returned while "
                      "ranks [0] were still running: a collective that not every rank calls never returns.")
    assert e.where[1] == "returned; waiting for the other ranks"
    if e.flight:
        assert debugging.first_divergence(e.flight).startswith(
            "collective #2: rank 0 called all_reduce([4], Float); rank 1 never did (its last was #1)")
    assert HANG_S <= sw.s < HANG_S + 10


def _shapes(rank, world_size, sizes):
    t = torch.ones(sizes[rank])
    dist.all_reduce(t)
    return t


def test_mismatched_shapes_crash_gloo_with_a_size_error(healthy):
    # gloo's real behaviour with [4] vs [5]: the rank with the smaller buffer receives too much
    # and gloo aborts it (SIGABRT) from a background thread; the error quotes gloo's last words.
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_shapes, [4, 5], world_size=2, backend="gloo", timeout=HANG_S)
    e = info.value
    assert e.rank == 0 and e.exit_code == -6
    assert str(e).startswith("rank 0 was killed by SIGABRT before returning a result ([enforce fail")
    assert "Received data size doesn't match expected size" in e.detail
    assert "called different collectives, or the same one with different shapes" in str(e)
    assert sw.s < HANG_S  # an error, not the timeout


def test_mismatched_shapes_of_one_element_hang_gloo(healthy):
    # ... while [1] vs [2] hangs: the same mistake, two behaviours. Only a timeout catches both.
    with Stopwatch() as sw, pytest.raises(RankTimeout) as info:
        labutils.launch(_shapes, [1, 2], world_size=2, backend="gloo", timeout=HANG_S)
    assert info.value.ranks == [0, 1]
    assert HANG_S <= sw.s < HANG_S + 10


def test_mismatched_shapes_are_named_by_torch_distributed_debug_detail(healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_shapes, [4, 5], world_size=2, backend="gloo", timeout=120,
                        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    e = info.value
    assert e.rank == 0 and e.exc_type == "RuntimeError"
    assert "Detected mismatch between collectives" in e.remote_message
    assert "TensorShape=[4]" in e.remote_message and "TensorShape=[5]" in e.remote_message
    assert "TORCH_DISTRIBUTED_DEBUG=DETAIL names both sides" in str(e)
    assert sw.s < FAST_S


# ---------------------------------------------------------------------------------------------
# 3. What cannot travel between the notebook and the ranks

_LOCK = threading.Lock()


def _uses_a_global_lock(rank, world_size):
    with _LOCK:
        return rank


def test_unpicklable_function_argument_or_keyword_is_named(healthy):
    with pytest.raises(LaunchConfigError, match=r"^the function \(through a global or closure"):
        labutils.launch(_uses_a_global_lock, world_size=2, backend="gloo")
    with pytest.raises(LaunchConfigError, match=r"^argument 2 \(lock\) cannot be sent to the ranks"):
        labutils.launch(lambda r, n, a, b: r, 1, threading.Lock(), world_size=2, backend="gloo")
    with pytest.raises(LaunchConfigError, match=r"^keyword argument 'x' \(generator\)"):
        labutils.launch(lambda r, n, x: r, kwargs={"x": (i for i in range(3))}, world_size=2)


def _returns_a_lock(rank, world_size):
    return threading.Lock()


def test_unpicklable_return_value(healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_returns_a_lock, world_size=2, backend="gloo", timeout=120)
    assert str(info.value).startswith("rank 0 raised TypeError: its return value could not be pickled")
    assert "return tensors, numbers, strings" in str(info.value)
    assert sw.s < FAST_S


def test_function_the_ranks_cannot_import(healthy):
    phantom = types.ModuleType("phantom_module_only_in_this_process")
    exec("def fn(rank, world_size):\n    return rank\n", phantom.__dict__)
    sys.modules[phantom.__name__] = phantom  # importable here only: pickled by reference
    try:
        with pytest.raises(RankError) as info:
            labutils.launch(phantom.fn, world_size=2, backend="gloo", timeout=120)
    finally:
        del sys.modules[phantom.__name__]
    assert str(info.value).startswith(
        "rank 0 raised ModuleNotFoundError: the function or its arguments could not be loaded in the rank")
    assert "must be importable by the ranks" in str(info.value)


def _big(rank, world_size, n):
    return torch.full((n,), float(rank))


def test_very_large_return_values_come_back_and_go_away(healthy):
    n = 32 * 2 ** 20  # 128 MiB per rank
    rss0 = psutil.Process().memory_info().rss
    out = labutils.launch(_big, n, world_size=2, backend="gloo", timeout=120)
    assert [t.shape[0] for t in out] == [n, n] and out[1][-1].item() == 1.0
    del out
    assert psutil.Process().memory_info().rss - rss0 < 100 * 2 ** 20


def test_notebook_cell_functions_keep_their_source_lines(healthy):
    # A function typed in a notebook cell is sent by value; its traceback must still show the
    # cell's lines (cloudpickle renames such code "<dynamic-code>"; labutils puts the name back).
    import linecache
    cell = "/tmp/ipykernel_0/fake_cell_1.py"
    src = "def from_a_cell(rank, world_size):\n    raise ValueError('typed in a cell')\n"
    linecache.cache[cell] = (len(src), None, src.splitlines(True), cell)
    ns = {"__name__": "__main__"}
    exec(compile(src, cell, "exec"), ns)
    with pytest.raises(RankError) as info:
        labutils.launch(ns["from_a_cell"], world_size=1, backend="gloo", init="none", timeout=120)
    assert f'File "{cell}", line 2, in from_a_cell' in info.value.traceback
    assert "raise ValueError('typed in a cell')" in info.value.traceback


# ---------------------------------------------------------------------------------------------
# 4. Configuration, ports, processes

@pytest.mark.parametrize("world_size", [0, -1, 2.0, True, "2"])
def test_bad_world_size_is_refused_before_anything_starts(world_size, healthy):
    with pytest.raises(LaunchConfigError, match=r"world_size must be"):
        labutils.launch(_noop, world_size=world_size)


def test_nccl_without_enough_gpus_is_refused(healthy):
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    match = "needs CUDA GPUs" if n == 0 else f"needs {n + 1} GPUs"
    with pytest.raises(LaunchConfigError, match=match):
        labutils.launch(_noop, world_size=max(n + 1, 2), backend="nccl")


def test_world_size_beyond_the_machine_is_refused_at_once(healthy, monkeypatch):
    monkeypatch.delenv("LABUTILS_MAX_CPU_RANKS", raising=False)
    for start in (lambda: labutils.launch(_noop, world_size=10**6, backend="gloo"),
                  lambda: labutils.launch(_noop, world_size=10**6),
                  lambda: labutils.RankPool(world_size=10**6, backend="gloo")):
        with Stopwatch() as clock, pytest.raises(LaunchConfigError, match=r"world_size=1000000: 1000000 gloo ranks "
                                                 r"are more than this machine can hold, at most \d+ .*HINT.*LABUTILS_MAX_CPU_RANKS"):
            start()
        assert clock.s < 1.0, f"refused after {clock.s:.2f} s"


# A launcher (a process of its own, like a notebook's kernel) starts ranks that start slowly: a
# sitecustomize delays each by 0.25 s x its rank before labutils runs, so when the launcher is killed
# some ranks are importing torch and most have not begun -- they start after their launcher died.
LAUNCHER = """
import os, sys, time, labutils
def rank_fn(rank, world_size):
    return rank
how, n, slow, root = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
env = {"PYTHONPATH": os.pathsep.join([slow, root, os.environ.get("PYTHONPATH", "")])}
if how == "launch":
    labutils.launch(rank_fn, world_size=n, backend="gloo", timeout=120, output="quiet", env=env)
else:
    pool = labutils.RankPool(n, "gloo", output="quiet", env=env, wait=False)
    time.sleep(120)
"""
SLOW_START = """
import os, time
if "LABUTILS_RANK" in os.environ:
    time.sleep(0.25 * int(os.environ["LABUTILS_RANK"]))
"""


@pytest.mark.parametrize("how, n", [("launch", 12), ("pool", 6)])
def test_ranks_of_a_killed_launcher_leave_nothing_behind(how, n, tmp_path):
    (tmp_path / "slow").mkdir()
    (tmp_path / "slow" / "sitecustomize.py").write_text(SLOW_START)
    runs = tmp_path / "runs"  # the launcher's TMPDIR: a launch's run directory lies here
    runs.mkdir()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "TMPDIR": str(runs), "LABUTILS_MAX_CPU_RANKS": str(n)}
    launcher = psutil.Popen([sys.executable, "-c", LAUNCHER, how, str(n), str(tmp_path / "slow"), root],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while len(labutils.procs.leftover_ranks(launcher=launcher.pid)) < n:
            assert launcher.poll() is None, launcher.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the launcher did not start its ranks"
            time.sleep(0.05)
        time.sleep(0.5)  # the first ranks are past their parent check, importing torch
    finally:
        launcher.kill()
        launcher.wait()
    t0 = time.monotonic()
    left, folders = None, None
    while time.monotonic() - t0 < 30:
        left = labutils.procs.leftover_ranks(launcher=launcher.pid)
        folders = list(runs.iterdir())
        if not left and not folders:
            break
        time.sleep(0.1)
    assert not left, f"ranks left {time.monotonic() - t0:.0f} s after their launcher was killed: {[p.pid for p in left]}"
    assert not folders, f"run directory left: {folders}"


def _sum(rank, world_size):
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    return t.item()


def test_busy_ports_do_not_matter(healthy, monkeypatch):
    # launch() asks the OS for a free port each time: taken ports, and a MASTER_PORT in the
    # notebook's environment that points at one of them, change nothing.
    squatters = []
    try:
        for _ in range(64):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            s.listen()
            squatters.append(s)
        monkeypatch.setenv("MASTER_PORT", str(squatters[0].getsockname()[1]))
        assert labutils.launch(_sum, world_size=2, backend="gloo", timeout=120) == [3.0, 3.0]
        assert labutils.launch(_own_rendezvous, world_size=2, backend="gloo", init="none") == [3.0, 3.0]
    finally:
        for s in squatters:
            s.close()


def _own_rendezvous(rank, world_size, url="env://"):
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world_size)
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item()


def test_hard_coded_port_that_is_taken(healthy):
    # The source tutorial's init_method='tcp://localhost:23456': here that port is taken.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        url = f"tcp://127.0.0.1:{squatter.getsockname()[1]}"
        with Stopwatch() as sw, pytest.raises(RankError) as info:
            labutils.launch(_own_rendezvous, url, world_size=2, backend="gloo", init="none", timeout=120)
    e = info.value
    assert e.rank == 0 and e.exc_type == "DistNetworkError" and "EADDRINUSE" in e.remote_message
    assert "that port is taken" in str(e) and "Don't hard-code ports" in str(e)
    assert sw.s < FAST_S  # rank 1, stuck connecting to the squatter, was killed


def _sleeps_forever(rank, world_size, flag):
    open(f"{flag}.{rank}", "w").close()
    time.sleep(3600)


def test_keyboard_interrupt_kills_every_rank(healthy, tmp_path, capsys):
    flag = str(tmp_path / "started")
    sent = []

    def interrupt_when_started():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(os.path.exists(f"{flag}.{r}") for r in (0, 1)):
            time.sleep(0.05)
        sent.append(time.monotonic())
        _thread.interrupt_main()  # what Jupyter's "interrupt kernel" does to a running cell

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with Stopwatch() as sw, pytest.raises(KeyboardInterrupt):
        labutils.launch(_sleeps_forever, flag, world_size=2, backend="gloo", timeout=120)
    ranks_left = [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    assert ranks_left == []  # gone before the KeyboardInterrupt reached us
    err = capsys.readouterr().err
    assert "labutils: interrupted; ranks [0, 1] were killed." in err
    assert "time.sleep(3600)" in err  # ... and where each rank was
    assert sw.s < FAST_S and time.monotonic() - sent[0] < 5  # ranks gone within seconds


def _leaves_a_daemon(rank, world_size, marker):
    import subprocess
    subprocess.Popen(f"sleep {marker} &", shell=True)  # double fork: re-parented to init
    time.sleep(0.5)
    raise RuntimeError("leaving a daemon behind")


def test_grandchildren_that_outlive_their_rank_are_killed(healthy):
    marker = f"{3000 + os.getpid() % 1000}.{time.time_ns() % 10 ** 6:06d}"  # unique sleep seconds
    with pytest.raises(RankError, match="leaving a daemon behind"):
        labutils.launch(_leaves_a_daemon, marker, world_size=1, backend="gloo", init="none", timeout=120)
    time.sleep(0.2)
    assert not processes_with(f"sleep {marker}")


def _chatty(rank, world_size, n):
    for i in range(n):
        print(f"line {i}")
    return n


def test_a_wall_of_output_is_kept_bounded(healthy, capsys):
    with Stopwatch() as sw:
        assert labutils.launch(_chatty, 50_000, world_size=1, backend="gloo", init="none") == [50_000]
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[rank 0] line 0" and out[-1] == "[rank 0] line 49999"
    assert "[rank 0] ... 47500 lines not shown" in out[2000]
    assert len(out) == 2000 + 1 + 500
    assert sw.s < FAST_S


# ---------------------------------------------------------------------------------------------
# 5. After all that: still healthy, and 50 launches in a row grow nothing

def test_fifty_launches_in_a_row_grow_nothing(healthy):
    me = psutil.Process()
    for i in range(5):  # warm up allocator pools and lazy imports
        labutils.launch(_noop, world_size=2, backend="gloo", init="none", output="quiet")
    before = Health.snapshot()
    rss0 = me.memory_info().rss
    for i in range(50):
        if i % 10 == 0:  # every tenth: a real gloo process group with a collective
            assert labutils.launch(_sum, world_size=2, backend="gloo", output="quiet") == [3.0, 3.0]
        else:
            assert labutils.launch(_noop, world_size=2, backend="gloo", init="none",
                                   output="quiet") == [0, 1]
    before.check()
    growth_mib = (me.memory_info().rss - rss0) / 2 ** 20
    assert growth_mib < 20, f"RSS grew by {growth_mib:.1f} MiB over 50 launches"


# ---------------------------------------------------------------------------------------------
# 6. Reading what failing ranks leave behind (pure functions: no ranks needed)

# SYNTHETIC: written in the line formats of NCCL 2.2x's INFO output (as relayed by labutils with
# "[rank r] " prefixes) to pin the parser; it is not a measurement. The real 2xH200 log is
# notebooks/recorded/05_nccl_debug_info.json, parsed by the test after this one when it exists.
NCCL_LOG = """\
[rank 0] node:11:11 [0] NCCL INFO Bootstrap: Using lo:127.0.0.1<0>
[rank 0] node:11:11 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
[rank 1] node:12:12 [1] NCCL INFO Bootstrap: Using lo:127.0.0.1<0>
[rank 0] node:11:30 [0] NCCL INFO Using network Socket
[rank 0] node:11:30 [0] NCCL INFO ncclCommInitRankConfig comm 0x55aa rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0x77 - Init START
[rank 1] node:12:31 [1] NCCL INFO ncclCommInitRankConfig comm 0x55bb rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 2a000 commId 0x77 - Init START
[rank 0] node:11:30 [0] NCCL INFO comm 0x55aa rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
[rank 0] node:11:30 [0] NCCL INFO === System : maxBw 370.8 totalBw 370.8 ===
[rank 0] node:11:30 [0] NCCL INFO CPU/0-0 (1/2/-1)
[rank 0] node:11:30 [0] NCCL INFO + PCI[48.0] - GPU/0-18000 (0)
[rank 0] node:11:30 [0] NCCL INFO               + NVL[370.8] - GPU/0-2a000
[rank 0] node:11:30 [0] NCCL INFO Channel 00/04 :    0   1
[rank 0] node:11:30 [0] NCCL INFO Channel 01/04 :    0   1
[rank 0] node:11:30 [0] NCCL INFO Channel 02/04 :    0   1
[rank 0] node:11:30 [0] NCCL INFO Channel 03/04 :    0   1
[rank 0] node:11:30 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1
[rank 0] node:11:30 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
[rank 0] node:11:30 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
[rank 1] node:12:31 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read
[rank 1] node:12:31 [1] NCCL INFO Channel 01/0 : 1[1] -> 0[0] via P2P/CUMEM/read
[rank 0] node:11:30 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1
[rank 0] node:11:30 [0] NCCL INFO 4 coll channels, 4 collnet channels, 0 nvls channels, 8 p2p channels, 8 p2p channels per peer
[rank 0] node:11:30 [0] NCCL INFO ncclCommInitRankConfig comm 0x55aa rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 18000 commId 0x77 - Init COMPLETE
[rank 1] node:12:31 [1] NCCL INFO ncclCommInitRankConfig comm 0x55bb rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 2a000 commId 0x77 - Init COMPLETE
[rank 0] node:11:11 [0] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f01 recvbuff 0x7f01 count 262144 datatype 7 op 0 root 0 comm 0x55aa [nranks=2] stream 0x99
[rank 1] node:12:12 [1] NCCL INFO AllReduce: opCount 0 sendbuff 0x7f02 recvbuff 0x7f02 count 262144 datatype 7 op 0 root 0 comm 0x55bb [nranks=2] stream 0x98
[rank 0] node:11:11 [0] NCCL INFO Broadcast: opCount 1 sendbuff 0x7f01 recvbuff 0x7f01 count 262144 datatype 7 op 0 root 0 comm 0x55aa [nranks=2] stream 0x99
[rank 0] some unrelated line the rank printed
"""


def test_nccl_log_parser_on_the_line_formats():
    log = debugging.parse_nccl_log(NCCL_LOG)
    assert log.version == "2.28.9+cuda13.0" and log.nranks == 2
    assert log.bootstrap == "lo:127.0.0.1<0>" and log.network == "Socket"
    assert log.rings == {0: [0, 1], 1: [0, 1], 2: [0, 1], 3: [0, 1]}
    assert log.transports == {"P2P/CUMEM/read": 4}
    assert {(c.rank, c.channel, c.src, c.dst) for c in log.connections} == {
        (0, 0, 0, 1), (0, 1, 0, 1), (1, 0, 1, 0), (1, 1, 1, 0)}
    assert log.channels == {"coll": 4, "nvls": 0, "p2p": 8, "p2p_per_peer": 8}
    assert ("NVL", 370.8, "GPU/0-2a000") in log.links
    assert log.devices == {0: "cuda:0 busId 18000", 1: "cuda:1 busId 2a000"}
    assert log.collectives == [(0, "AllReduce", 262144), (1, "AllReduce", 262144), (0, "Broadcast", 262144)]
    text = debugging.summarize_nccl(log)
    assert "rings: 4 channels; ring order(s): 0 -> 1 -> 0 (x4)" in text
    assert "4 channel connections via P2P/CUMEM/read: GPU to GPU directly (NVLink" in text
    assert "collective calls logged: rank 0: 2, rank 1: 1" in text
    assert debugging.parse_nccl_log("no nccl here\n").rings == {}


def test_nccl_log_parser_on_the_recorded_2xh200_log():
    from labutils import recorded
    try:
        m = recorded.load("05_nccl_debug_info")
    except FileNotFoundError:
        pytest.skip("notebooks/recorded/05_nccl_debug_info.json is made by lab 05's 2xH200 run")
    log = debugging.parse_nccl_log(m.data["log"])
    assert log.version and log.nranks >= 2 and log.rings and log.connections
    assert all(t.startswith("P2P") for t in log.transports), log.transports  # NV18: NVLink P2P
    assert {r for r, _, _ in log.collectives} == set(range(log.nranks))


def _rec(*calls):
    return {"entries": [{"seq": i + 1, "op": op, "sizes": [[n]] if n else [], "dtypes": ["Float"] if n else [],
                         "state": "scheduled", "pg": "0", "p2p": False} for i, (op, n) in enumerate(calls)],
            "pg_status": {}}


def test_first_divergence_names_the_collective_and_the_ranks():
    same = _rec(("all_reduce", 4), ("all_reduce", 4))
    assert debugging.first_divergence({0: same, 1: same}) == (
        "the ranks' flight records agree: 2 collectives, the same on every rank")
    extra = _rec(("all_reduce", 4), ("barrier", 0))
    assert debugging.first_divergence({0: extra, 1: _rec(("all_reduce", 4)), 2: _rec(("all_reduce", 4))}) == (
        "collective #2: rank 0 called barrier; ranks [1, 2] never did (their last was #1)")
    other = _rec(("all_reduce", 4), ("broadcast", 5))
    assert debugging.first_divergence({0: same, 1: other}) == (
        "collective #2: rank 0 called all_reduce([4], Float); rank 1 called broadcast([5], Float)")
    assert debugging.first_divergence({0: same, 1: None}).startswith("no flight records to compare")
    assert debugging.describe_flight(extra) == ["#1 all_reduce([4], Float): scheduled", "#2 barrier: scheduled"]
    assert debugging.op_name("nccl:all_reduce_barrier") == "barrier"
    assert debugging.op_name("gloo:allreduce") == debugging.op_name("nccl:all_reduce") == "all_reduce"


def test_flight_dumps_are_read_back(tmp_path):
    import pickle
    doc = {"entries": [{"collective_seq_id": 1, "p2p_seq_id": 0, "is_p2p": False, "profiling_name":
                        "nccl:all_reduce", "input_sizes": [[4]], "input_dtypes": ["Float"], "state": "completed",
                        "process_group": ("0", "default_pg")}], "pg_status": {"0": {}}}
    (tmp_path / "rank_0").write_bytes(pickle.dumps(doc))
    (tmp_path / "rank_1").write_bytes(b"half-written")
    (tmp_path / "rank_notes").write_text("ignored")
    got = debugging.read_flight_dumps(str(tmp_path / "rank_"))
    assert list(got) == [0] and got[0]["entries"][0]["op"] == "all_reduce"
    assert got[0]["entries"][0]["state"] == "completed"


def test_mismatch_messages_and_hints():
    msg = ("Detected mismatch between collectives on ranks. Rank 0 is running collective: "
           "CollectiveFingerPrint(SequenceNumber=0, OpType=ALLREDUCE, TensorShape=[4], TensorDtypes=Float, "
           "TensorDeviceTypes=TensorOptions(device=cuda:0)), but Rank 1 is running collective: "
           "CollectiveFingerPrint(SequenceNumber=0, OpType=BROADCAST, TensorShape=[4], TensorDtypes=Float, "
           "TensorDeviceTypes=TensorOptions(device=cuda:1)).")
    assert debugging.explain_mismatch(msg) == "rank 0: ALLREDUCE([4], Float) / rank 1: BROADCAST([4], Float)"
    assert debugging.explain_mismatch("something else") == ""
    from labutils import errors
    assert "NCCL moves CUDA tensors only" in errors.hint_for("RuntimeError: No backend type associated with device type cpu")
    assert "ran out of memory" in errors.hint_for("OutOfMemoryError: CUDA out of memory. Tried to allocate 64.00 TiB")
    assert "its own GPU" in errors.hint_for(
        "ncclInvalidUsage: Duplicate GPU detected : rank 0 and rank 1 both on CUDA device 60")
    assert errors.hint_for("ValueError: something of the user's") == ""
    watchdog = ("terminate called after throwing an instance of 'c10::DistBackendError'\n  what():  [PG ID 0 "
                "PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: [Rank 0] "
                "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, "
                "NumelOut=1, Timeout(ms)=5000) ran for 5084 milliseconds before timing out.\n")
    e = errors.failure_error({0: {"exit_code": -6}, 1: {"exit_code": -6}},
                             {0: watchdog, 1: "[rank1]: Received a dump signal due to a collective timeout from  rank 0"})
    assert e.rank == 0 and e.exit_code == -6
    assert str(e).startswith("rank 0 was killed by SIGABRT before returning a result ([PG ID 0")
    assert "torch's own process-group timeout expired in rank 0" in str(e) and "TORCH_NCCL_DUMP_ON_TIMEOUT" in str(e)
