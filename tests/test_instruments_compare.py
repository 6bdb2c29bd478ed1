"""labutils.instruments.compare: close / mismatch on tensors, lists of tensors and None.

Run: pytest -n 0 tests/test_instruments_compare.py -q
"""
from __future__ import annotations

import torch

from labutils.instruments import compare


def test_close_and_mismatch_agree():
    a = torch.ones(3, dtype=torch.float64)
    assert compare.close(a, a.clone()) and compare.mismatch(a, a.clone()) is None
    assert not compare.close(a, a + 1)
    assert compare.mismatch(a, a + 1) == "Tensor-likes are not close!"
    assert compare.close(a, a + 1e-3, rtol=1e-2, atol=0)                  # assert_close's tolerances
    assert compare.close([a, 2 * a], [a.clone(), 2 * a.clone()])        # lists of tensors
    assert not compare.close([a], [a, a])                                # a missing tensor is a mismatch
    w = torch.ones(2, requires_grad=True)
    assert compare.close(w * 1, torch.ones(2))                           # autograd history is no difference


def test_none_matches_only_none():
    assert compare.close(None, None)
    assert compare.mismatch(None, torch.ones(1)) == compare.MISSING
    assert not compare.close(torch.ones(1), None)


def test_report_prints_once_per_statement_and_says_where_ranks_differ(capsys):
    import pickle
    import pytest
    bad = compare.mismatch(torch.ones(2), torch.zeros(2))
    assert isinstance(pickle.loads(pickle.dumps(bad)), compare.Mismatch)       # it travels back from a rank
    ranks = [{"y == reference": True, "calls": 2, "m = 4": {"output": "ok", "shape": (2, 3)}},
             {"y == reference": True, "calls": 2, "m = 4": {"output": bad, "shape": (2, 3)}}]
    compare.report(ranks, "check")
    assert compare.failures(ranks) == ["m = 4: output (rank 1)"]
    assert capsys.readouterr().out.splitlines() == [
        "check", "  y == reference: True", "  calls: 2",
        "  m = 4: output: ranks differ: rank 0 ok, rank 1 Tensor-likes are not close!", "  m = 4: shape: (2, 3)"]
    compare.report([{"a": True}, {"a": True}], strict=True)
    assert capsys.readouterr().out == "a: True\n" and compare.failures([{"a": True, "b": 2}]) == []
    with pytest.raises(AssertionError, match=r"does not hold: a \(rank 1\)"):
        compare.report([{"a": True}, {"a": False}], strict=True)
    with pytest.raises(TypeError, match="float.*HINT"):
        compare.report([{"time_ms": 1.5}])
