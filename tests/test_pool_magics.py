"""The %ranks / %%ranks magics in a real IPython shell, driving real gloo ranks (CPU).

Run: pytest tests/test_pool_magics.py -q   (two pool starts; ~15 s on 2 cores)
"""
import psutil
import pytest
from IPython.core.error import UsageError
from IPython import get_ipython
from IPython.testing.globalipapp import start_ipython

from labutils import RankError, RankPool
from labutils.pool.magics import parse_ranks


@pytest.fixture(scope="module")
def ip():
    shell = get_ipython() or start_ipython()  # start_ipython() gives None once a test module started it
    shell.run_line_magic("load_ext", "labutils")
    yield shell
    shell.run_line_magic("unload_ext", "labutils")


def _magics(ip):
    return ip.magics_manager.registry["RanksMagics"]


def test_start_cells_keep_state_per_rank_and_fetch(ip, capsys):
    ip.run_line_magic("ranks", "start 2 --backend gloo --timeout 30")
    assert "RankPool: 2 ranks, backend gloo, all alive" in capsys.readouterr().out
    ip.run_cell_magic("ranks", "", "x = torch.tensor([rank + 1.0])\ndist.all_reduce(x)\nprint(rank, world_size)")
    ip.run_cell_magic("ranks", "", "x.item() * 10")  # a last expression is printed by each rank
    assert capsys.readouterr().out == "[rank 0] 0 2\n[rank 1] 1 2\n[rank 0] 30.0\n[rank 1] 30.0\n"
    ip.run_cell_magic("ranks", "-r 1 --fetch y,x", "y = rank * 100")
    assert ip.user_ns["y"] == [100] and ip.user_ns["x"][0].item() == 3.0
    assert ip.run_line_magic("ranks", "fetch y -r 1") == [100]
    assert ip.run_line_magic("ranks", "fetch x y -r 1")["y"] == [100]
    ip.user_ns["lr"] = 0.5
    ip.run_line_magic("ranks", "push lr")
    ip.run_cell_magic("ranks", "--output quiet --fetch z", "z = lr * (rank + 1)\nprint('hidden')")
    assert ip.user_ns["z"] == [0.5, 1.0] and capsys.readouterr().out == ""


def test_error_in_a_cell_is_reported_and_the_pool_stays(ip, capsys):
    pids = _magics(ip).pool.status().pids
    with pytest.raises(RankError, match="rank 0 raised ZeroDivisionError: division by zero") as e:
        ip.run_cell_magic("ranks", "", "value = 1 / rank")
    assert "value = 1 / rank" in e.value.traceback  # the cell's own line, from the rank
    # run as a cell: the rank's traceback names the cell by the number it shows, In [N]
    result = ip.run_cell("%%ranks -r 0\nvalue = 1 / rank", store_history=True)
    assert isinstance(result.error_in_exec, RankError)
    assert f'File "<%%ranks cell {result.execution_count}>", line 1' in result.error_in_exec.traceback
    capsys.readouterr()
    ip.run_cell_magic("ranks", "-r 1", "value")
    assert capsys.readouterr().out == "[rank 1] 1.0\n"
    assert _magics(ip).pool.status().pids == pids


def test_a_stub_on_every_rank_is_not_attempted_and_the_notebook_goes_on(ip, capsys):
    """nbgrader's stub (NotImplementedError) on every selected rank: one line on stderr, no error, the pool
    kept; NotImplementedError on some ranks only, or another error on one, is raised as before."""
    pids = _magics(ip).pool.status().pids
    stub = "answer = None\n# ✍ YOUR CODE HERE\nraise NotImplementedError()"
    ip.run_cell_magic("ranks", "--fetch answer", stub)
    out, err = capsys.readouterr()
    assert err == ("not attempted: this cell raises NotImplementedError on every rank (an exercise left as "
                   "its stub); the notebook goes on.\n") and out == ""
    assert "answer" not in ip.user_ns  # nothing fetched from a cell that did not finish
    ip.run_cell_magic("ranks", "-r 1", "raise NotImplementedError()")  # every *selected* rank
    assert "not attempted" in capsys.readouterr().err
    with pytest.raises(RankError, match="rank 0 raised NotImplementedError"):
        ip.run_cell_magic("ranks", "", "if rank == 0:\n    raise NotImplementedError()")
    with pytest.raises(RankError, match=r"rank 0 raised NotImplementedError \(ranks \[1\] failed too\)") as e:
        ip.run_cell_magic("ranks", "", "raise NotImplementedError() if rank == 0 else ValueError('wrong')")
    assert e.value.exc_types == {0: "NotImplementedError", 1: "ValueError"}
    assert "not attempted" not in capsys.readouterr().err
    assert ip.run_line_magic("ranks", "fetch answer") == [None, None]
    assert _magics(ip).pool.status().pids == pids


def test_usage_errors(ip):
    for line in ("start two", "start 1 2", "frobnicate", "fetch", "push nothing_here", "use nothing"):
        with pytest.raises(UsageError):
            ip.run_line_magic("ranks", line)
    with pytest.raises(UsageError, match="cannot read ranks"):
        ip.run_cell_magic("ranks", "-r one", "pass")
    with pytest.raises(UsageError):
        ip.run_cell_magic("ranks", "--output loud", "pass")
    # IPython's magic_arguments: argparse's message, then the usage; an error in the notebook, never SystemExit
    with pytest.raises(UsageError, match=r"^%ranks: argument --timeout: invalid float value: 'soon'\n    %ranks start"):
        ip.run_line_magic("ranks", "status --timeout soon")
    with pytest.raises(UsageError, match=r"^%ranks: argument --output: invalid choice: 'loud' \(choose from"):
        ip.run_cell_magic("ranks", "--output loud", "pass")
    with pytest.raises(UsageError, match=r"^%ranks: unrecognized arguments: --frobnicate"):
        ip.run_cell_magic("ranks", "--frobnicate", "pass")
    assert parse_ranks("0,2-3") == [0, 2, 3]


def test_status_stop_use_and_auto_start(ip, capsys):
    ip.run_line_magic("ranks", "status")
    pids = _magics(ip).pool.status().pids
    ip.run_line_magic("ranks", "stop")
    ip.run_line_magic("ranks", "stop")
    out = capsys.readouterr().out
    assert "labutils: pool stopped" in out and "no pool was running" in out
    assert not any(psutil.pid_exists(p) for p in pids)
    ip.run_line_magic("ranks", "status")
    assert "none running" in capsys.readouterr().out
    ip.run_cell_magic("ranks", "", "rank")  # no pool: one is started for the cell
    assert capsys.readouterr().out.endswith(
        "labutils: %%ranks started a pool of 2 ranks (%ranks stop ends it).\n[rank 0] 0\n[rank 1] 1\n")
    pool = _magics(ip).pool
    ip.user_ns["my_pool"] = pool
    ip.run_line_magic("ranks", "use my_pool")
    assert _magics(ip).pool is pool and isinstance(pool, RankPool)


def test_unload_stops_the_pool(ip):
    pool = _magics(ip).pool
    assert pool is not None and not pool.closed
    pids = pool.status().pids
    ip.run_line_magic("unload_ext", "labutils")
    assert pool.closed and not any(psutil.pid_exists(p) for p in pids)
    assert "ranks" not in ip.magics_manager.magics["cell"]
    ip.run_line_magic("load_ext", "labutils")  # for the fixture's own unload
