"""Lab 08's verdicts that judge "build your DDP" and what overlap can buy: each rule comes out TRUE on data
where the claim holds and FALSE where it does not (synthetic recordings, tests/lab08_fakes.py), and the
rule on what overlap can buy DDP's transformer is re-derived from the committed 08_ddp recording.

Run: pytest tests/test_claims_lab08.py -q      (pure: well under a second)
"""
from __future__ import annotations

import json
from pathlib import Path

from labutils.labs.lab08_data_parallel import claims as C

import lab08_fakes as fakes  # tests/lab08_fakes.py

RECORDED = Path(__file__).resolve().parent.parent / "notebooks" / "recorded"


def _words(data) -> list[str]:
    return [v.verdict for v in C.build_verdicts(data)]


def test_build_ddp_verdicts_true_where_overlap_hides_the_communication():
    got = C.build_verdicts(fakes.build_ddp())
    assert [v.verdict for v in got] == ["TRUE"] * 4, [v.body() for v in got]
    assert ">= 20% of a step without overlap" in got[0].claim and "36%" in got[0].figure


def test_build_ddp_verdicts_false_where_they_do_not_hold():
    assert _words(fakes.build_ddp(hidden_b=0.3)) == ["TRUE", "FALSE", "TRUE", "TRUE"]
    assert _words(fakes.build_ddp(hidden_c=0.4)) == ["TRUE", "TRUE", "FALSE", "TRUE"]
    assert _words(fakes.build_ddp(ddp_ratio=1.2)) == ["TRUE", "TRUE", "TRUE", "FALSE"]
    assert _words(fakes.build_ddp(hidden_b=0.51, hidden_c=0.5, ddp_ratio=1.09)) == ["TRUE"] * 4   # at the edges


def test_build_ddp_precondition_fails_and_is_stated():
    """A workload whose communication is small cannot show what overlap buys: the precondition is FALSE and
    the overlap verdicts say why they were not judged, instead of a TRUE or FALSE."""
    got = C.build_verdicts(fakes.build_ddp(no_sync=30.0, comm=1.7))
    assert [v.verdict for v in got] == ["FALSE", C.NOT_JUDGED, C.NOT_JUDGED, "TRUE"]
    assert all("precondition not met" in v.figure for v in got[1:3])


def test_build_ddp_stand_ins_are_not_judged():
    got = C.build_verdicts(fakes.build_ddp(standins=("bucketed",)))
    assert [v.verdict for v in got] == ["TRUE", "TRUE", C.NOT_JUDGED, C.NOT_JUDGED]
    assert "stand-in" in got[2].figure


def test_comm_share_on_the_recorded_transformer_is_small():
    """Re-derived from the committed recording: DDP's transformer spends a few percent of its step in the
    all-reduce, so its overlap verdicts, TRUE or not, cannot show what overlap buys."""
    data = json.loads((RECORDED / "08_ddp.json").read_text())["data"]
    v = C.comm_share_verdict(data)
    assert v.verdict == "TRUE" and "of the best step" in v.figure
    assert C.comm_share_verdict(fakes.ddp(comm=7.5)).verdict == "FALSE"
    assert C.comm_share_verdict(fakes.ddp(comm=6.5)).verdict == "TRUE"


def test_a_recorded_measurement_is_judged_from_claims():
    """AWAITING_RECORDING holds verdict functions of measurements with no recording yet; once 2xH200 has
    recorded one, it is in CLAIMS, whose every name tests/test_claims.py re-derives."""
    for name in C.AWAITING_RECORDING:
        assert (name in C.CLAIMS) == (RECORDED / f"{name}.json").exists()
