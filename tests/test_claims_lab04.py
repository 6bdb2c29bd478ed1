"""Lab 04's verdicts that judge the clock-event reasons over time (``claims.power_timeline_verdicts``) and the
shared rules of the step study (``boost_verdicts``): each comes out TRUE on data that show the claim and FALSE
on data that contradict it. The timeline's recording does not exist yet, so its data here are made to the
recording's shape (``boost.power_timeline``), one reading every 10 ms.

Run: pytest tests/test_claims_lab04.py -q     (CPU, a second)
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from labutils import claims
from labutils.labs.lab04_pipeline import boost, power
from labutils.labs.lab04_pipeline import claims as lab_claims

CAP, THERMAL = 0x4, 0x20
RECORDED = Path(__file__).resolve().parents[1] / "notebooks" / "recorded"


def _timeline(cap_from_s=0.4, ramp_s=1.2, cap_rested=False, thermal=False, clock_drop=True):
    """Readings as boost.power_timeline records them: idle, 3 s back to back, idle, 3 s of rested steps."""
    samples = []
    for i in range(100):
        samples.append({"phase": "rest", "t_s": i * 0.01, "computing": False, "clock_mhz": 345.0,
                        "power_w": 80.0, "temperature_c": 40.0, "reasons": 0x1})
    for i in range(300):
        t = i * 0.01
        capped = cap_from_s is not None and t >= cap_from_s
        samples.append({"phase": "back to back", "t_s": t, "computing": True,
                        "clock_mhz": 1530.0 if (capped and clock_drop) else 1980.0,
                        "power_w": 200.0 + 180.0 * min(1.0, t / ramp_s), "temperature_c": 55.0 + 3 * t,
                        "reasons": (CAP if capped else 0) | (THERMAL if thermal else 0)})
    for i in range(300):
        t = i * 0.01
        computing = (i // 9) % 2 == 1
        samples.append({"phase": "rested steps", "t_s": t, "computing": computing, "clock_mhz": 1920.0,
                        "power_w": 300.0, "temperature_c": 50.0, "reasons": CAP if cap_rested else 0})
    return {"samples": samples, "rest_s": 3.0, "run_s": 3.0, "pause_ms": 85.0, "power_limit_w": 700.0,
            "step_ms": {"back to back": [85.0] * 30, "rested steps": [78.0] * 18}}


def _verdicts(data) -> dict[str, str]:
    return {v.claim: v.verdict for v in lab_claims.power_timeline_verdicts(data)}


def test_a_cap_that_comes_early_and_a_reading_that_lags():
    v = _verdicts(_timeline())
    assert v["Back to back, the power limit holds the SM clock down (NVML reports the software power cap)"] == "TRUE"
    assert v["When the power cap comes on, NVML's power reading has not reached its level yet (it is an average "
             "that lags)"] == "TRUE"
    assert v["A GPU that has rested computes its first step at a higher SM clock than it keeps back to back"] == "TRUE"
    assert v["Resting between steps lifts the power cap"] == "TRUE"
    assert not any("thermal" in c for c in v)   # a slowdown is a reason in the table, not a verdict


def test_no_cap_a_cap_after_the_reading_settled_and_a_cap_that_rest_does_not_lift():
    never = _verdicts(_timeline(cap_from_s=None, clock_drop=False))
    assert never["Back to back, the power limit holds the SM clock down (NVML reports the software power cap)"] == "FALSE"
    assert never["A GPU that has rested computes its first step at a higher SM clock than it keeps back to back"] \
        == "FALSE"
    assert not any("lags" in c for c in never)   # no onset: nothing to compare the reading with
    late = _verdicts(_timeline(cap_from_s=2.0, ramp_s=0.5))
    assert late["When the power cap comes on, NVML's power reading has not reached its level yet (it is an average "
                "that lags)"] == "FALSE"
    assert late["Back to back, the power limit holds the SM clock down (NVML reports the software power cap)"] == "FALSE"
    kept = _verdicts(_timeline(cap_rested=True, thermal=True))
    assert kept["Resting between steps lifts the power cap"] == "FALSE"
    rows = {r["phase"]: r for r in power.phase_table(_timeline(thermal=True)["samples"], boost.PHASES)}
    assert rows["back to back"]["software thermal slowdown: share"] == 1.0   # where a slowdown shows


def test_the_figures_say_when_and_at_what_reading():
    lines = {v.claim: v.figure for v in lab_claims.power_timeline_verdicts(_timeline())}
    assert "power cap from 0.40 s on, in 87% of 300 readings over 3 s back to back, limit 700 W" in lines[
        "Back to back, the power limit holds the SM clock down (NVML reports the software power cap)"]
    lag = next(f for c, f in lines.items() if "lags" in c)
    assert lag.startswith("power reading 260 W at the cap's onset (0.40 s), final 380 W, 90% of it reached at 0.95 s")


def test_without_readable_reasons_nothing_is_judged():
    data = _timeline()
    for s in data["samples"]:
        s["reasons"] = None
    assert lab_claims.power_timeline_verdicts(data) == []


def test_one_claim_one_rule_on_both_measurements():
    """The step study (04_boost_one_gpu) and the timeline judge the shared claims with the same rule."""
    step = {v.claim: v.rule for v in lab_claims.boost_verdicts(
        json.loads((RECORDED / "04_boost_one_gpu.json").read_text())["data"])}
    timeline = {v.claim: v.rule for v in lab_claims.power_timeline_verdicts(_timeline())}
    shared = set(step) & set(timeline)
    assert len(shared) == 2 and all(step[c] == timeline[c] for c in shared)


def test_power_helpers():
    data = _timeline()
    assert power.onset_s(data["samples"], "back to back", "software power cap") == pytest.approx(0.4)
    assert power.power_ramp(data["samples"], "back to back")["ramp_s"] == pytest.approx(0.95)
    rows = power.phase_table(data["samples"], boost.PHASES)
    assert [r["phase"] for r in rows] == ["rest", "back to back", "rested steps"]
    assert rows[0]["GPU idle: share"] == 1.0 and rows[1]["software power cap: from (s)"] == pytest.approx(0.4)
    assert power.share([], "software power cap") is None


def test_power_timeline_needs_a_gpu():
    with pytest.raises(RuntimeError, match="needs a CUDA device.*HINT"):
        boost.power_timeline(device="cpu")


def test_the_timeline_awaits_its_recording():
    """Its verdicts join CLAIMS (and tests/test_claims.py) once the recording exists."""
    assert "04_power_timeline" in lab_claims.AWAITING_RECORDING
    assert ("04_power_timeline" in lab_claims.CLAIMS) == (RECORDED / "04_power_timeline.json").exists()
