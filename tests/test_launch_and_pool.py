"""``launch`` and ``RankPool`` keep one contract: each case runs on both, side by side, on real gloo ranks.

* a hang: ``RankTimeout`` says where each rank was (``.where``), with its stack (``.stacks``, from the
  user's function on) and its flight record (``.flight``, where torch records gloo collectives);
* torch's own process-group timeout follows one rule (``config.process_group_timeout``): a pool task
  longer than the pool's process group can honour is refused with a HINT;
* a traceback shows the source of a helper defined in another notebook cell, reached through the
  function's globals or its closure (cloudpickle names such code ``<dynamic-code>``).

The ranks' diagnostics recognise the bootstraps' own frames by their code objects, not their names
(the last tests).

    pytest -n 0 tests/test_launch_and_pool.py -q     # about a minute on 2 cores
"""
from __future__ import annotations

import linecache
import os
import sys
import threading
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils import LaunchConfigError, RankError, RankTimeout, config, debugging, errors
from labutils import _rank
from labutils.pool import pool as pool_module

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks get these functions by value

HANG_S = 10  # the hang's timeout: launch's includes starting the ranks
KINDS = ("launch", "pool")


def run(kind: str, pool, fn, *args, timeout: float = 120):
    """``fn`` on two gloo ranks: a fresh launch, or the module's pool."""
    if kind == "launch":
        return labutils.launch(fn, *args, world_size=2, backend="gloo", timeout=timeout, output="quiet")
    return pool.run(fn, *args, timeout=timeout)


# ---------------------------------------------------------------------------------------------
# 1. A hang: where, stacks, flight

def _returns_early(rank, world_size):
    t = torch.ones(4)
    dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(t)
    return t


@pytest.mark.parametrize("kind", KINDS)
def test_a_hang_says_where_each_rank_was(kind, gloo2):
    with pytest.raises(RankTimeout) as info:
        run(kind, gloo2, _returns_early, timeout=HANG_S)
    e = info.value
    assert e.ranks == [0] and e.finished == [1]
    assert str(e).startswith(f"ranks [0] did not finish within {HANG_S} s. HINT: ranks [1] returned while "
                             "ranks [0] were still running: a collective that not every rank calls never returns")
    assert e.where[0].startswith(f"{__file__}:") and e.where[0].endswith(
        "in _returns_early: dist.all_reduce(t) (inside torch.distributed)")
    # the rank that returned: launch's waits for the others to return too, the pool's for its next task
    assert e.where[1] == {"launch": "returned; waiting for the other ranks",
                          "pool": "returned; waiting for the next task"}[kind]
    assert e.stacks[0].startswith(f'  File "{__file__}", line ')  # from the user's function on
    assert "in _returns_early\n    dist.all_reduce(t)\n" in e.stacks[0] and "work.wait()" in e.stacks[0]
    if e.flight:  # torch >= 2.8 records gloo collectives too
        assert sorted(e.flight) == [0, 1]
        assert "rank 0 called all_reduce([4], Float); rank 1 never did" in debugging.first_divergence(e.flight)
    if kind == "pool":
        assert "the pool was restarted" in str(e)


def test_a_pool_cell_that_hangs_is_quoted(gloo2):
    with pytest.raises(RankTimeout) as info:
        gloo2.exec("import time\nif rank == 1:\n    time.sleep(60)\n", timeout=3)
    e = info.value
    assert e.where[0] == "returned; waiting for the next task"
    assert e.where[1] == "<ranks cell %d>:3 in <module>: time.sleep(60)" % gloo2._task_id
    assert e.stacks[1].startswith(f'  File "<ranks cell {gloo2._task_id}>", line 3, in <module>\n    time.sleep(60)\n')


# ---------------------------------------------------------------------------------------------
# 2. torch's process-group timeout: one rule

def _pg_timeout_s(rank, world_size):
    from labutils import compat
    return compat.process_group_timeout_s()


def test_process_group_timeout_follows_one_rule(gloo2):
    # launch: for each call, longer than its timeout by the margin
    assert config.process_group_timeout(45) == 45 + config.PG_TIMEOUT_MARGIN_S == 105.0
    assert labutils.launch(_pg_timeout_s, world_size=2, backend="gloo", timeout=45, output="quiet") == [105.0] * 2
    # the pool: once, for the longest task it accepts
    longest = max(gloo2.timeout, pool_module.LONGEST_TASK_S)
    assert gloo2.run(_pg_timeout_s, timeout=longest) == [config.process_group_timeout(longest)] * 2
    with pytest.raises(LaunchConfigError) as info:
        gloo2.run(_pg_timeout_s, timeout=longest + 1)
    assert str(info.value) == (
        f"timeout={longest + 1:g} s is longer than this pool's ranks can wait: their process group was set "
        f"up with torch's timeout of {longest + 60:g} s, which must exceed a task's timeout by 60 s, so the "
        f"longest task is {longest:g} s. HINT: start the pool with RankPool(timeout={longest + 1:g}) for "
        "tasks this long, or use labutils.launch, which sets torch's timeout for each call.")
    with pytest.raises(LaunchConfigError, match="longer than this pool's ranks can wait"):
        gloo2.exec("pass", timeout=longest + 1)


def test_a_pool_started_for_long_tasks_accepts_them(no_leaks):
    with labutils.RankPool(world_size=1, backend="gloo", timeout=900, output="quiet") as p:
        assert p.run(_pg_timeout_s) == [config.process_group_timeout(900)]
        assert p.run(_pg_timeout_s, timeout=900) == [960.0]


# ---------------------------------------------------------------------------------------------
# 3. Tracebacks show helpers defined in other cells

HELPER_CELL = "/tmp/ipykernel_0/fake_cell_helper.py"   # exists in linecache only, like a notebook cell
CALLER_CELL = "/tmp/ipykernel_0/fake_cell_caller.py"
HELPER_SRC = "def helper(rank):\n    raise ValueError(f'helper failed on rank {rank}')\n"
CALLER_SRC = ("def through_globals(rank, world_size):\n    return helper(rank)\n\n"
              "def make_closure():\n    h = helper\n    def through_closure(rank, world_size):\n"
              "        return h(rank)\n    return through_closure\n")


def _cells():
    ns = {"__name__": "__main__"}  # a notebook's namespace: sent by value
    for name, src in ((HELPER_CELL, HELPER_SRC), (CALLER_CELL, CALLER_SRC)):
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
        exec(compile(src, name, "exec"), ns)
    assert not os.path.exists(HELPER_CELL)
    return {"globals": ns["through_globals"], "closure": ns["make_closure"]()}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("how", ["globals", "closure"])
def test_a_helper_from_another_cell_shows_its_source(kind, how, gloo2):
    fn = _cells()[how]
    with pytest.raises(RankError) as info:
        run(kind, gloo2, fn)
    tb = info.value.traceback
    assert f'File "{HELPER_CELL}", line 2, in helper\n' in tb
    assert "raise ValueError(f'helper failed on rank {rank}')" in tb
    assert f'File "{CALLER_CELL}", line ' in tb and "<dynamic-code>" not in tb


# ---------------------------------------------------------------------------------------------
# 4. The bootstraps' frames are marked by code object, never recognised by name

def _diagnose_in_process(tmp_path, body, **marks) -> dict:
    """Run ``body()`` in this (main) thread while ``_rank.serve_diagnostics`` answers a request."""
    _rank.serve_diagnostics(str(tmp_path), 0, "gloo", **marks)
    answer = tmp_path / "diag-0.pkl"
    threading.Timer(0.2, lambda: (tmp_path / "diagnose").touch()).start()
    body(lambda: answer.exists())
    import pickle
    return pickle.loads(answer.read_bytes())


def test_diagnostics_mark_frames_by_code_object(tmp_path):
    ns: dict = {}
    exec(compile("def wait_here(done):\n    while not done():\n        pass\n", "<one>", "exec"), ns)
    marked = ns["wait_here"]
    exec(compile("def wait_here(done):\n    while not done():\n        pass\n", "<two>", "exec"), ns)
    same_name = ns["wait_here"]   # a different function of the same name

    def entry(wait, done):  # the bootstrap's call of the user's code
        wait(done)

    for sub in ("marked", "same_name"):
        (tmp_path / sub).mkdir()
    info = _diagnose_in_process(tmp_path / "marked", lambda done: entry(marked, done),
                                entry=[entry.__code__], states={marked.__code__: "returned"})
    assert info["state"] == "returned"
    assert info["frames"][info["user_from"]][0] == "<one>"  # the first frame past the entry
    other = _diagnose_in_process(tmp_path / "same_name", lambda done: entry(same_name, done),
                                 entry=[entry.__code__], states={marked.__code__: "returned"})
    assert other["state"] == "" and any(f == "<two>" for f, _, _ in other["frames"])


def test_where_comes_from_the_state_not_from_function_names():
    pkg = os.path.dirname(errors.__file__)
    frames = [(f"{pkg}/_rank.py", 10, "main"), (f"{pkg}/_rank.py", 20, "to_cpu")]
    assert errors.describe_frames(frames, "returning") == errors.RANK_STATES["returning"]
    assert errors.describe_frames(frames) == f"{pkg}/_rank.py:20 in to_cpu"  # a name alone says nothing
    assert errors.describe_frames(frames, "idle") == "returned; waiting for the next task"
    e = errors.hang_error([0], 5, [], {0: {"frames": [("<frozen runpy>", 1, "_run_code"), *frames],
                                           "user_from": 2, "state": "returning"}})
    assert e.where == {0: errors.RANK_STATES["returning"]}
    assert e.stacks[0].startswith(f'  File "{pkg}/_rank.py", line 20, in to_cpu')
