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
