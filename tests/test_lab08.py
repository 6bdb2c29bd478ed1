"""Lab 08 (data parallelism) on CPU: the pure parts (formulas, trace arithmetic, verdicts), and every
algorithm -- the notebook's own code, taken from its source -- on real gloo ranks (one pool for the module).

Run: pytest tests/test_lab08.py -q      (~1-2 min on 2 cores, mostly the gloo ranks)
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import labutils
from labutils import compat
from labutils.checks import ExerciseError
from labutils.checks import lab08 as check
from labutils.labs.lab08_data_parallel import claims as C
from labutils.labs.lab08_data_parallel import memory, overlap, trace, verify
from labutils.labs.lab08_data_parallel import model as M
from labutils.solutions import lab08 as S

import lab08_fakes as fakes  # tests/lab08_fakes.py
from notebook_defs import load_definitions

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src" / "08_data_parallel.py"
NB = load_definitions("08_data_parallel")       # the code the lab teaches: the notebook's
ZERO_IMPL = {"shard_of": NB.shard_of, "zero1_step": S.zero1_step, "zero2_attach": S.zero2_attach,
             "zero2_step": NB.zero2_step, "average_gradients": S.average_gradients}


# ---- pure parts -----------------------------------------------------------------------------------
def test_models_have_the_documented_sizes():
    assert sum(p.numel() for p in M.ConvNet().parameters()) == 1610
    tf = M.build_transformer(M.SMALL_TF)
    assert sum(p.numel() for p in tf.parameters()) == M.n_params(M.SMALL_TF)
    assert M.n_params(M.BENCH) == 24 * (12 * 1024**2 + 13 * 1024) + 2 * 1024
    x, y = M.token_batch(M.SMALL_TF, 3)
    assert tf(x).shape == y.shape == (3, M.SMALL_TF["seq"], M.SMALL_TF["d_model"])
    a, _ = M.image_batch(4, seed=5)
    b, _ = M.image_batch(4, seed=5)
    assert torch.equal(a, b) and M.ConvNet().double()(a).shape == (4, 10)
    with pytest.raises(ValueError, match="multiple of n_heads"):
        M.Block(30, 4)


def test_bytes_per_param_follow_the_zero_paper():
    # the paper's figure 1 example: N = 64 -> 16, 4 + 12/64, 2 + 14/64, 16/64 bytes per parameter
    paper = "mixed-precision Adam (ZeRO paper)"
    assert memory.bytes_per_param("DDP", 64, paper) == 16
    assert memory.bytes_per_param("ZeRO-1", 64, paper) == pytest.approx(4 + 12 / 64)
    assert memory.bytes_per_param("ZeRO-2", 64, paper) == pytest.approx(2 + 14 / 64)
    assert memory.bytes_per_param("ZeRO-3 / FSDP", 64, paper) == pytest.approx(16 / 64)
    assert [memory.bytes_per_param(s, 2) for s in memory.SCHEMES] == [16, 12, 10, 8]
    assert memory.predicted_bytes("ZeRO-2", 1000, 2) == 10_000
    assert memory.formula("ZeRO-1") == "4Ψ + 4Ψ + 8Ψ/N"
    for bad in (dict(scheme="ZeRO-4"), dict(precision="fp8"), dict(world_size=0), dict(world_size=True)):
        kw = dict(scheme="DDP", world_size=2, precision=memory.OURS) | bad
        with pytest.raises(ValueError, match="HINT|world_size"):
            memory.bytes_per_param(kw["scheme"], kw["world_size"], kw["precision"])


def test_interval_arithmetic():
    assert trace.union([(3, 4), (0, 2), (1, 2.5)]) == [(0, 2.5), (3, 4)]
    assert trace.total([(0, 2), (1, 3), (5, 6)]) == 4
    assert trace.intersection([(0, 10)], [(2, 3), (5, 7), (9, 12)]) == 4
    assert trace.intersection([(0, 1)], [(2, 3)]) == 0
    assert trace.merge_close([(0, 1), (1.01, 2), (5, 6)], gap=0.05) == [(0, 2), (5, 6)]


def test_summarize_counts_gpu_idle_time():
    kernels = [("sm90_gemm", 0, 1000), ("sm90_gemm", 2000, 1000), ("ncclDevKernel_AllReduce", 2500, 1500)]
    s = trace.summarize([{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": dur} for n, ts, dur in kernels])
    assert s["step_ms"] == pytest.approx(4.0) and s["idle_ms"] == pytest.approx(1.0)  # nothing ran in [1, 2] ms
    assert s["comm_ms"] == pytest.approx(1.5) and s["overlap_ms"] == pytest.approx(0.5)
    copy = {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 1000, "dur": 400}  # busy, not idle
    with_copy = trace.summarize([{"ph": "X", "cat": "kernel", "name": n, "ts": ts, "dur": dur}
                                 for n, ts, dur in kernels] + [copy])
    assert with_copy["idle_ms"] == pytest.approx(0.6) and with_copy["compute_ms"] == pytest.approx(s["compute_ms"])
    no_comm = trace.summarize(fakes._events(False, comm=False))  # a no_sync step: no NCCL kernel
    assert no_comm["comm_ms"] == 0 and no_comm["n_comm_kernels"] == 0 and no_comm["overlap_fraction"] == 0.0
    assert no_comm["tail_ms"] is None  # no optimizer kernel in the trace: no tail to measure


def _kernel(name, ts, dur):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}


def test_optimizer_kernels_are_told_apart_by_name():
    assert trace.is_optimizer_kernel(fakes.OPTIMIZER_KERNEL)
    assert trace.is_optimizer_kernel("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<...>")
    assert trace.is_optimizer_kernel("fused_adamw_kernel")
    for name in ("sm90_xmma_gemm_bf16bf16_bf16f32", "void at::native::vectorized_elementwise_kernel<4, "
                 "at::native::CUDAFunctor_add<float>>", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "Memcpy DtoD"):
        assert not trace.is_optimizer_kernel(name), name


def test_tail_is_the_compute_streams_wait_before_the_optimizer():
    """Backward ends at 2 ms, the last all-reduce at 3 ms; AdamW starts at 3 ms: a 1 ms tail, although
    the NCCL kernel ran until the optimizer started (NCCL kernels do not fill the compute stream's wait)."""
    events = [_kernel("sm90_gemm", 0, 2000), _kernel("ncclDevKernel_AllReduce", 1500, 1500),
              _kernel(fakes.OPTIMIZER_KERNEL, 3000, 200), _kernel(fakes.OPTIMIZER_KERNEL, 3250, 200)]
    s = trace.summarize(events)
    assert s["tail_ms"] == pytest.approx(1.0) and s["step_ms"] == pytest.approx(3.45)
    assert s["overlap_ms"] == pytest.approx(0.5) and s["overlap_fraction"] == pytest.approx(1 / 3)
    assert {sp["kind"] for sp in s["spans"]} == {"compute", "optimizer", "NCCL"}
    # two steps back to back: per-step figures, one tail per step
    second = [dict(e, ts=e["ts"] + 4000) for e in events]
    two = trace.summarize(events + second, steps=2)
    for key in ("tail_ms", "comm_ms", "compute_ms", "overlap_ms"):
        assert two[key] == pytest.approx(s[key]), key
    assert two["step_ms"] == pytest.approx(7.45 / 2) and two["n_comm_kernels"] == 2
    # the optimizer starting while a compute kernel still runs (another stream): no wait, not a negative one
    assert trace.summarize([_kernel("gemm", 0, 2000), _kernel(fakes.OPTIMIZER_KERNEL, 1500, 100)])["tail_ms"] == 0
    # a non-optimizer kernel between optimizer kernels adds only its own short gap
    assert trace.wait_before([(0, 2, "gemm"), (3, 4, "adam"), (4, 4.5, "copy"), (4.6, 5, "adam")],
                             trace.is_optimizer_kernel) == pytest.approx(1.1)
    assert trace.wait_before([(0, 1, "adam")], trace.is_optimizer_kernel) == 0  # nothing before it


def test_summarize_reads_kernels_phases_and_overlap():
    s = trace.summarize(fakes._events(comm_after_backward=False), lane="r0")
    assert s["comm_ms"] == pytest.approx(4.0) and s["n_comm_kernels"] == 8
    assert 0.8 < s["overlap_fraction"] <= 1.0
    assert {sp["lane"] for sp in s["spans"]} == {"r0 phase", "r0 compute kernels", "r0 NCCL kernels"}
    assert s["tail_ms"] is None  # no optimizer kernel in this step
    after = trace.summarize(fakes._events(comm_after_backward=True))
    assert after["overlap_fraction"] == 0.0 and after["step_ms"] > s["step_ms"]
    with pytest.raises(ValueError, match="no GPU kernel"):
        trace.summarize([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}])


def _verdicts(data) -> dict:
    """``{first words of the claim: verdict}`` of ``C.ddp_verdicts(data)``."""
    return {v.claim[:40]: v.verdict for v in C.ddp_verdicts(data)}


def test_ddp_verdicts_follow_their_thresholds_on_both_sides():
    ok = C.ddp_verdicts(fakes.ddp())
    assert len(ok) == 8 and all(v.verdict == "TRUE" for v in ok), [v.body() for v in ok]
    names = list(_verdicts(fakes.ddp()))
    flipped = {  # one argument moved across its threshold flips exactly one verdict
        names[0]: fakes.ddp(speedup=1.80),
        names[1]: fakes.ddp(overlap_best=0.65),
        names[2]: fakes.ddp(cost=0.35),
        names[3]: fakes.ddp(accounted=0.65),
        names[4]: fakes.ddp(tail_share=0.12),
        names[5]: fakes.ddp(comm=7.5),          # 11% of the best step: communication is no longer small
        names[6]: fakes.ddp(wrapper=0.03),
        names[7]: fakes.ddp(saved_psi=3.0),
    }
    for name, data in flipped.items():
        got = _verdicts(data)
        assert got[name] == "FALSE" and sum(v == "FALSE" for v in got.values()) == 1, (name, got)
    assert _verdicts(fakes.ddp(accounted=1.35))[names[3]] == "FALSE"  # the stretch overshoots the excess
    near = {names[0]: fakes.ddp(speedup=1.86), names[1]: fakes.ddp(overlap_best=0.71),
            names[2]: fakes.ddp(cost=0.29), names[3]: fakes.ddp(accounted=0.71), names[4]: fakes.ddp(tail_share=0.09),
            names[5]: fakes.ddp(comm=6.5), names[6]: fakes.ddp(wrapper=0.019), names[7]: fakes.ddp(saved_psi=4.35)}
    for name, data in near.items():
        assert _verdicts(data)[name] == "TRUE", name
    assert overlap.speedup(fakes.ddp(speedup=1.9)) == pytest.approx(1.9)
    assert "whole all-reduce alone is" in ok[1].figure       # the overlap verdict says how much there was to hide
    assert "-" in C.cta_comparison(fakes.ddp(few_ctas_gain=0.02)).split("(")[1][:2]   # faster: a negative change
    assert C.cta_comparison(fakes.ddp(traced=False)) is None


def test_ddp_verdicts_from_cpu_ranks_say_the_timeline_is_not_measured():
    got = C.ddp_verdicts(fakes.ddp(traced=False))
    words = [v.verdict for v in got]
    assert words.count(C.NOT_MEASURED) == 3 and len(got) == 8
    assert all(v.figure.startswith("no kernel timeline") for v in got if v.verdict == C.NOT_MEASURED)
    assert {v.verdict for v in got if v.verdict != C.NOT_MEASURED} == {"TRUE"}


def test_a_recording_without_the_timeline_keeps_its_verdicts():
    """Recordings made before the paired difference and the kernel timeline are judged as they were
    printed: hidden share against the no_sync step."""
    old = fakes.no_timeline_ddp()
    assert not overlap.measures_exposed(old) and overlap.measures_exposed(fakes.ddp())
    got = C.ddp_verdicts(old)
    assert [v.claim.split(" (")[0] for v in got][:2] == [
        "DDP on 2 GPUs trains a compute-bound transformer at >= 1.85x one GPU's throughput", "At the best configuration"]
    assert [v.verdict for v in got] == ["TRUE"] * 5, [v.body() for v in got]
    assert [v.verdict for v in C.ddp_verdicts(fakes.no_timeline_ddp(speedup=1.80, hidden_best=0.6))[:2]] == ["FALSE"] * 2
    table = overlap.sweep_table(old)
    assert table["stretch ms"].isna().all() and (table["exposed ms"] == table["step ms"] - table["no_sync ms"]).all()


def test_overlap_arithmetic():
    assert overlap.hidden_fraction(10.0, 4.0, 11.0) == pytest.approx(0.75)
    assert overlap.paired_difference([10.0, 12.0, 11.0], [9.0, 9.5, 10.5]) == (1.0, [1.0, 2.5, 0.5])
    with pytest.raises(ValueError, match="paired"):
        overlap.paired_difference([10.0, 12.0], [9.0])
    d = fakes.ddp()
    assert [r["ctas"] for r in overlap.cta_sweep(d)] == [None, 8, 4]
    assert [r["bucket_cap_mb"] for r in overlap.default_ctas(d)] == [1, 25, 2048]
    assert overlap.one_bucket(d)["bucket_cap_mb"] == 2048 and overlap.best(d)["ctas"] == 4
    assert overlap.label(overlap.best(d)) == "25 MB cap, 4 CTAs" and overlap.ctas_label(None) == "NCCL default"
    table = overlap.sweep_table(d)
    assert list(table["NCCL CTAs"])[-2:] == ["8 CTAs", "4 CTAs"]
    assert table["exposed ms"].iloc[1] == pytest.approx(d["sweep"][1]["exposed_ms"])
    assert table["beside compute"].iloc[2] == pytest.approx(0.05)
    assert overlap.sweep_table(fakes.ddp(traced=False))["tail ms"].isna().all()
    step, no_sync = (trace.summarize(fakes._events(False, comm, optimizer_wait=w)) for comm, w in
                     ((True, 400.0), (False, 10.0)))
    t = overlap.timeline(step, no_sync)
    assert t["tail_ms"] == pytest.approx(0.4) and t["no_sync_tail_ms"] == pytest.approx(0.01)
    assert t["stretch_ms"] == pytest.approx(0.0) and t["excess_ms"] == pytest.approx(0.39)
    assert t["overlap_fraction"] == step["overlap_fraction"] > 0.8
    assert overlap.slowest([t, dict(t, traced_step_ms=1e3, tail_ms=9.0)])["tail_ms"] == 9.0


def test_profiler_cost_reads_both_recording_formats():
    d = fakes.ddp()
    cost = overlap.profiler_cost(d)
    assert cost["timed_ms"] == overlap.best(d)["step_ms"] and cost["cuda_only_ms"] == 72.0 + overlap.best(d)["excess_ms"]
    assert cost["cpu_activity_ms"] == d["traces"]["best, CPU activity"][0]["step_ms"]
    old = overlap.profiler_cost(fakes.no_timeline_ddp())  # its "best" trace was taken with CPU activity
    assert old["cuda_only_ms"] is None and old["cpu_activity_ms"] > 0 and old["cpu_activity_idle_ms"] >= 0
    assert overlap.profiler_cost(fakes.ddp(traced=False)) is None


def test_zero_and_fsdp_verdicts_follow_their_thresholds():
    assert all(v.verdict == "TRUE" for v in C.zero_verdicts(fakes.zero()))
    assert all(v.verdict == "FALSE" for v in C.zero_verdicts(fakes.zero(off_by=0.2))[:3])
    f = C.fsdp_verdicts(fakes.fsdp())
    assert [v.verdict for v in f[:4]] == ["TRUE"] * 4
    assert C.fsdp_verdicts(fakes.fsdp(state_ratio=0.6))[0].verdict == "FALSE"
    assert C.fsdp_verdicts(fakes.fsdp(traced=False)) == f  # the profiler summary is shown, not judged
    assert set(C.CLAIMS) - set(C.AWAITING_RECORDING) == {"08_ddp", "08_zero", "08_fsdp", "08_plain_one_gpu"}
    assert set(C.AWAITING_RECORDING) == {"08_build_ddp"}   # joins CLAIMS once 2xH200 has recorded it


def test_prediction_checkers(capsys):
    check.prediction_lr_factor(None, 2)
    check.prediction_bytes_per_param(None, "ZeRO-2", 2)
    out = capsys.readouterr().out
    assert "N x lr (N = 2 here)" in out and "= 10 bytes per parameter" in out
    check.prediction_lr_factor(2, 2)
    check.prediction_bytes_per_param(10, "ZeRO-2", 2)
    with pytest.raises(ExerciseError, match="HINT"):
        check.prediction_lr_factor(1, 2)
    with pytest.raises(ExerciseError, match="HINT"):
        check.prediction_bytes_per_param(16, "ZeRO-2", 2)


def test_record_takes_the_notebooks_code_and_refuses_its_stubs():
    from labutils.labs.lab08_data_parallel import measure, record
    def stub(*args):
        raise NotImplementedError  # what the student edition's answer cells hold
    stubs = type(NB)(**vars(NB) | {"my_average_gradients": stub, "my_zero1_step": stub, "my_zero2_attach": stub,
                                   "MyBucketedGradients": B["stub"]})
    with pytest.raises(ValueError, match="my_average_gradients, my_zero1_step, my_zero2_attach still raises "
                                         "NotImplementedError.*HINT"):
        record.zero_impl(stubs)
    with pytest.raises(ValueError, match="my_average_gradients, MyBucketedGradients still raises"):
        record.build_impl(stubs)
    solved = type(NB)(**vars(NB) | {"my_average_gradients": S.average_gradients, "my_zero1_step": S.zero1_step,
                                    "my_zero2_attach": S.zero2_attach})
    impl = record.zero_impl(solved)
    assert impl["shard_of"] is NB.shard_of and impl["zero1_step"] is S.zero1_step
    assert set(impl) == set(measure.ZERO_FUNCTIONS)
    assert record.build_impl(solved)["bucketed"] is NB.MyBucketedGradients   # the course edition's classes


def test_record_refuses_without_gpus_and_unknown_names(capsys):
    from labutils.labs.lab08_data_parallel import record
    if torch.cuda.device_count() < 2:
        assert record.main([]) == 2
        assert ">= 2 CUDA GPUs" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        record.main(["bogus"])


# ---- on gloo ranks ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pool():
    with labutils.RankPool(world_size=2, backend="gloo", output="quiet", timeout=300) as p:
        yield p


@pytest.fixture(scope="module")
def pool3():
    """The checkers' ranks: 3, where a 2-rank symmetry cannot hide a mistake."""
    with labutils.RankPool(world_size=3, backend="gloo", output="quiet", timeout=300) as p:
        yield p


def test_by_hand_matches_one_device_and_sum_scales_lr(pool):
    r = pool.run(verify.check_by_hand, NB.replicate, NB.train_data_parallel,
                 {"average": S.average_gradients, "sum": NB.all_reduce_sum})[0]
    assert r["before replicate: the ranks' weights differ"] and r["after replicate: every rank holds rank 0's weights"]
    assert r["average, SGD with lr: == one device with lr"] and not r["average, SGD with lr: == one device with N x lr"]
    assert r["sum, SGD with lr: == one device with N x lr"] and not r["sum, SGD with lr: == one device with lr"]
    assert r["Adam: sum and average give the same weights (rtol 1e-05)"]


def test_ddp_no_sync_and_bucket_views(pool):
    def _train_ddp(rank, world_size, batches):
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(M.build_convnet(seed=rank))
        opt = torch.optim.SGD(ddp.parameters(), lr=verify.LR)
        return NB.train_data_parallel(ddp, batches, opt, lambda m: None)

    r = pool.run(verify.check_ddp, _train_ddp, NB.train_data_parallel, NB.accumulate,
                 S.average_gradients)[0]
    assert r["DDP == data parallelism by hand (SGD)"] and r["DDP == one device on the whole batch (SGD)"]
    assert r["4 micro-batches: all-reduce calls without no_sync"] == 4
    assert r["4 micro-batches: all-reduce calls with no_sync"] == 1
    assert r["no_sync: == one device's gradient on the whole batch"]
    assert not r["gradient_as_bucket_view=False: every p.grad is a view into DDP's bucket"]
    assert r["gradient_as_bucket_view=True: every p.grad is a view into DDP's bucket"]


def test_zero_1_and_2_match_data_parallel_adam(pool):
    r = pool.run(verify.check_zero, NB.shard_of, S.zero1_step, S.zero2_attach,
                 NB.zero2_step, S.average_gradients)[0]
    assert r["ZeRO-1 == data parallelism by hand with Adam (3 steps)"]
    assert r["ZeRO-2 == data parallelism by hand with Adam (3 steps)"]
    assert r["ZeRO-2: no rank holds a full gradient after backward"]
    assert r["ZeRO-1: Adam state on this rank x N / DDP's (1.00 = a 1/N share)"] == "1.00"
    assert r["communication per step in Ψ: DDP by hand, ZeRO-1, ZeRO-2"] == "2.00, 2.00, 2.00"


def test_fsdp2_matches_ddp_and_moves_3_psi(pool):
    r = pool.run(verify.check_fsdp, NB.shard_transformer)[0]
    assert all(v for k, v in r.items() if "==" in k), r
    assert r["FSDP2: communication per step in Ψ"] == "3.0"
    assert r["FSDP2, reshard_after_forward=False: communication per step in Ψ"] == "2.0"
    assert r["DDP: communication per step in Ψ"] == "2.0"


def test_ledger_counts_what_each_collective_moves(pool):
    def rank_fn(rank, world_size):
        import torch.distributed as dist
        from labutils import compat
        from labutils.instruments.ledger import Ledger
        from labutils.labs.lab08_data_parallel import ledger
        with Ledger() as book:
            t = torch.ones(10)
            dist.all_reduce(t)                                    # 40 B, volume 2 S
            out = torch.empty(5)
            compat.reduce_scatter_tensor(out, torch.ones(10))     # input 40 B
            compat.all_gather_into_tensor(torch.empty(10), out)   # output 40 B
            dist.broadcast(t, src=0)                              # not a gradient collective
        with pytest.raises(ValueError):
            ledger.volume_in_params(book, 0)
        gradients = ("all_reduce", "reduce_scatter", "all_gather")
        return (book.counts(), [row["size_bytes"] for row in book.summary()], ledger.volume_bytes(book),
                ledger.volume_in_params(book, 20), book.wire_bytes_per_rank(ops=gradients))
    counts, sizes, volume, in_params, wire = pool.run(rank_fn)[0]
    assert counts == {"all_reduce": 1, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}
    assert sizes == [40, 40, 40, 40]
    assert volume == 160 and in_params == 2.0 and wire == 80     # a ring: (N - 1) / N of the volume


def test_zero_with_padding_on_three_ranks(no_leaks):
    """ConvNet's sizes do not all divide by 3: the padded-copy path of shard_of and gather_param."""
    r = labutils.launch(verify.check_zero, NB.shard_of, S.zero1_step, S.zero2_attach,
                        NB.zero2_step, S.average_gradients, world_size=3, backend="gloo",
                        output="quiet", timeout=300)[0]
    assert r["ZeRO-1 == data parallelism by hand with Adam (3 steps)"]
    assert r["ZeRO-2 == data parallelism by hand with Adam (3 steps)"]


# ---- exercise checkers ------------------------------------------------------------------------------
def _wrong_answers() -> dict:
    """Learner answers, defined in a function so that cloudpickle sends them by value to the ranks."""
    def _stub(*args):
        raise NotImplementedError

    def _sum_only(model):
        import torch.distributed as dist
        for p in model.parameters():
            dist.all_reduce(p.grad)

    def _no_op(model):
        pass

    def _zero_no_divide(params, shards, optimizer):
        import torch.distributed as dist
        from labutils import compat
        n = dist.get_world_size()
        for p, s in zip(params, shards):
            s.grad = torch.empty_like(s)
            compat.reduce_scatter_tensor(s.grad, NB.padded_flat(p.grad, n))
            p.grad = None
        optimizer.step()
        optimizer.zero_grad()
        for p, s in zip(params, shards):
            NB.gather_param(p, s)

    def _zero_no_gather(params, shards, optimizer):
        import torch.distributed as dist
        from labutils import compat
        n = dist.get_world_size()
        for p, s in zip(params, shards):
            s.grad = torch.empty_like(s)
            compat.reduce_scatter_tensor(s.grad, NB.padded_flat(p.grad, n))
            s.grad /= n
            p.grad = None
        optimizer.step()
        optimizer.zero_grad()

    def _zero_all_reduce(params, shards, optimizer):  # right weights, but DDP's communication, not ZeRO's
        import torch.distributed as dist
        n, r = dist.get_world_size(), dist.get_rank()
        for p, s in zip(params, shards):
            dist.all_reduce(p.grad)
            s.grad = NB.padded_flat(p.grad / n, n).chunk(n)[r].clone()
            p.grad = None
        optimizer.step()
        optimizer.zero_grad()
        for p, s in zip(params, shards):
            NB.gather_param(p, s)

    def _zero_raises(params, shards, optimizer):
        raise RuntimeError("boom")

    def _zero2_hooks(keep_grad: bool, divide: bool):
        def attach(params, shards):
            import functools
            import torch.distributed as dist
            from labutils import compat
            n = dist.get_world_size()

            def hook(p, shard):
                piece = torch.empty_like(shard)
                compat.reduce_scatter_tensor(piece, NB.padded_flat(p.grad, n))
                shard.grad = piece / n if divide else piece
                if not keep_grad:
                    p.grad = None
            return [p.register_post_accumulate_grad_hook(functools.partial(hook, shard=s))
                    for p, s in zip(params, shards)]
        return attach

    def _zero2_no_hooks(params, shards):  # "attaches" nothing: the reduction never happens in backward
        return []

    def _flat_once(model):  # right gradients, but not the naive design: one flat all-reduce
        import torch.distributed as dist
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads]) / dist.get_world_size()
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    def _reduce_broadcast(model):  # a parameter server on rank 0: right gradients, twice the traffic
        import torch.distributed as dist
        for p in model.parameters():
            dist.reduce(p.grad, dst=0)
            dist.broadcast(p.grad, src=0)
            p.grad /= dist.get_world_size()

    def _half_twice(model):  # each gradient all-reduced twice (half each time): right values, 2x the bytes
        import torch.distributed as dist
        for p in model.parameters():
            p.grad /= 2 * dist.get_world_size()
            once = p.grad.clone()
            dist.all_reduce(once)
            dist.all_reduce(p.grad)
            p.grad += once

    return {"stub": _stub, "sum_only": _sum_only, "no_op": _no_op, "flat_once": _flat_once,
            "reduce_broadcast": _reduce_broadcast, "half_twice": _half_twice,
            "zero2_keeps_grad": _zero2_hooks(keep_grad=True, divide=True),
            "zero2_no_divide": _zero2_hooks(keep_grad=False, divide=False), "zero2_no_hooks": _zero2_no_hooks,
            "zero_no_divide": _zero_no_divide,
            "zero_no_gather": _zero_no_gather, "zero_all_reduce": _zero_all_reduce,
            "zero_raises": _zero_raises}


W = _wrong_answers()
B = fakes.build_ddp_answers()


def test_average_checker(pool3, capsys):
    assert check.average_gradients(W['stub'], pool=pool3) is check.torch_average_gradients
    assert "not attempted" in capsys.readouterr().err
    check.average_gradients(lambda m: check.torch_average_gradients(m), pool=pool3)  # the stand-in is right
    assert "✓" in capsys.readouterr().out
    assert check.average_gradients(S.average_gradients, pool=pool3) is S.average_gradients
    assert "(8 all-reduces for 8 parameters" in capsys.readouterr().out
    check.average_gradients(W['flat_once'], pool=pool3)   # one flat all-reduce: every gradient once, also right
    assert "(1 all-reduces for 8 parameters" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="divide the sum"):
        check.average_gradients(W['sum_only'], pool=pool3)
    with pytest.raises(ExerciseError, match="still each rank's own"):
        check.average_gradients(W['no_op'], pool=pool3)
    with pytest.raises(ExerciseError, match="besides all-reduces your step issued broadcast, reduce.*HINT"):
        check.average_gradients(W['reduce_broadcast'], pool=pool3)  # right gradients, twice the traffic
    with pytest.raises(ExerciseError, match="issued 16 all-reduces.*HINT: all-reduce every parameter's gradient "
                                            "exactly once"):
        check.average_gradients(W['half_twice'], pool=pool3)  # right gradients: halves all-reduced twice


def test_checkers_refuse_a_pool_of_two_ranks(pool):
    with pytest.raises(ValueError, match=">= 3 ranks.*HINT"):
        check.average_gradients(S.average_gradients, pool=pool)


def test_zero_step_checker(pool3, capsys):
    assert check.zero_step(W['stub'], pool=pool3) is check.averaged_then_sharded_step
    assert "not attempted" in capsys.readouterr().err
    assert check.zero_step(S.zero1_step, pool=pool3) is S.zero1_step
    with pytest.raises(ExerciseError, match="world_size times the average"):
        check.zero_step(W['zero_no_divide'], pool=pool3)
    with pytest.raises(ExerciseError, match="all-gather the shards"):
        check.zero_step(W['zero_no_gather'], pool=pool3)
    with pytest.raises(ExerciseError, match="all-reduced the full gradients.*HINT: an all-reduce sends 2\\(N-1\\)/N.*"
                                            "half the bytes"):
        check.zero_step(W['zero_all_reduce'], pool=pool3)
    with pytest.raises(ExerciseError, match="raised RuntimeError on rank 0: boom"):
        check.zero_step(W['zero_raises'], pool=pool3)


def test_zero2_checker(pool3, capsys):
    assert check.zero2_attach(W['stub'], pool=pool3) is check.averaged_then_sliced_hooks
    assert "not attempted: my_zero2_attach" in capsys.readouterr().err
    assert check.zero2_attach(S.zero2_attach, pool=pool3) is S.zero2_attach
    assert "10 reduce-scatters during backward for 10 parameters" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="all-reduced the full gradients: 17173 bytes.*sends 8656.*HINT.*half the "
                                            "bytes"):
        check.zero2_attach(check.averaged_then_sliced_hooks, pool=pool3)   # the stand-in is no answer
    with pytest.raises(ExerciseError, match="some p.grad still holds a full gradient.*HINT.*p.grad = None"):
        check.zero2_attach(W['zero2_keeps_grad'], pool=pool3)
    with pytest.raises(ExerciseError, match="world_size times the average"):
        check.zero2_attach(W['zero2_no_divide'], pool=pool3)
    with pytest.raises(ExerciseError, match="no collective ran during backward.*HINT.*register_post_accumulate"):
        check.zero2_attach(W['zero2_no_hooks'], pool=pool3)


# ---- build your DDP: (b) overlapped, (c) bucketed --------------------------------------------------


def test_bucket_layout_is_ddps_rule():
    from labutils.labs.lab08_data_parallel import build
    sizes = [p.numel() * p.element_size() for p in build.mlp().parameters()]
    assert build.bucket_layout(sizes, build.BUCKET_CAP_BYTES) == [[7, 6, 5, 4], [3, 2], [1, 0]]
    assert build.bucket_layout([4, 4, 4], 1) == [[2], [1], [0]]            # each alone
    assert build.bucket_layout([4, 4, 4], 10**9) == [[2, 1, 0]]            # one bucket
    assert build.bucket_layout([4, 4, 4], 8) == [[2, 1], [0]]              # full at >= the cap; last partial


def test_blocking_all_reduces_restores_torch_distributed():
    import torch.distributed as dist
    from torch.distributed import distributed_c10d
    from labutils.labs.lab08_data_parallel import build
    original = dist.all_reduce
    with pytest.raises(RuntimeError, match="boom"):
        with build.blocking_all_reduces() as calls:
            assert dist.all_reduce is not original and distributed_c10d.all_reduce is dist.all_reduce
            assert calls == []
            raise RuntimeError("boom")
    assert dist.all_reduce is original and distributed_c10d.all_reduce is original


def test_overlapped_checker(pool3, capsys):
    assert check.overlapped_gradients(B["stub"], pool=pool3) is check.AveragedAfterBackward
    assert "not attempted: MyOverlappedGradients" in capsys.readouterr().err
    assert check.overlapped_gradients(S.OverlappedGradients, pool=pool3) is S.OverlappedGradients
    assert "8 all-reduces for 8 parameters, every one started during backward" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="issued after backward.*cannot overlap.*HINT.*inside the hook"):
        check.overlapped_gradients(B["after_backward"], pool=pool3)
    with pytest.raises(ExerciseError, match="world_size times DDP's.*HINT.*divide"):
        check.overlapped_gradients(B["overlapped_sum"], pool=pool3)
    with pytest.raises(ExerciseError, match="before the last gradient.*HINT.*register_post_accumulate_grad_hook"):
        check.overlapped_gradients(B["tensor_hook"], pool=pool3)
    with pytest.raises(ExerciseError, match="issued after backward"):  # the stand-in is no answer
        check.overlapped_gradients(check.AveragedAfterBackward, pool=pool3)
    with pytest.raises(ExerciseError, match="8 all-reduces during backward were called without async_op=True.*"
                                            "HINT.*returns a handle"):
        check.overlapped_gradients(B["blocking"], pool=pool3)


def test_bucketed_checker(pool3, capsys):
    assert check.bucketed_gradients(B["stub"], pool=pool3) is check.AveragedAfterBackward
    assert "not attempted: MyBucketedGradients" in capsys.readouterr().err
    assert check.bucketed_gradients(S.BucketedGradients, pool=pool3) is S.BucketedGradients
    assert "3 all-reduces of [3096, 4000, 1344] bytes" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="before the last gradient it carries.*HINT.*still missing"):
        check.bucketed_gradients(B["early_bucket"], pool=pool3)
    with pytest.raises(ExerciseError, match="world_size times DDP's"):
        check.bucketed_gradients(B["bucketed_sum"], pool=pool3)
    with pytest.raises(ExerciseError, match="one all-reduce per parameter.*HINT.*pack"):
        check.bucketed_gradients(B["per_parameter"], pool=pool3)
    with pytest.raises(ExerciseError, match="DDP's buckets for this cap carry.*HINT.*in reverse"):
        check.bucketed_gradients(B["forward_order"], pool=pool3)
    with pytest.raises(ExerciseError, match="issued after backward"):
        check.bucketed_gradients(B["flush_in_finish"], pool=pool3)
    with pytest.raises(ExerciseError, match="step 2: your step issued no all-reduce.*HINT: the first step was right"):
        check.bucketed_gradients(B["never_reset"], pool=pool3)


def test_zero_step_checker_on_three_ranks_with_padding(no_leaks):
    """The checker's rank side on 3 ranks, where ConvNet's sizes need padding: ZeRO-1 passes, and a step that
    all-reduces the full gradients is told apart by its communication alone (its weights are right)."""
    from labutils.labs.lab08_data_parallel import exercises
    for fn, want in ((S.zero1_step, "ok"), (W["zero_all_reduce"], "all_reduce")):
        r = labutils.launch(exercises.run_zero_step, fn, W["stub"], world_size=3, backend="gloo",
                            output="quiet", timeout=300)
        assert [x["diagnosis"] for x in r] == [want] * 3 and not any(x["not_attempted"] for x in r)


def test_checker_without_pool_uses_fresh_gloo_ranks(no_leaks, capsys):
    check.average_gradients(S.average_gradients)
    assert "✓" in capsys.readouterr().out


def test_measurements_run_on_gloo(pool):
    """The GPU measurement code, on CPU ranks with a tiny config: structure and volumes (memory is 0 off
    CUDA, no trace is taken without GPU kernels, and CTAs exist only on NCCL); the figures themselves come
    from the GPUs."""
    from labutils.labs.lab08_data_parallel import measure
    cfg = dict(M.SMALL_TF, warmup=1, repeat=1, bucket_caps_mb=[0.01, 4], ctas=[2], paired_repeat=2, paired_iters=1,
               trace_steps=1, memory_rows=1, memory_seq=4, prefetch=1)
    d = measure.ddp(pool, cfg)
    assert [r["n_buckets"] for r in d["sweep"]] == [10, 1] and d["traces"] == {}
    assert [r["ctas"] for r in d["sweep"]] == [None, None] and d["cta_cap_mb"] is None
    assert all(r["volume_psi"] == pytest.approx(2.0) and r["step_ms"] > 0 and r["no_sync_ms"] > 0
               and r["comm_ms"] > 0 for r in d["sweep"])
    assert sum(d["sweep"][0]["bucket_bytes"]) == 4 * M.n_params(cfg)
    assert all(len(r["exposed_samples_ms"]) == 2 and r["exposed_ms"] == pytest.approx(
        sum(r["exposed_samples_ms"]) / 2) and r["timeline"] is None and not overlap.has_timeline(r) for r in d["sweep"])
    assert set(d["memory"]) == {"bucket_cap_mb", "ctas", "view", "no_view"} and overlap.measures_exposed(d)
    got = C.ddp_verdicts(d)  # computable from a real run; no timeline on CPU ranks
    assert sum(v.verdict == C.NOT_MEASURED for v in got) == 3
    z = measure.zero(pool, cfg, impl=ZERO_IMPL)
    assert [r["scheme"] for r in z["rows"]] == ["DDP", "ZeRO-1", "ZeRO-2"]
    assert all(r["volume_psi"] == pytest.approx(2.0) for r in z["rows"])
    f = C.fsdp_rows(measure.fsdp(pool, cfg, shard_transformer=NB.shard_transformer))
    assert not any("trace" in r for r in f.values())  # kernel timelines need GPUs
    assert f["FSDP2"]["volume_psi"] == pytest.approx(3.0, rel=0.01)
    assert f["FSDP2, reshard_after_forward=False"]["volume_psi"] == pytest.approx(2.0, rel=0.01)
    assert f["DDP"]["calls"]["all_reduce"] == 1


def test_build_ddp_measurement_runs_on_gloo(pool):
    """08_build_ddp's code on CPU ranks, a tiny workload: every row, the all-reduces each design issued in one
    step (DDP's after its bucket rebuild), the stand-ins named; the figures themselves come from the GPUs."""
    from labutils.labs.lab08_data_parallel import build_measure as BM
    cfg = dict(BM.WIDE, d_model=32, n_layers=3, rows=8, bucket_cap_mb=0.005, warmup=1, iters=1, repeat=2)
    d = BM.build_ddp(pool, S.average_gradients, S.OverlappedGradients, S.BucketedGradients, cfg=cfg)
    rows = C.build_rows(d)
    assert list(rows) == list(BM.ROWS) and d["n_params"] == 3 * (32 * 32 + 32) == BM.n_params(cfg)
    assert [rows[k]["all_reduces"] for k in BM.ROWS] == [0, 6, 6, 2, 2]   # 5.2 kB cap: layers 3+2, then 1
    assert all(rows[k]["size_bytes"] == 4 * d["n_params"] for k in BM.ROWS[1:])
    assert rows["no_sync"]["exposed_ms"] == 0 and len(rows["naive"]["exposed_samples_ms"]) == 2
    assert 0 < d["comm_fraction"] < 1 and d["standins"] == {"naive": False, "overlapped": False, "bucketed": False}
    assert len(C.build_verdicts(d)) == 4
    d = BM.build_ddp(pool, check.torch_average_gradients, check.AveragedAfterBackward, check.AveragedAfterBackward,
                     cfg=cfg)
    assert d["standins"] == {"naive": True, "overlapped": True, "bucketed": True}
    assert [v.verdict for v in C.build_verdicts(d)][1:] == [C.NOT_JUDGED] * 3


def test_the_measurements_refuse_to_run_without_the_code_they_measure():
    from labutils.labs.lab08_data_parallel import build_measure, measure
    with pytest.raises(ValueError, match=r"\['bucketed'\] is None.*HINT"):
        build_measure.build_ddp(None, S.average_gradients, S.OverlappedGradients, None)
    with pytest.raises(ValueError, match="impl lacks"):
        measure.zero(None, impl={"shard_of": NB.shard_of})
    with pytest.raises(ValueError, match="shard_transformer=shard_transformer"):
        measure.fsdp(None)
