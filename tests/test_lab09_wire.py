"""Lab 09's bookkeeping: WireLedger (bytes on the wire), SavedTensors (activations kept for backward) and
the activation-memory prediction. Pure tests, plus one launch of 3 real gloo ranks.

Run: pytest tests/test_lab09_wire.py -q
"""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

import labutils
from labutils import compat
from labutils.labs.lab09_all_to_all import wire

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file


def _ledger_rank(rank, world_size):
    """Every collective the ledger knows, once, with sizes chosen so that each row is recognisable."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    n = world_size
    x = torch.ones(6 * n, dtype=torch.float32)                       # 24 * n bytes
    with wire.WireLedger("p") as ledger:
        dist.all_reduce(x.clone())
        compat.all_gather_into_tensor(torch.empty(6 * n * n), x)      # S = gathered output
        compat.reduce_scatter_tensor(torch.empty(6), x.clone())        # S = input
        dist.all_to_all_single(torch.empty_like(x), x)                 # even: (n-1)/n of S leaves
        splits = [rank + 1 if j == rank else 1 for j in range(n)]      # keep rank+1 rows, send 1 to each peer
        recv = [rank + 1 if i == rank else 1 for i in range(n)]
        dist.all_to_all_single(torch.empty(sum(recv)), torch.ones(sum(splits)), recv, splits)
        dist.broadcast(x.clone(), src=0)
    mesh = init_device_mesh("cpu", (n,))
    d = distribute_tensor(torch.ones(2 * n, 3), mesh, [Shard(0)])
    with wire.WireLedger("dtensor") as dt:
        d.redistribute(mesh, [Replicate()]).to_local()               # a functional all-gather
    return [(r.op, r.size_bytes, r.wire_bytes) for r in ledger.records], dt.rows()


def test_ledger_counts_every_collective_with_nccl_tests_factors():
    n = 3
    records, dtensor = labutils.launch(_ledger_rank, world_size=n, backend="gloo", timeout=120, output="quiet")[1]
    s = 24 * n
    assert records == [("all_reduce", s, 2 * (n - 1) / n * s),
                       ("all_gather", s * n, (n - 1) / n * s * n),
                       ("reduce_scatter", s, (n - 1) / n * s),
                       ("all_to_all", s, (n - 1) / n * s),
                       ("all_to_all", (n - 1 + 2) * 4, (n - 1) * 4),   # rank 1 keeps 2 rows, sends 1 to each peer
                       ("broadcast", s, s)]
    assert dtensor == [{"phase": "dtensor", "op": "all_gather", "calls": 1, "size_bytes": 2 * n * 3 * 4,
                        "wire_bytes": (n - 1) / n * 2 * n * 3 * 4}]


def test_ledger_rows_group_by_phase_and_op():
    ledger = wire.WireLedger("fwd", world_size=2, rank=0)
    ledger._add("all_reduce", 100, 100.0)
    ledger._add("all_reduce", 50, 50.0)
    ledger._add("all_gather", 8, 4.0)
    assert ledger.rows() == [{"phase": "fwd", "op": "all_reduce", "calls": 2, "size_bytes": 150, "wire_bytes": 150.0},
                             {"phase": "fwd", "op": "all_gather", "calls": 1, "size_bytes": 8, "wire_bytes": 4.0}]
    assert ledger.wire_bytes() == 154.0


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
