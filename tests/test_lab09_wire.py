"""Lab 09's bookkeeping: SavedTensors (activations kept for backward) and the activation-memory
prediction, without ranks (the bytes on the wire: tests/test_lab09.py and tests/test_instruments_ledger.py).

Run: pytest tests/test_lab09_wire.py -q
"""
from __future__ import annotations

import pytest
import torch
from torch import nn

from labutils.labs.lab09_all_to_all import wire


def test_saved_tensors_counts_distinct_storages_without_parameters():
    layer = nn.Linear(4, 8)
    x = torch.randn(5, 4, requires_grad=True)
    with wire.SavedTensors(exclude=layer.parameters()) as saved:
        h = layer(x)
        y = torch.nn.functional.gelu(h) * h     # h saved twice (gelu and mul): counted once
    assert saved.nbytes == x.numel() * 4 + h.numel() * 4 + y.numel() * 4   # x, h, gelu(h)
    assert all(dtype == "float32" for _, dtype, _ in saved.tensors)


def test_saved_tensors_skips_parameters_of_any_kind():
    layer = nn.LayerNorm(4)
    with wire.SavedTensors(exclude=layer.parameters()) as saved:
        layer(torch.randn(3, 4, requires_grad=True))
    assert saved.nbytes == 3 * 4 * 4 + 2 * 3 * 4       # input, mean and 1/std; not weight, bias


def test_prediction_matches_the_shapes_and_sp_splits_the_hidden_wide_activations():
    tp = wire.saved_bytes_predicted(8, 4, 16, 2, itemsize=2, sequence_parallel=False, mask_bytes=1)
    sp = wire.saved_bytes_predicted(8, 4, 16, 2, itemsize=2, sequence_parallel=True, mask_bytes=1)
    assert tp["total"] == 8 * 4 * 2 + 2 * 8 * 4 + 8 * 4 * 2 + 2 * 8 * 8 * 2 + 8 * 4
    assert tp["total"] - sp["total"] == (8 * 4 * 2 + 2 * 8 * 4 + 8 * 4) // 2
    assert tp["GeLU input"] == sp["GeLU input"]


def test_prediction_refuses_shapes_that_do_not_split():
    with pytest.raises(ValueError, match="divisible by world_size"):
        wire.saved_bytes_predicted(7, 4, 16, 2, itemsize=2, sequence_parallel=True, mask_bytes=1)


def test_dropout_mask_bytes():
    assert wire.dropout_mask_bytes("cuda", 2) == 1
    assert wire.dropout_mask_bytes("cpu", 4) == 4
