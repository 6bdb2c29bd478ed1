"""Lab 01 on real GPUs: torch.cuda.comm's results against CPU references, the NCCL vs fallback
rules, the kernels each call launches, and the measurement functions (small sizes, no timing
asserts). Skipped unless the machine has enough GPUs.

Run: pytest tests/gpu/test_lab01_gpu.py -q     (>= 2 GPUs; about 20 s, mostly NCCL/CUPTI start-up)
"""
from __future__ import annotations

import json

import pytest
import torch

from labutils.labs.lab01_cuda_comm import analysis, devices, measure, verify
from labutils.labs.lab01_cuda_comm import claims as lab_claims
from labutils.checks import lab01 as check
from labutils.solutions import lab01 as solutions

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def setup():
    return devices.gpu_setup()


@needs_gpus(2)
def test_every_api_call_matches_its_cpu_reference(setup):
    rec = json.loads(json.dumps(verify.api_examples(setup)))
    lines = verify.check_api(rec)
    assert all(line.startswith("✓") for line in lines), lines


@needs_gpus(2)
def test_nccl_path_raises_on_mixed_dtypes_and_the_fallback_converts(setup):
    rules = verify.dtype_rules(setup)
    nccl_mixed = rules["reduce_add fp32 (GPU 0) + fp16 (GPU 1)"]
    assert nccl_mixed["path"] == "NCCL"
    assert nccl_mixed["outcome"] == "raises RuntimeError: all inputs and outputs must be of the same Tensor dtype"
    fallback = rules["reduce_add fp32 + fp16, non-contiguous (.t())"]
    assert fallback["path"] == "fallback (copies)"
    assert fallback["outcome"] == "returns torch.float32 [[1.5, 3.5], [2.5, 4.5]]"
    assert rules["broadcast fp32 -> out=[fp16 on GPU 1]"]["outcome"].startswith("raises RuntimeError")
    assert rules["broadcast fp32 -> out=[fp16 on GPU 0, fp16 on GPU 1]"]["outcome"].startswith(
        "returns torch.float16")


@needs_gpus(2)
def test_nccl_all_reduce_needs_distinct_devices():
    from torch.cuda import nccl
    x = torch.ones(3, device="cuda:0")
    assert verify.error_text(lambda: nccl.all_reduce([x, x.clone()])) == \
        "raises RuntimeError: inputs must be on unique devices"


@needs_gpus(1)
def test_one_device_calls_do_not_copy():
    assert all(verify.one_device_examples(devices.gpu_setup(1)).values())


@needs_gpus(2)
def test_profiled_kernels_show_nccl_and_peer_copies(setup):
    ops = measure.profile_ops(setup, 1 << 20)
    kinds = {op: {k["kind"] for k in ks} for op, ks in ops.items()}
    assert "nccl" in kinds["comm.broadcast"] and "nccl" in kinds["torch.cuda.nccl.all_reduce"]
    assert "nccl" in kinds["comm.reduce_add"]
    assert kinds["x.to(peer)"] == {"peer copy"}
    assert "nccl" not in kinds["comm.broadcast(out=) incl. source GPU"]
    assert {k["device"] for k in ops["comm.broadcast"]} == set(setup.devices)


@needs_gpus(2)
def test_measurements_return_data_the_analysis_can_read(setup, tmp_path):
    # up to 256 MiB: with smaller sizes a loaded machine (pytest -n 10) can hide the slope
    sweep = measure.sweep(setup, [1 << 12, 1 << 20, 1 << 24, 1 << 28])
    assert all(t > 0 for d in sweep["ops"].values() for t in d["median_ms"])
    fit = analysis.fits(sweep)["comm.broadcast"]
    assert fit.alpha_us >= 0 and fit.beta_gbps > 0
    dtypes = measure.dtype_costs(setup, numel=1 << 20)
    many = measure.many_small(setup, total_bytes=1 << 20, counts=(1, 64))
    assert many["host_steps"]["count"] == 64
    red = measure.redundant(setup, sizes_bytes=(1 << 12, 1 << 20))
    profile = {"ops": measure.profile_ops(setup, 1 << 20)}
    verdicts = (lab_claims.tip1_verdicts(sweep) + lab_claims.dtype_verdicts({"rules": verify.dtype_rules(setup)}, dtypes)
                + lab_claims.many_verdicts(many) + lab_claims.redundant_verdicts(red, profile))
    assert len(verdicts) >= 12 and all(v.verdict in ("TRUE", "FALSE") for v in verdicts)
    switched_off = [v for v in verdicts if "switches NCCL off" in v.claim]
    assert [v.verdict for v in switched_off] == ["TRUE"]
    out = measure.profile_kernels(lambda: torch.ones(8, device="cuda:0") + 1, setup,
                                trace_path=tmp_path / "t.json", table_rows=5)
    assert out["kernels"] and (tmp_path / "t.json").stat().st_size > 0


@needs_gpus(2)
def test_checkers_pass_the_solutions_on_gpus(setup):
    check.all_reduce(solutions.all_reduce_from_reduce_add, setup)
    check.broadcast_many(solutions.broadcast_many, setup)


@needs_gpus(2)
def test_one_nccl_broadcast_into_a_flat_buffer_fills_its_views(setup):
    sources = [torch.randn(64, 32, device="cuda:0"), torch.randn(32, device="cuda:0")]
    flat0, _ = solutions.flat_views(sources)
    flat1, views1 = solutions.flat_views([torch.zeros(t.shape, device="cuda:1") for t in sources])
    assert setup.nccl.is_available([flat0, flat1])            # the NCCL path: one contiguous tensor per GPU
    setup.comm.broadcast(flat0, out=[flat1])
    assert all(torch.equal(a.cpu(), b.cpu()) for a, b in zip(sources, views1))
