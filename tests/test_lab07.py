"""Lab 07's harness: the round-trip measurement and its table, the verdicts and their thresholds, and the
exercise checkers on real gloo ranks (one pool for the module).

Run: pytest tests/test_lab07.py -q   (one pool start and one launch; ~20 s on 2 cores)
"""
import json
import math
import re
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
    assert len(verdicts) == 2 and all(v.verdict in (claims.TRUE, claims.FALSE) for v in verdicts)


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
    assert [x.verdict for x in v] == ["TRUE", "TRUE"]
    assert "launch 5.00 s / pool.run 4.00 ms = 1,250x" in v[0].figure and v[0].rule == "TRUE if >= 100"
    assert [x.verdict for x in lab_claims.roundtrip_verdicts(_data(launch_ms=300.0))][0] == "FALSE"
    assert lab_claims.roundtrip_verdicts(_data(start_s=15.0))[1].verdict == "FALSE"  # 3 experiments to break even
    assert len(lab_claims.roundtrip_verdicts(_data(exec_ms=3.9))) == 2   # text vs function: the table's, no verdict
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


def test_break_even_inputs_and_the_verdict_read_the_same_quantity():
    from labutils.solutions import lab07 as solution
    inputs = measure.break_even_inputs(_data(start_s=5.0))
    assert inputs == {"start_s": 5.0, "launch_s": 5.0, "roundtrip_s": 0.004}
    assert solution.break_even(**inputs) == 2 and lab_claims.roundtrip_verdicts(_data(start_s=5.0))[1].verdict == "TRUE"
    assert solution.break_even(**measure.break_even_inputs(_data(start_s=15.0))) == 4
    assert lab_claims.roundtrip_verdicts(_data(start_s=15.0))[1].verdict == "FALSE"
    assert measure.break_even_inputs({k: v for k, v in _data().items() if k != "start_s"}) is None


# ---- exercise 1: all_agree on 3 ranks; three states and wrong-but-plausible answers ------------------
@pytest.fixture(scope="module")
def pool3():
    with RankPool(world_size=3, backend="gloo", timeout=60, output="quiet") as p:
        yield p


@pytest.fixture(scope="module")
def nb():
    """The notebook's two exercise functions (the instructor's edition), as the learner reads them."""
    import types

    import jupytext
    src = Path(__file__).resolve().parent.parent / "notebooks" / "src" / "07_interactive_ranks.py"
    ns: dict = {}
    for c in jupytext.read(src).cells:
        if c.metadata.get("nbgrader", {}).get("grade_id") in ("all_agree", "break_even"):
            exec(compile(c.source, f"<07 {c.metadata['nbgrader']['grade_id']}>", "exec"), ns)
    return types.SimpleNamespace(**ns)


def _flag_tensor(flag):
    return torch.tensor([1 if flag else 0], dtype=torch.int32)


def own_flag(flag):
    return bool(flag)


def rank0_decides(flag):
    t = _flag_tensor(flag)
    dist.broadcast(t, src=0)
    return bool(t.item())


def any_rank(flag):
    t = _flag_tensor(flag)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def sum_then_min(flag):
    t = _flag_tensor(flag)
    dist.all_reduce(t)                              # right, but ...
    u = _flag_tensor(flag)
    dist.all_reduce(u, op=dist.ReduceOp.MIN)        # ... a second collective for nothing
    return bool(u.item())


def gathers_everything(flag):
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, bool(flag))
    return all(flags)


def returns_a_tensor(flag):
    return "yes" if flag else "no"


def stub_agree(flag):
    raise NotImplementedError()


def test_all_agree_solution_passes_and_is_usable(nb, pool3, capsys):
    check.all_agree(nb.all_agree, pool=pool3)
    out = capsys.readouterr().out
    assert "✓ all_agree: the same, right answer on all 3 ranks for all 8 patterns" in out and "one all_reduce" in out
    assert check.usable_all_agree(nb.all_agree) is nb.all_agree


def test_all_agree_stub_is_not_attempted_and_the_stand_in_agrees(pool3, capsys):
    check.all_agree(stub_agree, pool=pool3)
    out, err = capsys.readouterr()
    assert "… not attempted: all_agree still raises NotImplementedError" in err and "✓" not in out
    standin = check.usable_all_agree(stub_agree)
    assert standin is check.standin_all_agree and "all_gather_object" in capsys.readouterr().err
    assert pool3.run(lambda rank, world_size: standin(rank != 1), output="quiet") == [False] * 3


@pytest.mark.parametrize("fn,hint", [
    (own_flag, "each rank returned its own flag"),
    (rank0_decides, "every rank returned rank 0's flag (a broadcast)"),
    (any_rank, "that is 'any rank is True'"),
    (sum_then_min, "one all_reduce of one number is enough"),
    (gathers_everything, "a broadcast or gather moves more"),
    (returns_a_tensor, "return a Python bool"),
], ids=lambda x: getattr(x, "__name__", "hint"))
def test_all_agree_wrong_but_plausible_answers_fail_with_their_hint(pool3, fn, hint):
    with pytest.raises(ExerciseError, match=re.escape(hint)):
        check.all_agree(fn, pool=pool3)


# ---- exercise 2: break_even, derived ----------------------------------------------------------------
def test_break_even_three_states(nb, capsys):
    check.break_even(nb.break_even, {"start_s": 2.3, "launch_s": 5.1, "roundtrip_s": 0.003})
    assert "✓ break_even: the first experiment from which the pool costs no more, on 7 cases" in capsys.readouterr().out

    def stub(start_s, launch_s, roundtrip_s, work_s=0.0):
        raise NotImplementedError()
    check.break_even(stub)
    out, err = capsys.readouterr()
    assert "… not attempted: break_even still raises NotImplementedError" in err and "✓" not in out


@pytest.mark.parametrize("fn,hint", [
    (lambda s, l, r, w=0.0: s / (l - r), "round it up (math.ceil)"),
    (lambda s, l, r, w=0.0: math.ceil(s / l), "the pool pays a round trip per experiment too"),
    (lambda s, l, r, w=0.0: math.ceil(s / (l + w - r)), "the work is paid the same way by both"),
    (lambda s, l, r, w=0.0: math.floor(s / (l - r)), "round the ratio up"),
    (lambda s, l, r, w=0.0: 1, "write both costs for k experiments"),
], ids=["exact-ratio", "no-round-trip", "work-not-cancelled", "floor", "always-one"])
def test_break_even_wrong_but_plausible_answers_fail_with_their_hint(fn, hint):
    with pytest.raises(ExerciseError, match=re.escape(hint)):
        check.break_even(fn)
