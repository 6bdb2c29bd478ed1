"""labutils.compat: the renamed all-gather / reduce-scatter are called under the name this torch has, with no
warning, and the ledger counts them the same under either name (real gloo ranks).

Run: pytest -n 0 tests/test_compat.py -q
"""
from __future__ import annotations

import sys
import warnings

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from labutils import compat

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

NEW = hasattr(dist, "all_gather_single")   # torch >= 2.13


def test_the_names_this_torch_prefers():
    assert compat.ALL_GATHER_NAME == ("all_gather_single" if NEW else "all_gather_into_tensor")
    assert compat.REDUCE_SCATTER_NAME == ("reduce_scatter_single" if NEW else "reduce_scatter_tensor")
    assert compat.torch_function("all_gather_into_tensor") is getattr(dist, compat.ALL_GATHER_NAME)
    assert compat.torch_function("reduce_scatter_tensor") is getattr(dist, compat.REDUCE_SCATTER_NAME)
    with pytest.raises(ValueError, match="no renamed torch.distributed function 'all_reduce'. HINT: one of"):
        compat.preferred_name("all_reduce")


def test_an_older_torch_gets_the_old_names(monkeypatch):
    for new in ("all_gather_single", "reduce_scatter_single"):
        monkeypatch.delattr(dist, new, raising=False)          # as torch 2.4 .. 2.12 are
    assert compat.preferred_name("all_gather_into_tensor") == "all_gather_into_tensor"
    assert compat.preferred_name("reduce_scatter_tensor") == "reduce_scatter_tensor"


class _Ops(compat.TorchDispatchMode):
    """The c10d operators a call dispatches (what the ledger keys on)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func.overloadpacket).startswith("c10d."):
            self.names.append(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


def _calls(rank, world_size):
    from labutils.instruments.ledger import Ledger
    n = world_size
    x = torch.full((4,), float(rank))
    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gathered, shard = torch.empty(4 * n), torch.empty(4)
        with Ledger() as book, _Ops() as ops:
            compat.all_gather_into_tensor(gathered, x)
            compat.reduce_scatter_tensor(shard, torch.arange(4.0 * n))
            compat.torch_function("all_gather_into_tensor")(gathered, x)
        out["compat"] = ([str(w.message) for w in caught], ops.names,
                         [(r.op, r.size_bytes, r.wire_bytes) for r in book.records],
                         gathered.tolist(), shard.tolist())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with Ledger() as book, _Ops() as ops:
            dist.all_gather_into_tensor(gathered, x)               # the old names, deprecated in 2.13
            dist.reduce_scatter_tensor(shard, torch.arange(4.0 * n))
        out["old"] = ([w.category.__name__ for w in caught], ops.names,
                      [(r.op, r.size_bytes, r.wire_bytes) for r in book.records])
    return out


def test_compat_calls_warn_nothing_and_the_ledger_counts_both_names_alike(gloo3):
    n = 3
    for rank, out in enumerate(gloo3.run(_calls)):
        warned, ops, records, gathered, shard = out["compat"]
        assert warned == []
        assert gathered == [float(r) for r in range(n) for _ in range(4)]
        assert shard == [n * (4.0 * rank + i) for i in range(4)]          # the sum of n aranges, my block
        assert ops == ["c10d._allgather_base_", "c10d._reduce_scatter_base_", "c10d._allgather_base_"]
        s_ag, s_rs = 16 * n, 16 * n            # S: the gathered output, the reduce-scatter's input
        assert records == [("all_gather", s_ag, pytest.approx((n - 1) / n * s_ag)),
                           ("reduce_scatter", s_rs, pytest.approx((n - 1) / n * s_rs)),
                           ("all_gather", s_ag, pytest.approx((n - 1) / n * s_ag))]
        old_warned, old_ops, old_records = out["old"]
        assert old_ops == ops[:2] and old_records == records[:2]          # the same op, seen the same
        assert old_warned == (["FutureWarning", "FutureWarning"] if NEW else [])
