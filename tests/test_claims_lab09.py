"""Lab 09's fixed verdicts, each on data where it must come out TRUE and data where it must come out FALSE,
and on the committed recordings."""
import json
import pathlib

import pytest

from labutils.labs.lab09_all_to_all.claims import CLAIMS, SP_TIME_LIMIT

RECORDED = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "recorded"
SP_TIME = CLAIMS[("09_sp_block", "09_dtensor")]


def _run(tokens, tp, sp):
    return {"tokens": tokens, "time_ms": {"TP": tp, "SP": sp}}


def _recording(name):
    return json.loads((RECORDED / f"{name}.json").read_text())["data"]


def test_sp_time_is_true_only_when_every_size_holds():
    block = _run([8192], [6.0], [6.0])
    assert SP_TIME(block, _run([512, 2048, 8192], [2.0, 2.0, 6.0], [2.05, 2.0, 6.1]))[0].verdict == "TRUE"
    v = SP_TIME(block, _run([512, 2048, 8192], [2.0, 2.0, 6.0], [2.8, 2.0, 6.0]))[0]
    assert v.verdict == "FALSE" and "worst 1.4x at 512 tokens (DTensor sweep)" in v.figure, v.figure


def test_sp_time_judges_the_sp_block_run_too():
    """A slow SP at section 3's own size fails the claim even where every sweep point holds."""
    v = SP_TIME(_run([8192], [6.0], [6.0 * (SP_TIME_LIMIT + 0.05)]), _run([512], [2.0], [2.0]))[0]
    assert v.verdict == "FALSE" and "at 8192 tokens (SP block run)" in v.figure


def test_sp_time_on_the_recordings_fails_at_the_small_sizes():
    v = SP_TIME(_recording("09_sp_block"), _recording("09_dtensor"))[0]
    assert v.verdict == "FALSE"
    assert v.figure.count("tokens") == 1 + len(_recording("09_dtensor")["tokens"]) + 1   # worst + every point


def test_sp_block_verdicts_no_longer_judge_time():
    assert not any("time" in v.claim for v in CLAIMS["09_sp_block"](_recording("09_sp_block")))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_sp_time_refuses_a_failed_measurement(bad):
    with pytest.raises(ValueError, match="HINT"):
        SP_TIME(_run([8192], [6.0], [bad]), _run([512], [2.0], [2.0]))
