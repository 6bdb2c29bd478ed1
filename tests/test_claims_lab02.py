"""Lab 02's cost-model verdicts (``claims.model_verdicts``): the model t_1 / p + 2 all-reduces and its
communication term, each judged at every width measured. TRUE on data where the step is what the model says,
FALSE on the recordings (the narrow widths are a fixed cost the model has no term for) and on data where only
the wide widths agree.

Run: pytest tests/test_claims_lab02.py -q     (CPU, a second)
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

from labutils.labs.lab02_tensor_parallel import claims as lab_claims

RECORDED = Path(__file__).resolve().parents[1] / "notebooks" / "recorded"
MODEL = "t_1 / p + 2 all-reduces (section 2's fit) predicts the TP step (forward + backward), at every width"
COMM = "its communication term, 2 all-reduces at section 2's fit, is what the TP step takes beyond t_1 / p, at every width"


def _recorded(name):
    return json.loads((RECORDED / f"{name}.json").read_text())["data"]


def _verdicts(tp) -> dict:
    return {v.claim: v for v in lab_claims.tp_verdicts(_recorded("02_collectives"), tp)}


def _as_the_model_says(scale_comm: float, widths=None) -> dict:
    """The recorded TP rows with each step set to t_1 / p + scale_comm x the model's 2 all-reduces (at the
    ``widths`` given; the others keep their measured step)."""
    tp = copy.deepcopy(_recorded("02_tp_mlp"))
    fit = lab_claims.allreduce_fit(_recorded("02_collectives"))
    for r in tp["rows"]:
        if widths is None or r["hidden"] in widths:
            t = lab_claims.model_terms(r, tp["world_size"], fit)
            r["tp_train_ms"] = t["compute_ms"] + scale_comm * t["comm_ms"]
    return tp


def test_the_recordings_contradict_the_model_at_the_narrow_widths():
    v = _verdicts(_recorded("02_tp_mlp"))
    assert v[MODEL].verdict == "FALSE" and v[COMM].verdict == "FALSE"
    assert v[MODEL].figure.startswith("worst 281% off at hidden 512")
    assert "hidden 16384 1.18% off" in v[MODEL].figure      # where t_1 / p alone is nearly the whole step
    assert v[COMM].figure.startswith("worst 923% off at hidden 512")


def test_a_step_that_is_what_the_model_says_is_true():
    v = _verdicts(_as_the_model_says(1.2))
    assert v[MODEL].verdict == "TRUE" and v[COMM].verdict == "TRUE"


def test_the_communication_term_can_fail_where_the_whole_step_agrees():
    """1.6 x the model's all-reduces at every width: the whole step stays within a quarter (t_1 / p is most of
    it), the communication term does not -- the verdict the whole step alone could never give."""
    v = _verdicts(_as_the_model_says(1.6))
    assert v[MODEL].verdict == "TRUE"
    assert v[COMM].verdict == "FALSE" and "hidden 16384 60% off" in v[COMM].figure
    assert _verdicts(_as_the_model_says(2.0, widths={8192, 16384}))[MODEL].verdict == "FALSE"  # narrow ones unchanged


def test_the_rule_is_the_same_for_both():
    v = _verdicts(_recorded("02_tp_mlp"))
    assert v[MODEL].rule == v[COMM].rule == f"TRUE if every point <= {100 * lab_claims.MODEL_TOL:g}"
