"""Tensor parallelism on real GPUs (NCCL, one GPU per rank); skipped without 2 CUDA GPUs.

Run: pytest tests/gpu/test_tensor_parallel_gpu.py -q   (one launch, about 20 s on 2xH200)
The same checks run on gloo in tests/test_tensor_parallel.py; here the NCCL paths are exercised:
CUDA tensors, CUDA-event timing inside a step, NCCL's unequal-size list all_gather.
"""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch

import labutils
from labutils.labs.lab02_tensor_parallel import comm, measure, verify
from labutils.labs.lab02_tensor_parallel.layers import TensorParallelMLP, reference_mlp

from conftest import gpu_count, needs_gpus

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

pytestmark = needs_gpus(2)


def _bf16_close(rank, world_size):
    """bf16 TP MLP vs the same weights on one GPU: equal up to bf16 rounding of the partial sums."""
    dev = torch.device("cuda", rank)
    ref = reference_mlp(256, seed=0, device=dev, dtype=torch.bfloat16)
    tp = TensorParallelMLP.from_sequential(ref)
    x = torch.randn(64, 256, generator=torch.Generator().manual_seed(1)).to(dev, torch.bfloat16)
    torch.testing.assert_close(tp(x), ref(x), rtol=2e-2, atol=2e-2)
    return True


def _timer_on_cuda(rank, world_size):
    timer = comm.CommTimer(enabled=True)
    mlp = TensorParallelMLP(512, timer=timer, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(128, 512, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    mlp(x).float().sum().backward()
    return timer.times_ms()


def _all(rank, world_size):
    return {"verify": verify.verify_mlp(rank, world_size),
            "bf16": _bf16_close(rank, world_size),
            "timer": _timer_on_cuda(rank, world_size),
            "uneven": verify.uneven_list_gather(rank, world_size, rows=7, cols=3),
            "gather_uneven": torch.equal(
                comm.all_gather_uneven(torch.full((rank + 1, 2), float(rank), device="cuda")).cpu(),
                torch.cat([torch.full((r + 1, 2), float(r)) for r in range(world_size)])),
            "sweep": measure.collective_sweep(rank, world_size, [2**12, 2**20], warmup=2, iters=5, repeat=3),
            "objects": measure.object_vs_tensor(rank, world_size, [2**16], repeat=2, link_iters=2),
            "imbalance": measure.imbalance_sweep(rank, world_size, [1, 3], steps=5),
            "mlp": measure.tp_mlp_sweep(rank, world_size, [256], tokens=256, target_ms=2.0)}


@pytest.fixture(scope="module")
def results():
    return labutils.launch(_all, world_size=gpu_count(), backend="nccl", timeout=240)


def test_mlp_forward_and_backward_match_sequential_on_nccl(results):
    assert all(v == "assert_close OK" for r in results for v in r["verify"].values()), results[0]["verify"]


def test_bf16_mlp_is_close(results):
    assert all(r["bf16"] for r in results)


def test_comm_timer_times_both_all_reduces_with_cuda_events(results):
    times = results[0]["timer"]
    assert sorted(times) == ["all_reduce bwd", "all_reduce fwd"]
    assert all(len(v) == 1 and 0 < v[0] < 1000 for v in times.values())


def test_nccl_gathers_unequal_lists_and_gloo_refuses(results):
    assert results[0]["uneven"]["nccl"] == "works, gathered == original: True"
    assert "invalid tensor size" in results[0]["uneven"]["gloo"]
    assert all(r["gather_uneven"] for r in results)


def test_measurements_are_positive_and_consistent(results):
    sweep = results[0]["sweep"]["ops"]
    assert all(t > 0 for op in sweep.values() for t in op["time_ms"])
    rows = results[0]["objects"]["rows"]
    assert rows[0]["object_ms"] > rows[0]["tensor_ms"] > 0
    assert rows[0]["received_devices"] == [f"cuda:{r}" for r in range(gpu_count())]
    (row,) = results[0]["mlp"]
    assert all(row[k] > 0 for k in ("one_gpu_fwd_ms", "tp_fwd_ms", "tp_train_ms", "allreduce_fwd_ms"))
    steps = results[0]["imbalance"]["step_ms"]
    assert max(steps[1]) > max(steps[0])  # rank 0 with 3x the rows makes every step longer


def test_nvlink_counter_sees_the_gathered_bytes_when_available(results):
    link = results[0]["objects"]["link"]
    b = link["tensor_link_bytes_per_call"]
    if b is None:
        pytest.skip("NVML NVLink data counter not available here")
    assert 0.5 * link["payload_bytes_per_call"] < b < 4 * link["payload_bytes_per_call"]
