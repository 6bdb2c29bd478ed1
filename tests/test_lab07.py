"""Lab 07's harness: the round-trip measurement and its table, the verdicts and their thresholds, and the
exercise checkers on real gloo ranks (one pool for the module).

Run: pytest tests/test_lab07.py -q   (one pool start and one launch; ~20 s on 2 cores)
"""
import json
import math
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from labutils import RankPool, claims
from labutils.checks import ExerciseError
from labutils.checks import lab07 as check
from labutils.labs.lab07_interactive_ranks import claims as lab_claims
from labutils.labs.lab07_interactive_ranks import measure

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file
RECORDING = Path(__file__).resolve().parent.parent / "notebooks" / "recorded" / "07_roundtrip.json"


def tiny_all_reduce(rank, world_size):
    t = torch.ones(1)
    dist.all_reduce(t)
    return t


@pytest.fixture(scope="module")
def pool():
    with RankPool(world_size=2, backend="gloo", timeout=60, output="quiet") as p:
        yield p


def _data(launch_ms=5000.0, pool_ms=4.0, exec_ms=1.0, start_s=5.0):
    return {"world_size": 2, "backend": "nccl", "start_s": start_s, "pool_ms": [pool_ms] * 3,
            "exec_ms": [exec_ms] * 3, "pickle_ms": [2.0] * 3, "launch_ms": [launch_ms], "modules": 1234}


def test_roundtrip_measures_every_way_of_sending_work(pool):
    data = measure.roundtrip(pool, tiny_all_reduce, "t = torch.ones(1)\ndist.all_reduce(t)\n", repeat=3)
    assert (data["world_size"], data["backend"]) == (2, "gloo") and data["start_s"] == pool.start_s > 0
    assert [len(data[k]) for k in ("pool_ms", "exec_ms", "pickle_ms", "launch_ms")] == [3, 3, 3, 1]
    assert data["modules"] > 100  # torch is imported here, as in the notebook
    m = measure.medians(data)
    assert 0 < m["pool_ms"] < m["launch_ms"] and m["launch_ms"] > 100  # a launch starts processes
    json.dumps(data)  # recordable as it is
    verdicts = lab_claims.roundtrip_verdicts(data)
    assert len(verdicts) == 3 and all(v.verdict in (claims.TRUE, claims.FALSE) for v in verdicts)


def test_table_one_column_per_source_nan_for_what_an_old_recording_lacks():
    old = json.loads(RECORDING.read_text())["data"]
    old = {k: old[k] for k in ("world_size", "backend", "pool_ms", "launch_ms")}  # the first recordings' keys
    df = measure.table({"here": _data(), "ref": old})
    assert list(df.columns) == ["here (nccl, 2 ranks)", "ref (nccl, 2 ranks)"]
    assert df.loc["launch / pool.run", "here (nccl, 2 ranks)"] == 1250
    assert df.loc["pool start, once (s)", "here (nccl, 2 ranks)"] == 5.0
    assert df.loc["modules imported in the notebook", "here (nccl, 2 ranks)"] == 1234
    assert math.isnan(df.loc["%%ranks cell round trip (ms)", "ref (nccl, 2 ranks)"])


def test_roundtrip_verdicts_follow_their_thresholds():
    v = lab_claims.roundtrip_verdicts(_data())
    assert [x.verdict for x in v] == ["TRUE", "TRUE", "TRUE"]
    assert "launch 5.00 s / pool.run 4.00 ms = 1,250x" in v[0].figure and v[0].rule == "TRUE if >= 100"
    assert [x.verdict for x in lab_claims.roundtrip_verdicts(_data(launch_ms=300.0))][0] == "FALSE"
    assert lab_claims.roundtrip_verdicts(_data(start_s=15.0))[1].verdict == "FALSE"  # 3 experiments to break even
    assert lab_claims.roundtrip_verdicts(_data(exec_ms=3.9))[2].verdict == "FALSE"   # text hardly cheaper
    only = {k: v for k, v in _data().items() if k not in ("start_s", "exec_ms")}
    assert len(lab_claims.roundtrip_verdicts(only)) == 1  # an older recording: what it can judge
    assert lab_claims.roundtrip_verdicts(json.loads(RECORDING.read_text())["data"])


def test_behaviour_verdicts():
    assert lab_claims.state_kept([1, 1], 1).verdict == "TRUE"
    assert lab_claims.state_kept([1, 2], 1).verdict == "FALSE"
    assert lab_claims.pool_kept("x", [1, 2], [1, 2], [0.5, 0.5], 0.5).verdict == "TRUE"
    assert lab_claims.pool_kept("x", [1, 2], [3, 4], [0.5, 0.5], 0.5).verdict == "FALSE"
    assert lab_claims.pool_restarted(0, 1).verdict == "TRUE"
    assert lab_claims.pool_restarted(0, 2).verdict == "FALSE"


def test_checkers_not_attempted_right_and_wrong(pool, capsys):
    pool.exec("mean_rank = None\nsquares = None")
    check.mean_rank(pool)
    check.squares(pool)
    out, err = capsys.readouterr()
    assert "… not attempted: mean_rank is still None on every rank" in err and "… not attempted: squares" in err
    assert "✓" not in out
    pool.exec("t = torch.tensor([float(rank)])\ndist.all_reduce(t)\nmean_rank = t.item()")  # forgot to divide
    with pytest.raises(ExerciseError, match=r"mean_rank on the ranks is \[1.0, 1.0\].*HINT: that is the sum"):
        check.mean_rank(pool)
    pool.exec("mean_rank = 'half'")
    with pytest.raises(ExerciseError, match="mean_rank on the ranks is"):
        check.mean_rank(pool)
    pool.exec("squares = [1, 0]")
    with pytest.raises(ExerciseError, match="HINT: the right values in the wrong order"):
        check.squares(pool)
    pool.exec("squares = [torch.tensor([r * r]) for r in range(world_size)]")  # tensors are fine
    check.squares(pool)
    assert "✓ squares = [0, 1]" in capsys.readouterr().out


def _exercise_cells() -> dict:
    """The notebook's two exercise cells, ``{grade_id: (instructor's text, student's text)}``; the student's
    is what nbgrader's own ClearSolutions makes of it (with the course's stub)."""
    import jupytext
    import nbformat
    ClearSolutions = pytest.importorskip("nbgrader.preprocessors").ClearSolutions
    src = Path(__file__).resolve().parent.parent / "notebooks" / "src" / "07_interactive_ranks.py"
    cells = {c.metadata["nbgrader"]["grade_id"]: c for c in jupytext.read(src).cells
             if c.metadata.get("nbgrader", {}).get("solution")}
    student = nbformat.v4.new_notebook(cells=[nbformat.from_dict(c) for c in cells.values()])
    clear = ClearSolutions(code_stub={"python": "# ✍ YOUR CODE HERE\nraise NotImplementedError()"})
    student, _ = clear.preprocess(student, {})
    return {gid: (c.source, s.source) for (gid, c), s in zip(cells.items(), student.cells)}


@pytest.fixture()
def shell(pool):
    """An IPython shell whose %%ranks drives the module's pool (left running at the end)."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython
    ip = get_ipython() or start_ipython()
    ip.run_line_magic("load_ext", "labutils")
    ip.user_ns["pool"] = pool
    ip.run_line_magic("ranks", "use pool")
    yield ip
    ip.magics_manager.registry["RanksMagics"].pool = None  # unloading must not close the module's pool
    ip.run_line_magic("unload_ext", "labutils")


def _run(ip, cell: str) -> None:
    magic, _, body = cell.partition("\n")
    assert magic.startswith("%%ranks")
    ip.run_cell_magic("ranks", magic[len("%%ranks"):].strip(), body)


def test_exercise_cells_in_their_three_states(shell, capsys):
    """The notebook's own cells: the student's stub (nbgrader's) runs on, "not attempted" from the cell and
    the checker; the instructor's answer passes; a wrong answer in the cell fails with the checker's HINT."""
    cells = _exercise_cells()
    assert set(cells) == {"mean_rank", "squares"}
    for gid, (instructor, student) in cells.items():
        assert "### BEGIN SOLUTION" in instructor and "dist." in instructor
        assert "raise NotImplementedError()" in student and "dist." not in student
        _run(shell, student)  # does not raise
        getattr(check, gid)(shell.user_ns["pool"])
        out, err = capsys.readouterr()
        assert "not attempted: this cell raises NotImplementedError on every rank" in err
        assert f"… not attempted: {gid} is still None on every rank" in err and "✓" not in out
        _run(shell, instructor)
        getattr(check, gid)(shell.user_ns["pool"])
        assert f"✓ {gid} = " in capsys.readouterr().out
    _run(shell, cells["mean_rank"][0].replace("t.item() / world_size", "t.item()"))  # forgot to divide
    with pytest.raises(ExerciseError, match="HINT: that is the sum"):
        check.mean_rank(shell.user_ns["pool"])
    _run(shell, cells["squares"][0].replace("dist.all_gather(parts, mine)", "parts[rank] = mine"))
    with pytest.raises(ExerciseError, match=r"squares on the ranks is \[\[0, 0\], \[0, 1\]\]"):
        check.squares(shell.user_ns["pool"])
