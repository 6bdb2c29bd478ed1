"""The launch contract with real gloo ranks (no mocks): results, output, errors, hangs, cleanup.

The fault-injection suite (tests/test_faults.py) covers many more failure scenarios.
"""
import fcntl
import os
import subprocess
import sys
import time

import psutil
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils import LaunchConfigError, RankError, RankTimeout, procs


def _sum_ranks(rank, world_size, offset):
    t = torch.tensor([float(rank + offset)])
    dist.all_reduce(t)
    print(f"sum is {t.item():g}")
    return {"rank": rank, "sum": t}


def test_results_in_rank_order_and_prefixed_output(capsys, no_leaks):
    out = labutils.launch(_sum_ranks, 1, world_size=3, backend="gloo")
    assert [o["rank"] for o in out] == [0, 1, 2]
    assert all(o["sum"].item() == 1 + 2 + 3 for o in out)
    printed = capsys.readouterr().out.splitlines()
    assert [ln for ln in printed if ln.startswith("[rank")] == [
        "[rank 0] sum is 6", "[rank 1] sum is 6", "[rank 2] sum is 6"]


def test_function_defined_in_main_is_pickled_by_value(no_leaks):
    # A lambda built at run time cannot be imported by the ranks: cloudpickle sends it by value.
    scale = 7
    fn = eval("lambda rank, world_size: rank * scale", {"scale": scale})
    assert labutils.launch(fn, world_size=2, backend="gloo") == [0, 7]


def test_world_size_one(no_leaks):
    assert labutils.launch(lambda r, n: (r, n, dist.get_world_size()), world_size=1, backend="gloo") == [(0, 1, 1)]


def _raise_on_1(rank, world_size):
    if rank == 1:
        raise ValueError("bad value on rank 1")
    dist.barrier()  # rank 0 would wait forever without teardown


def test_exception_names_rank_and_is_fast(no_leaks):
    t0 = time.monotonic()
    with pytest.raises(RankError) as info:
        labutils.launch(_raise_on_1, world_size=2, backend="gloo", timeout=60)
    elapsed = time.monotonic() - t0
    e = info.value
    assert e.rank == 1 and e.exc_type == "ValueError" and isinstance(e, RuntimeError)
    assert str(e).startswith("rank 1 raised ValueError: bad value on rank 1.")
    assert "HINT" in str(e)
    assert 'raise ValueError("bad value on rank 1")' in e.traceback
    assert "_rank.py" not in e.traceback  # the bootstrap's frames are trimmed
    assert elapsed < 30, f"teardown took {elapsed:.1f} s, should be seconds, not the timeout"


def _mismatch(rank, world_size):
    if rank == 0:
        dist.barrier()
    else:
        time.sleep(600)


def test_hang_times_out_and_kills_every_rank(no_leaks):
    t0 = time.monotonic()
    with pytest.raises(RankTimeout) as info:
        labutils.launch(_mismatch, world_size=2, backend="gloo", timeout=8)
    elapsed = time.monotonic() - t0
    assert info.value.ranks == [0, 1] and isinstance(info.value, TimeoutError)
    assert str(info.value).startswith("ranks [0, 1] did not finish within 8 s. HINT:")
    assert 8 <= elapsed < 20


@pytest.mark.parametrize("kwargs, match", [
    (dict(world_size=0), "world_size must be >= 1"),
    (dict(backend="nccl"), "needs CUDA GPUs"),
    (dict(timeout=0), "timeout must be a positive number"),
    (dict(init="sometimes"), "init must be one of"),
    (dict(output="loud"), "output must be"),
])
def test_bad_input_fails_before_spawning(kwargs, match):
    if kwargs.get("backend") == "nccl" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    before = len(psutil.Process().children(recursive=True))
    with pytest.raises(LaunchConfigError, match=match):
        labutils.launch(_sum_ranks, 0, **kwargs)
    assert len(psutil.Process().children(recursive=True)) == before


def test_not_callable():
    with pytest.raises(LaunchConfigError, match="fn must be callable"):
        labutils.launch(42)


def test_unpicklable_argument_is_rejected_before_spawning():
    import threading
    with pytest.raises(LaunchConfigError, match="cannot be sent to the ranks"):
        labutils.launch(_sum_ranks, threading.Lock(), world_size=2, backend="gloo")


def test_init_none_lets_fn_use_env_rendezvous(no_leaks):
    def own_init(rank, world_size):
        dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world_size)
        t = torch.ones(1)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return t.item()
    # env:// binds MASTER_PORT itself, so the free port labutils probed can be taken in between by
    # another program (seen under pytest -n 6): that race is env://'s, so retry it, nothing else.
    for attempt in range(3):
        try:
            assert labutils.launch(own_init, world_size=2, backend="gloo", init="none") == [2.0, 2.0]
            return
        except RankError as e:
            if "EADDRINUSE" not in str(e.remote_message) or attempt == 2:
                raise


def test_rendezvous_listens_nowhere():
    """The ranks' store is a file in a private directory: making it opens no socket at all."""
    from labutils.rendezvous import PrivateStore, join

    def listening():
        return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN}
    before = listening()
    with PrivateStore(timeout_s=10) as owner:
        store = join(owner.address, 10)
        store.set("k", "v")
        assert store.get("k") == b"v"
        assert listening() == before, f"the rendezvous listens on {listening() - before}"


def test_under_torchrun_runs_in_process_and_gathers(tmp_path):
    import subprocess
    import sys
    script = tmp_path / "exp.py"
    script.write_text(
        "import torch, torch.distributed as dist, labutils\n"
        "def fn(rank, world_size):\n"
        "    dev = 'cuda' if dist.get_backend() == 'nccl' else 'cpu'\n"
        "    t = torch.tensor([rank + 1.0], device=dev); dist.all_reduce(t); return (rank, t.item())\n"
        "out = labutils.launch(fn)\n"
        "import sys; sys.stdout.write(f'RESULT {dist.get_rank()} {out}\\n'); sys.stdout.flush()\n"
        "dist.destroy_process_group()\n")
    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        str(script)], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = sorted(l for l in r.stdout.splitlines() if l.startswith("RESULT"))
    assert lines == ["RESULT 0 [(0, 3.0), (1, 3.0)]", "RESULT 1 [(0, 3.0), (1, 3.0)]"]


def test_leftover_ranks_reports_live_rank_processes_only():
    import subprocess
    import sys
    # stand-ins whose command line names the rank module, as a rank's does
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "labutils._rank"])
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)", "labutils.pool.worker"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        pids = lambda found: {p.pid for p in found}  # noqa: E731
        found = pids(procs.leftover_ranks())
        assert {sleeper.pid, quick.pid} <= found and other.pid not in found
        assert sleeper.pid not in pids(procs.leftover_ranks(ignore={sleeper.pid}))
        assert quick.pid not in pids(procs.leftover_ranks(ignore={sleeper.pid}, wait_s=10))  # it exits meanwhile
        sleeper.kill()
        deadline = time.monotonic() + 10
        while psutil.Process(sleeper.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sleeper.pid not in pids(procs.leftover_ranks())  # dead but not reaped: not left behind
    finally:
        for p in (sleeper, quick, other):
            p.kill()
            p.wait()


def test_function_using_dist_and_a_global_named_config_can_be_sent():
    """cloudpickle drags torch.distributed.config along with such a function; torch >= 2.13 made that a
    ConfigModuleInstance that pickle cannot copy. labutils sends it by name."""
    from labutils import config
    import torch.distributed as dist

    def fn(rank, world_size):
        return dist.get_rank(), str(config.rank_device())

    assert labutils.launch(fn, world_size=2, backend="gloo", output="quiet") == [(0, "cpu"), (1, "cpu")]


def test_stale_run_directories_are_removed(tmp_path):
    """A caller killed before its first rank ran leaves its folder to the next launch (then nobody holds it)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"labutils-{dead.pid}_abc"
    stale.mkdir()
    (stale / "payload.pkl").write_bytes(b"x")
    mine = tmp_path / f"labutils-{os.getpid()}_def"        # a live caller's
    held = tmp_path / f"labutils-{dead.pid}_ghi"           # a dead caller's, with a rank still in it
    other = tmp_path / "labutils-kernel-x_y"               # not a run directory
    for path in (mine, held, other):
        path.mkdir()
    (held / procs.RUN_LOCK).touch()
    fd = os.open(held / procs.RUN_LOCK, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        assert procs.remove_stale_runs(tmp_path) == [stale]
    finally:
        os.close(fd)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (mine, held, other))
    assert procs.remove_stale_runs(tmp_path) == [held]      # once no rank holds it
