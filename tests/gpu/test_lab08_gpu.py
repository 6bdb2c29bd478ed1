"""Lab 08 on real GPUs: data parallelism by hand, DDP, ZeRO-1/2 and FSDP2 over NCCL against one device /
DDP (float64), the collective ledger and the profiler trace on CUDA, and the three measurement functions
on a small transformer (structure, volumes, the memory a bucket view saves; no timing asserts),
``nccl_groups.nccl_group``. Skipped without 2 GPUs.

Run: pytest tests/gpu/test_lab08_gpu.py -q     (>= 2 GPUs; ~1 min, one NCCL pool for the module)
"""
from __future__ import annotations

import pytest
import torch

import labutils
from labutils.labs.lab08_data_parallel import claims as C
from labutils.labs.lab08_data_parallel import measure, overlap, steps, trace, verify
from labutils.labs.lab08_data_parallel import model as M
from labutils.solutions import lab08 as S

from gpus import gpu_count, needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)
from notebook_defs import load_definitions

NB = load_definitions("08_data_parallel")       # the code the lab teaches: the notebook's
ZERO_IMPL = {"shard_of": NB.shard_of, "zero1_step": S.zero1_step, "zero2_attach": S.zero2_attach,
             "zero2_step": NB.zero2_step, "average_gradients": S.average_gradients}

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

SMALL_BENCH = {"d_model": 256, "n_heads": 4, "n_layers": 4, "seq": 128, "batch_per_rank": 4, "warmup": 1,
               "repeat": 2, "bucket_caps_mb": [1, 64], "ctas": [4], "paired_repeat": 2, "paired_iters": 1,
               "trace_steps": 2, "memory_rows": 1, "memory_seq": 16, "prefetch": 1}


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
        return NB.train_data_parallel(ddp, batches, opt, lambda m: None)
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
    _as_expected(pool.run(verify.check_by_hand, NB.replicate, NB.train_data_parallel,
                          {"average": S.average_gradients, "sum": NB.all_reduce_sum}))
    r = _as_expected(pool.run(verify.check_ddp, _train_ddp_factory(), NB.train_data_parallel,
                           NB.accumulate, S.average_gradients))
    assert r["4 micro-batches: all-reduce calls with no_sync"] == 1
    assert r["4 micro-batches: all-reduce calls without no_sync"] == 4


def test_zero_and_fsdp2_over_nccl(pool):
    r = _as_expected(pool.run(verify.check_zero, NB.shard_of, S.zero1_step, S.zero2_attach,
                           NB.zero2_step, S.average_gradients))
    assert r["communication per step in Ψ: DDP by hand, ZeRO-1, ZeRO-2"] == "2.00, 2.00, 2.00"
    r = _as_expected(pool.run(verify.check_fsdp, NB.shard_transformer))
    assert r["FSDP2: communication per step in Ψ"] == "3.0"


def test_nccl_group_with_a_fixed_cta_count():
    """``nccl_groups.nccl_group(ctas)`` (lab 02's paths and lab 08's CTA sweep): a working communicator over all
    ranks; DDP on it averages like DDP on the default group."""
    def rank_fn(rank, world_size):
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from labutils import nccl_groups
        group = nccl_groups.nccl_group(2)
        t = torch.full((1 << 20,), float(rank + 1), device="cuda")
        dist.all_reduce(t, group=group)
        summed = bool((t == world_size * (world_size + 1) / 2).all())
        ddp = DDP(torch.nn.Linear(8, 8, device="cuda"), device_ids=[torch.cuda.current_device()], process_group=group)
        ddp(torch.full((4, 8), float(rank), device="cuda")).sum().backward()
        grad = ddp.module.weight.grad.clone()
        dist.all_reduce(grad)  # the same on every rank after DDP's average: the sum is N times it
        averaged = bool(torch.allclose(grad, world_size * ddp.module.weight.grad))
        del ddp
        dist.destroy_process_group(group)
        return summed, averaged
    for summed, averaged in labutils.launch(rank_fn, world_size=2, backend="nccl", timeout=300):
        assert summed and averaged


def test_measurements_on_a_small_transformer(pool, tmp_path):
    d = measure.ddp(pool, SMALL_BENCH, trace_dir=tmp_path)
    psi = M.n_params(SMALL_BENCH)
    assert d["compute_ms"] > 0 and all(r["step_ms"] > 0 and r["no_sync_ms"] > 0 and r["comm_ms"] > 0
                                       for r in d["sweep"])
    assert all(r["volume_psi"] == pytest.approx(2.0, rel=0.01) for r in d["sweep"])
    assert d["sweep"][0]["n_buckets"] > d["sweep"][1]["n_buckets"]
    assert [r["ctas"] for r in d["sweep"]] == [None, None, 4] and d["cta_cap_mb"] in SMALL_BENCH["bucket_caps_mb"]
    # gradient_as_bucket_view: the gradients are the buckets (dropping .grad frees nothing), or a copy beside
    # them (dropping .grad frees 4 bytes per parameter); the memory held between steps differs by that copy
    view, no_view = d["memory"]["view"], d["memory"]["no_view"]
    assert view["grad_copy_bytes"] == 0
    assert no_view["grad_copy_bytes"] == pytest.approx(4 * psi, rel=0.02)
    assert no_view["state_bytes"] - view["state_bytes"] == pytest.approx(4 * psi, rel=0.05)
    assert set(d["traces"]) == {"best", "one bucket", "best, CPU activity"}
    for label, per_rank in d["traces"].items():
        assert len(per_rank) == 2
        for r, t in enumerate(per_rank):
            assert t["n_comm_kernels"] >= 1 and t["comm_ms"] > 0 and t["idle_ms"] >= 0, label
            assert t["tail_ms"] is not None and t["tail_ms"] >= 0, label  # AdamW's kernels found by name
            assert (tmp_path / t["file"]).exists() and t["file"].endswith(f"rank{r}.json.gz")
    assert d["traces"]["one bucket"][0]["bucket_cap_mb"] == max(SMALL_BENCH["bucket_caps_mb"])
    for row in d["sweep"]:  # every configuration traced with CUDA activity only, on every rank
        assert len(row["timeline"]) == 2 and overlap.has_timeline(row) and 0 <= row["overlap_fraction"] <= 1
        assert len(row["exposed_samples_ms"]) == SMALL_BENCH["paired_repeat"]
        assert all(t["no_sync_tail_ms"] is not None for t in row["timeline"])
    got = C.ddp_verdicts(d)
    assert len(got) == 8 and C.NOT_MEASURED not in {v.verdict for v in got}
    assert "NCCL's default" in C.cta_comparison(d)  # the CTA sweep ran: shown beside the verdicts

    z = measure.zero(pool, SMALL_BENCH, impl=ZERO_IMPL)
    peaks = [r["peak_bytes"] for r in z["rows"]]
    assert peaks[0] > peaks[1] > peaks[2] > 0  # DDP by hand > ZeRO-1 > ZeRO-2
    assert all(r["volume_psi"] == pytest.approx(2.0, rel=0.01) for r in z["rows"])
    C.zero_verdicts(z)

    f = C.fsdp_rows(measure.fsdp(pool, SMALL_BENCH, shard_transformer=NB.shard_transformer))
    assert f["FSDP2"]["state_bytes"] < 0.7 * f["DDP"]["state_bytes"]
    for name in measure.traced_variants(SMALL_BENCH):
        assert len(f[name]["trace"]) == 2 and all(t["idle_ms"] >= 0 and t["n_comm_kernels"] >= 1
                                                  for t in f[name]["trace"])
    assert f["FSDP2"]["volume_psi"] == pytest.approx(3.0, rel=0.02)
    assert f["FSDP2, reshard_after_forward=False"]["volume_psi"] == pytest.approx(2.0, rel=0.02)


def test_ledger_and_trace_see_nccl_inside_backward(tmp_path):
    """The dispatch mode must see DDP's all-reduces issued from autograd's device threads, and the trace
    must hold NCCL kernels: both are what the recordings rest on."""
    def rank_fn(rank, world_size, folder):
        from torch.nn.parallel import DistributedDataParallel as DDP
        from labutils.instruments import profiler
        from labutils.instruments.ledger import Ledger
        m = M.build_transformer(SMALL_BENCH, device="cuda")
        ddp = DDP(m, device_ids=[torch.cuda.current_device()], bucket_cap_mb=1)
        x, y = M.token_batch(SMALL_BENCH, 2, device="cuda")
        step = steps.train_step(ddp, torch.optim.AdamW(m.parameters()), x, y)
        step()
        with Ledger() as book:
            step()
        doc = profiler.profile(step, path=f"{folder}/r{rank}.json.gz")
        return book.counts().get("all_reduce", 0), trace.summarize(profiler.events(doc))["n_comm_kernels"]
    for calls, kernels in labutils.launch(rank_fn, str(tmp_path), world_size=2, backend="nccl", timeout=300):
        assert calls > 1 and kernels >= 1
