"""Lab 09 on real GPUs (NCCL, one GPU per rank); skipped without 2 CUDA GPUs.

Run: pytest tests/gpu/test_lab09_gpu.py -q   (one NCCL rank pool, about 20 s on 2xH200)
The same checks run on gloo in tests/test_lab09.py; here the NCCL paths are exercised: uneven and empty
all-to-all blocks, float64 and int64 collectives, DTensor on a CUDA mesh, backward collectives seen by
the communication ledger from autograd's device threads, CUDA's bool dropout mask, the allocator statistics.
"""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils.instruments import compare
from labutils.labs.lab09_all_to_all import measure, verify
from labutils.solutions import lab09 as solution

from gpus import gpu_count, needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)
from notebook_defs import load_definitions

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

pytestmark = needs_gpus(2)
nb = load_definitions("09_all_to_all_and_sequence_parallel")
FAST = dict(warmup=1, iters=2, repeat=2)


@pytest.fixture(scope="module")
def pool():
    with labutils.RankPool(world_size=min(gpu_count(), 8), backend="nccl", output="quiet") as p:
        yield p


def _all_true(reports) -> bool:
    return not compare.failures(reports)


def test_layouts_on_nccl(pool):
    rows = pool.run(nb.exchange_layouts)
    n = len(rows)
    for r, row in enumerate(rows):
        assert row["even: after"] == [10 * s + 2 * r + k for s in range(n) for k in range(2)]


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_k=2), dict(top_k=1, router_bias=50.0)],
                         ids=["top1", "top2", "empty-ranks"])
def test_expert_parallel_moe_on_nccl(pool, kw):
    assert _all_true(pool.run(verify.moe_matches, nb.MoE, nb.ExpertParallelMoE, kwargs=kw))


def test_sequence_parallel_and_dtensor_on_nccl(pool):
    assert _all_true(pool.run(verify.block_matches, nb.Block, nb.ParallelBlock, kwargs=dict(sequence_parallel=False)))
    assert _all_true(pool.run(verify.block_matches, nb.Block, nb.ParallelBlock,
                              kwargs=dict(sequence_parallel=True, sync=solution.sync_sp_grads)))
    assert _all_true(pool.run(verify.dtensor_matches, nb.Block, nb.ParallelBlock, nb.tp_plan,
                              kwargs=dict(sequence_parallel=False)))
    assert _all_true(pool.run(verify.dtensor_matches, nb.Block, nb.ParallelBlock, solution.sp_plan,
                              kwargs=dict(sequence_parallel=True)))


def test_dtensor_sp_step_sums_its_partial_gradients_on_nccl(pool):
    for r in pool.run(verify.dtensor_step_sums_like_hand_written, nb.Block, nb.ParallelBlock, solution.sp_plan,
                      solution.sync_sp_grads):
        assert all(r["after"].values()) and not r["before"]["norm.weight"], r
        assert "Partial" not in "".join(r["placements"].values())


def test_ledger_sees_backward_collectives_on_cuda(pool):
    rows = pool.run(verify.traffic, nb.Block, nb.ParallelBlock,
                    kwargs=dict(sync=solution.sync_sp_grads,
                                plans={"DTensor TP": (nb.tp_plan, False), "DTensor SP": (solution.sp_plan, True)}))[0]
    phases = {(r["layer"], r["phase"]) for r in rows}
    for layer in ("TP", "SP", "DTensor TP", "DTensor SP"):
        assert (layer, "backward") in phases
    total = {}
    for r in rows:
        if r["phase"] != "gradient sync":
            total[r["layer"]] = total.get(r["layer"], 0) + r["wire_bytes"]
    assert total["TP"] == pytest.approx(total["SP"]) == pytest.approx(total["DTensor SP"])


def test_saved_activations_with_cuda_dropout(pool):
    for report in pool.run(verify.saved_activations, nb.Block, nb.ParallelBlock):
        assert report["TP"]["counted"] == report["TP"]["predicted"]
        assert report["SP"]["counted"] == report["SP"]["predicted"]
        assert any(dtype == "bool" for _, dtype, _ in report["TP"]["tensors"])   # the fused kernel's mask


def _p2p_solutions(rank, world_size):
    n = world_size
    splits = [[0 if (r + j) % 3 == 0 else r + j for j in range(n)] for r in range(n)]   # empty blocks
    ins, outs = splits[rank], [splits[s][rank] for s in range(n)]
    x = (torch.arange(sum(ins) * 2, device="cuda", dtype=torch.float32) + 100 * rank).reshape(-1, 2)
    want = x.new_empty((sum(outs), 2))
    dist.all_to_all_single(want, x, outs, ins)
    got = torch.full_like(want, -1.0)
    solution.all_to_all_single_p2p(got, x, outs, ins)
    dest = torch.tensor([0, 0, 0, n - 1], device="cuda")
    received, kept = solution.dispatch_with_capacity(torch.ones(4, 2, device="cuda"), dest, 2)
    return bool(torch.equal(got, want)), list(received.shape), kept.tolist()


def test_exercise_solutions_on_nccl(pool):
    results = pool.run(_p2p_solutions)
    for equal, shape, kept in results:
        assert equal
        assert shape == [2 * len(results), 2]
        assert kept[:3] == [True, True, False]


def test_measurements_on_nccl(pool):
    a2a = pool.run(measure.collective_sweep, [2**10, 2**20], kwargs=FAST)[0]
    assert a2a["wrong"] == 0 and all(t > 0 for t in a2a["ops"]["all_to_all_single"]["time_ms"])
    d = pool.run(measure.dispatch_sweep, nb.dispatch, [256, 1024], kwargs=dict(hidden=64, **FAST))[0]
    assert all(t > 0 for t in d["dispatch_ms"] + d["rows_only_ms"])
    s = pool.run(measure.skew_sweep, nb.MoE, nb.ExpertParallelMoE, nb.dispatch, [0.0, 50.0],
                 kwargs=dict(tokens=256, hidden=64, ffn=128, **FAST))[0]
    assert s["hot_share"][-1] == 1.0      # every token to expert 0: the other ranks receive nothing
    spans = zip(s["dispatch_p10_ms"], s["dispatch_ms"], s["dispatch_p90_ms"])
    assert all(lo <= mid <= hi for lo, mid, hi in spans)
    variants = {"TP": {"sequence_parallel": False}, "SP": {"sequence_parallel": True},
                "DTensor TP": {"sequence_parallel": False, "plan": nb.tp_plan},
                "DTensor SP": {"sequence_parallel": True, "plan": solution.sp_plan}}
    b = pool.run(measure.block_sweep, nb.Block, nb.ParallelBlock, variants, [1024],
                 kwargs=dict(sync=solution.sync_sp_grads, hidden=256, ffn=1024, **FAST))[0]
    for name in variants:
        m = b["memory"][name]
        assert m["held_bytes"] > 0 and m["peak_bytes"] >= m["held_bytes"]
    for name in ("TP", "SP"):
        m = b["memory"][name]
        assert m["saved_bytes"] == m["predicted_saved_bytes"]
        assert m["held_bytes"] == pytest.approx(m["predicted_held_bytes"], rel=0.05)
