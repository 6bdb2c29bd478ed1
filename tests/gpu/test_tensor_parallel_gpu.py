"""Lab 02 on real GPUs (NCCL, one GPU per rank); skipped without 2 CUDA GPUs.

Run: pytest tests/gpu/test_tensor_parallel_gpu.py -q   (one NCCL pool, one run of the source's program)
The notebook's own classes (taken from its source) on CUDA tensors and NCCL: the checks of
tests/test_tensor_parallel.py, bf16 closeness, the profiler's per-call all-reduce kernel times, the paths
between the GPUs (copy engine, send/recv, communicators with fixed CTA counts, one process driving two
GPUs timed alone), NCCL's unequal-size list
all_gather and the DETAIL shape check -- and the source's program run as written.
"""
from __future__ import annotations

import ast
import sys

import cloudpickle
import jupytext
import pytest
import torch

import labutils
from labutils.instruments import compare
from labutils.labs.lab02_tensor_parallel import paths, script, steps, verify

from gpus import gpu_count, needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)
from notebook_defs import ROOT, load_definitions

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

pytestmark = needs_gpus(2)
nb = load_definitions("02_tensor_parallel")


def _source_program() -> str:
    """The notebook's SOURCE_PROGRAM string (a plain assignment, which load_definitions leaves out)."""
    for cell in jupytext.read(ROOT / "notebooks" / "src" / "02_tensor_parallel.py").cells:
        for node in ast.parse(cell.source).body if cell.cell_type == "code" else []:
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SOURCE_PROGRAM":
                return ast.literal_eval(node.value)
    raise AssertionError("SOURCE_PROGRAM not found in the notebook source")


def _bf16_close(rank, world_size, TensorParallelMLP):
    """bf16 TP MLP vs the same weights on one GPU: equal up to bf16 rounding of the partial sums."""
    ref = verify.reference_mlp(256, 1024, seed=0, device=torch.device("cuda", rank), dtype=torch.bfloat16)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)).to(ref[0].weight.device, torch.bfloat16)
    torch.testing.assert_close(TensorParallelMLP(ref)(x), ref(x), rtol=2e-2, atol=2e-2)
    return True


@pytest.fixture(scope="module")
def pool():
    with labutils.RankPool(world_size=gpu_count(), backend="nccl", output="quiet") as p:
        yield p


@pytest.mark.parametrize("check, classes", [
    (verify.operators, ("CopyToTP", "ReduceFromTP")), (verify.column_parallel, ("ColumnParallelLinear",)),
    (verify.row_parallel, ("RowParallelLinear",)), (verify.mlp, ("TensorParallelMLP",))])
def test_notebook_code_matches_one_device_on_nccl(pool, check, classes):
    n = gpu_count()
    if check is not verify.operators and 12 % n:
        pytest.skip(f"the layer checks use 12 features, which {n} ranks do not divide")
    compare.report(pool.run(check, *[getattr(nb, c) for c in classes]), strict=True)


def test_bf16_mlp_is_close(pool):
    assert all(pool.run(_bf16_close, nb.TensorParallelMLP))


def test_fixed_program_and_detail_check_on_nccl(pool):
    assert all(all(c.values()) for c in pool.run(nb.tensor_parallel_fixed))
    for line in pool.run(nb.uneven_source_style):
        assert "caught a mismatch: True" in line and "padded all_gather == 2 x tensor: True" in line


def test_nccl_gathers_unequal_lists_and_gloo_refuses(pool):
    result = pool.run(verify.uneven_list_gather, kwargs=dict(rows=7, cols=3))[0]
    assert result["nccl"] == "works, gathered == original: True"
    assert "invalid tensor size" in result["gloo"]


def test_profiled_steps_give_per_call_kernel_times(pool):
    rows = pool.run(steps.tp_mlp_sweep, nb.TensorParallelMLP, [256],
                    kwargs=dict(tokens=256, target_ms=2.0, repeat=3, profiled_steps=3))[0]
    (row,) = rows
    assert [len(c) for c in row["allreduce_fwd_calls_ms"]] == [3] * gpu_count()
    assert [len(c) for c in row["allreduce_train_calls_ms"]] == [6] * gpu_count()   # forward and backward
    assert 0 < row["allreduce_fwd_kernel_ms"] <= row["allreduce_fwd_ms"]
    assert row["allreduce_fwd_wait_ms"] >= 0


def test_link_paths_measure_every_path(pool):
    every = pool.run(paths.link_paths, 64 * 2**20, kwargs=dict(ctas=(8,), warmup=1, iters=2, repeat=2))
    link = every[0]
    names = {r["path"] for r in link["rows"]}
    assert {"copy engine, one way", "copy engine, both ways", "NCCL send/recv, both ways",
            "all_gather_into_tensor", "all_gather_into_tensor, 8 CTAs", "all_reduce, 8 CTAs", paths.ONE_PROCESS} <= names
    assert all(r["gbps_per_direction"] > 0 for r in link["rows"])
    # the one-process all-gather is timed by rank 0 alone (time_alone) and shared: the same row on every rank
    alone = [next(r for r in x["rows"] if r["path"] == paths.ONE_PROCESS) for x in every]
    assert all(a == alone[0] for a in alone)


def test_source_program_as_written_fails_on_cpu_tensors():
    out = script.run_program(_source_program(), timeout_s=120)
    assert out["raised"] and not out["timed_out"], out
    assert out["exc_type"] == "RuntimeError" and "cpu" in out["message"].lower(), out
