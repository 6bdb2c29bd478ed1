"""Lab 08 on real GPUs: data parallelism by hand, DDP, ZeRO-1/2 and FSDP2 over NCCL against one device /
DDP (float64), the collective ledger and the profiler trace on CUDA, and the three measurement functions
on a small transformer (structure, volumes, memory ordering; no timing asserts). Skipped without 2 GPUs.

Run: pytest tests/gpu/test_lab08_gpu.py -q     (>= 2 GPUs; ~1 min, one NCCL pool for the module)
"""
from __future__ import annotations

import pytest
import torch

import labutils
from labutils.labs.lab08_data_parallel import claims as C
from labutils.labs.lab08_data_parallel import measure, reference, trace, verify
from labutils.labs.lab08_data_parallel import model as M
from labutils.solutions import lab08 as S

from conftest import gpu_count, needs_gpus  # tests/conftest.py (pytest puts tests/ on sys.path)

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

SMALL_BENCH = {"d_model": 256, "n_heads": 4, "n_layers": 4, "seq": 128, "batch_per_rank": 4, "warmup": 1,
               "repeat": 2, "bucket_caps_mb": [1, 64], "memory_rows": 1, "memory_seq": 16, "prefetch": 1}


@pytest.fixture(scope="module")
def pool():
    if gpu_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    with labutils.RankPool(world_size=2, backend="nccl", output="quiet", timeout=300) as p:
        yield p


def _train_ddp_factory():
    def train_ddp(rank, world_size, batches):
        from torch.nn.parallel import DistributedDataParallel as DDP
        from labutils.config import rank_device
        device = rank_device()
        ddp = DDP(M.build_convnet(device=device, seed=rank), device_ids=[device.index])
        opt = torch.optim.SGD(ddp.parameters(), lr=verify.LR)
        return reference.train_data_parallel(ddp, batches, opt, lambda m: None)
    return train_ddp


EXPECTED_FALSE = ("average, SGD with lr: == one device with N x lr", "sum, SGD with lr: == one device with lr",
                  "gradient_as_bucket_view=False: every p.grad is a view into DDP's bucket")


def _as_expected(results):
    """Every boolean statement on every rank is True, except those that must be False."""
    for r in results:
        for key, value in r.items():
            if isinstance(value, bool):
                assert value is (key not in EXPECTED_FALSE), key
    return results[0]


def test_by_hand_and_ddp_over_nccl(pool):
    _as_expected(pool.run(verify.check_by_hand, reference.replicate, reference.train_data_parallel,
                          {"average": S.average_gradients, "sum": reference.all_reduce_sum}))
    r = _as_expected(pool.run(verify.check_ddp, _train_ddp_factory(), reference.train_data_parallel,
                           reference.accumulate, S.average_gradients))
    assert r["4 micro-batches: all-reduce calls with no_sync"] == 1
    assert r["4 micro-batches: all-reduce calls without no_sync"] == 4


def test_zero_and_fsdp2_over_nccl(pool):
    r = _as_expected(pool.run(verify.check_zero, reference.shard_of, S.zero1_step, reference.zero2_attach,
                           reference.zero2_step, S.average_gradients))
    assert r["communication per step in Ψ: DDP by hand, ZeRO-1, ZeRO-2"] == "2.00, 2.00, 2.00"
    r = _as_expected(pool.run(verify.check_fsdp, reference.shard_transformer))
    assert r["FSDP2: communication per step in Ψ"] == "3.0"


def test_measurements_on_a_small_transformer(pool, tmp_path):
    d = measure.ddp(pool, SMALL_BENCH, trace_dir=tmp_path)
    assert d["compute_ms"] > 0 and all(r["step_ms"] > 0 and r["comm_ms"] > 0 for r in d["sweep"])
    assert all(r["volume_psi"] == pytest.approx(2.0, rel=0.01) for r in d["sweep"])
    assert d["sweep"][0]["n_buckets"] > d["sweep"][-1]["n_buckets"]
    view, no_view = min(d["sweep"], key=lambda r: r["step_ms"]), d["no_bucket_view"]
    assert no_view["state_bytes"] > view["state_bytes"]  # the bucket copy of the gradients
    for label, per_rank in d["traces"].items():
        assert len(per_rank) == 2
        for r, t in enumerate(per_rank):
            assert t["n_comm_kernels"] >= 1 and t["comm_ms"] > 0, label
            assert (tmp_path / t["file"]).exists() and t["file"].endswith(f"rank{r}.json.gz")
    assert set(d["traces"]) == {"best bucket", "one bucket"}
    C.ddp_verdicts(d)  # computable from a real recording

    z = measure.zero(pool, SMALL_BENCH)
    peaks = [r["peak_bytes"] for r in z["rows"]]
    assert peaks[0] > peaks[1] > peaks[2] > 0  # DDP by hand > ZeRO-1 > ZeRO-2
    assert all(r["volume_psi"] == pytest.approx(2.0, rel=0.01) for r in z["rows"])
    C.zero_verdicts(z)

    f = C.fsdp_rows(measure.fsdp(pool, SMALL_BENCH))
    assert f["FSDP2"]["state_bytes"] < 0.7 * f["DDP"]["state_bytes"]
    assert f["FSDP2"]["volume_psi"] == pytest.approx(3.0, rel=0.02)
    assert f["FSDP2, reshard_after_forward=False"]["volume_psi"] == pytest.approx(2.0, rel=0.02)


def test_ledger_and_trace_see_nccl_inside_backward(tmp_path):
    """The dispatch mode must see DDP's all-reduces issued from autograd's device threads, and the trace
    must hold NCCL kernels: both are what the recordings rest on."""
    def rank_fn(rank, world_size, folder):
        from torch.nn.parallel import DistributedDataParallel as DDP
        from labutils.labs.lab08_data_parallel.ledger import CollectiveLedger
        m = M.build_transformer(SMALL_BENCH, device="cuda")
        ddp = DDP(m, device_ids=[torch.cuda.current_device()], bucket_cap_mb=1)
        x, y = M.token_batch(SMALL_BENCH, 2, device="cuda")
        step = measure.train_step(ddp, torch.optim.AdamW(m.parameters()), x, y)
        step()
        with CollectiveLedger() as book:
            step()
        path = trace.profile_step(step, f"{folder}/r{rank}.json.gz")
        return book.counts().get("all_reduce", 0), trace.summarize(trace.load_events(path))["n_comm_kernels"]
    for calls, kernels in labutils.launch(rank_fn, str(tmp_path), world_size=2, backend="nccl", timeout=300):
        assert calls > 1 and kernels >= 1
