"""Megatron-style tensor parallelism on real gloo ranks (CPU): every parallel layer against its
one-device reference with torch.testing.assert_close, forward AND backward, at world sizes 1-4;
the autograd communication functions; lab 02's measurement functions (smoke) and its checkers.

Run: pytest tests/test_tensor_parallel.py -q   (about a minute on 2 cores: one launch per world
size runs every layer check; the test functions below report them one by one.)
"""
from __future__ import annotations

import sys
import traceback

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

import labutils
from labutils import bandwidth, compat
from labutils.labs.lab02_tensor_parallel import comm, cost_model, measure, verify
from labutils.checks import ExerciseError
from labutils.checks import lab02 as check
from labutils.labs.lab02_tensor_parallel.layers import (ColumnParallelLinear, RowParallelLinear,
                                                        TensorParallelMLP, reference_mlp, shard)

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

HIDDEN, FFN, TOKENS = 12, 48, 5  # divisible by every world size tested (1, 2, 3, 4)
WORLD_SIZES = (1, 2, 3, 4)


def _data(*shapes, seed=1, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)  # same tensors on every rank
    return [torch.randn(*s, generator=gen, dtype=dtype) for s in shapes]


# ---- the checks, run inside each rank -------------------------------------------------------
def _run_both(ref, tp, x, dz):
    """Forward and backward of the one-device and the parallel module on the same x and dL/dy;
    asserts that the outputs and the input gradients agree."""
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref, y_tp = ref(x_ref), tp(x_tp)
    y_ref.backward(dz)
    y_tp.backward(dz)
    torch.testing.assert_close(y_tp, y_ref)
    torch.testing.assert_close(x_tp.grad, x_ref.grad)


def check_mlp(dtype=torch.float64):
    ref = reference_mlp(HIDDEN, FFN, seed=3, dtype=dtype)
    tp = TensorParallelMLP.from_sequential(ref)
    _run_both(ref, tp, *_data((TOKENS, HIDDEN), (TOKENS, HIDDEN), dtype=dtype))
    torch.testing.assert_close(tp.up.weight.grad, shard(ref[0].weight.grad, 0))
    torch.testing.assert_close(tp.up.bias.grad, shard(ref[0].bias.grad, 0))
    torch.testing.assert_close(tp.down.weight.grad, shard(ref[2].weight.grad, 1))
    torch.testing.assert_close(tp.down.bias.grad, ref[2].bias.grad)


def check_mlp_float32():
    check_mlp(torch.float32)


def _check_linear(layer_cls, split_dim, **kw):
    torch.manual_seed(4)
    ref = nn.Linear(HIDDEN, FFN, dtype=torch.float64)
    layer = layer_cls.from_linear(ref, **kw)
    _run_both(ref, layer, *_data((TOKENS, HIDDEN), (TOKENS, FFN)))
    torch.testing.assert_close(layer.weight.grad, shard(ref.weight.grad, split_dim))
    expected_bias = shard(ref.bias.grad, 0) if split_dim == 0 else ref.bias.grad
    torch.testing.assert_close(layer.bias.grad, expected_bias)


def check_column_parallel_gathered():
    _check_linear(ColumnParallelLinear, 0, gather_output=True)


def check_row_parallel_splits_its_input():
    _check_linear(RowParallelLinear, 1, input_is_parallel=False)


def check_gather_and_split_gradients():
    rank, n = dist.get_rank(), dist.get_world_size()
    full, weights = _data((3, 4 * n), (3, 4 * n))
    mine = shard(full, 1).requires_grad_()
    gathered = comm.gather_from_tp_region(mine)
    torch.testing.assert_close(gathered, full)
    (gathered * weights).sum().backward()
    torch.testing.assert_close(mine.grad, shard(weights, 1))  # d/dx_i of sum(w * gather(x))
    whole = full.clone().requires_grad_()
    part = comm.split_to_tp_region(whole)
    torch.testing.assert_close(part, shard(full, 1))
    (part * shard(weights, 1)).sum().backward()
    torch.testing.assert_close(whole.grad, weights)  # every rank's slice comes back


def check_all_gather_uneven():
    rank, n = dist.get_rank(), dist.get_world_size()
    for counts in ([r + 1 for r in range(n)], [0] + [2] * (n - 1), [3] * n):
        full = torch.arange(sum(counts) * 2, dtype=torch.float32).reshape(-1, 2)
        got = comm.all_gather_uneven(full.split(counts)[rank].clone())
        torch.testing.assert_close(got, full)


def check_comm_timer_counts_one_all_reduce_each_way():
    timer = comm.CommTimer()
    mlp = TensorParallelMLP(HIDDEN, FFN, timer=timer)
    x = torch.randn(TOKENS, HIDDEN, requires_grad=True)
    mlp(x).sum().backward()  # disabled: records nothing
    assert timer.times_ms() == {}
    timer.enabled = True
    mlp(x).sum().backward()
    times = timer.times_ms()
    n = dist.get_world_size()
    expected = {} if n == 1 else {"all_reduce fwd": 1, "all_reduce bwd": 1}
    assert {k: len(v) for k, v in times.items()} == expected, times
    assert all(ms >= 0 for v in times.values() for ms in v)


def check_indivisible_sizes_raise():
    n = dist.get_world_size()
    if n == 1:
        return
    for make in (lambda: ColumnParallelLinear(4, n + 1), lambda: RowParallelLinear(n + 1, 4),
                 lambda: comm.split_to_tp_region(torch.ones(2, n + 1))):
        with pytest.raises(ValueError, match="not divisible by the tensor-parallel world size"):
            make()


CHECKS = [check_mlp, check_mlp_float32, check_column_parallel_gathered,
          check_row_parallel_splits_its_input, check_gather_and_split_gradients,
          check_all_gather_uneven, check_comm_timer_counts_one_all_reduce_each_way,
          check_indivisible_sizes_raise]


def run_checks(rank, world_size):
    """Every check on this rank; {name: None if it passed, else its traceback}. A failing check
    issues no further collectives than its peers, since all ranks run the same code."""
    out = {}
    for fn in CHECKS:
        try:
            fn()
            out[fn.__name__] = None
        except Exception:  # noqa: BLE001 - reported per check below
            out[fn.__name__] = traceback.format_exc()
    return out


_RESULTS: dict[int, list] = {}


def _results(world_size):
    if world_size not in _RESULTS:
        _RESULTS[world_size] = labutils.launch(run_checks, world_size=world_size, backend="gloo", timeout=120)
    return _RESULTS[world_size]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("name", [fn.__name__ for fn in CHECKS])
def test_parallel_layers_match_one_device(world_size, name):
    for rank, result in enumerate(_results(world_size)):
        assert result[name] is None, f"rank {rank} of {world_size}:\n{result[name]}"


# ---- no ranks needed ------------------------------------------------------------------------
def test_from_sequential_rejects_other_models():
    with pytest.raises(TypeError, match="HINT"):
        TensorParallelMLP.from_sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4)))


def test_reference_mlp_is_reproducible_and_leaves_global_rng_alone():
    state = torch.random.get_rng_state()
    a, b = reference_mlp(8, seed=5), reference_mlp(8, seed=5)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(reference_mlp(8, seed=6)[0].weight, a[0].weight)


def test_cost_model():
    assert cost_model.mlp_flops(10, 4, 16) == 4 * 10 * 4 * 16
    assert cost_model.mlp_flops(10, 4, 16, train=True) == 3 * cost_model.mlp_flops(10, 4, 16)
    fit = bandwidth.AlphaBeta(alpha_us=20.0, beta_gbps=300.0, max_rel_err=0.0)
    size = 64 * 2**20
    # on 2 ranks the ring extrapolation reproduces the fit it came from
    assert cost_model.allreduce_ms(size, 2, fit.alpha_us, fit.beta_gbps) == pytest.approx(fit.predict_ms(size))
    assert cost_model.allreduce_ms(size, 4, fit.alpha_us, fit.beta_gbps) > fit.predict_ms(size)
    assert cost_model.allreduce_ms(size, 1, fit.alpha_us, fit.beta_gbps) == 0.0
    assert cost_model.tp_step_ms(10.0, 2, 1.0, count=2) == 7.0
    small, big = (cost_model.speedup_model(h, 4096, 2, 500.0, 20.0, 300.0) for h in (256, 16384))
    assert small < 1.0 < big < 2.0  # tiny layers lose to the all-reduce, big ones approach 2


def test_comm_summary_has_lab06_fields():
    rows = [{"hidden": 1024, "tokens": 4096, "dtype": "bfloat16", "allreduce_bytes": 8 * 2**20,
             "allreduce_fwd_ms": 0.05, "tp_fwd_ms": 0.4}]
    (op,) = cost_model.comm_summary(rows, world_size=2)["ops"]
    assert op == {"what": "TP MLP forward all_reduce, hidden=1024, tokens=4096, bfloat16",
                  "op": "all_reduce", "size_bytes": 8 * 2**20, "world_size": 2, "count_per_step": 1,
                  "measured_ms": 0.05, "step_ms": 0.4}


def test_nvlink_counter_absent_means_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as on a machine without NVML
    assert measure.nvlink_tx_bytes() is None


# ---- the measurement functions on gloo (small sizes) ----------------------------------------
def _bench_all(rank, world_size):
    return {"verify": verify.verify_mlp(rank, world_size, hidden=8, tokens=3),
            "sweep": measure.collective_sweep(rank, world_size, [64, 1024], warmup=1, iters=2, repeat=2),
            "objects": measure.object_vs_tensor(rank, world_size, [256, 4096], repeat=2, link_iters=1),
            "partitions": measure.partitions(rank, world_size, [1, 2], rows=8, cols=4, dtype="float32",
                                              steps=2, warmup=1),
            "mlp": measure.tp_mlp_sweep(rank, world_size, [8], tokens=4, dtype="float32", target_ms=0.5)}


@pytest.fixture(scope="module")
def bench():
    return labutils.launch(_bench_all, world_size=2, backend="gloo", timeout=120)


def test_verify_mlp_reports_every_quantity_ok(bench):
    assert bench[0]["verify"] == {k: "assert_close OK" for k in bench[0]["verify"]}
    assert len(bench[0]["verify"]) == 6 and bench[1]["verify"] == bench[0]["verify"]


def test_collective_sweep_uses_nccl_tests_definitions(bench):
    ops = bench[0]["sweep"]["ops"]
    assert set(ops) == set(measure.SWEEP_OPS)
    for op, cols in ops.items():
        for s, t, alg, bus in zip(cols["size_bytes"], cols["time_ms"], cols["algbw_gbps"], cols["busbw_gbps"]):
            assert alg == pytest.approx(s / (t * 1e-3) / 1e9)
            assert bus == pytest.approx(alg * bandwidth.bus_factor(op, 2))


def test_object_path_pickles_about_the_tensor_bytes(bench):
    rows = bench[0]["objects"]["rows"]
    assert [r["size_bytes"] for r in rows] == [256, 4096]
    assert all(r["size_bytes"] < r["pickled_bytes"] < r["size_bytes"] + 4096 for r in rows)
    assert rows[-1]["received_devices"] == ["cpu"]
    assert bench[0]["objects"]["link"]["payload_bytes_per_call"] == 2 * 4096


def test_gloo_refuses_unequal_list_all_gather(bench):
    assert "invalid tensor size" in bench[0]["partitions"]["uneven_list"]["gloo"]


def test_imbalance_and_mlp_sweeps_report_every_rank(bench):
    imb = bench[0]["partitions"]["imbalance"]
    assert imb["factors"] == [1, 2] and all(len(v) == 2 for v in imb["step_ms"])
    (row,) = bench[0]["mlp"]
    assert row["allreduce_bytes"] == 4 * 8 * 4
    assert all(row[k] > 0 for k in ("one_gpu_fwd_ms", "tp_train_ms", "allreduce_fwd_ms", "allreduce_train_ms"))


# ---- the exercise checkers: wrong answers raise with a HINT ---------------------------------
def test_gather_checker_flags_leftover_padding():
    def keeps_padding(x, group):
        n = dist.get_world_size(group)
        counts = torch.empty(n, dtype=torch.int64)
        compat.all_gather_into_tensor(counts, torch.tensor([x.shape[0]]))
        padded = x.new_zeros(int(counts.max()), *x.shape[1:])
        padded[: x.shape[0]] = x
        out = x.new_empty(n * padded.shape[0], *x.shape[1:])
        compat.all_gather_into_tensor(out, padded)
        return out
    with pytest.raises(ExerciseError, match="padding is still there"):
        check.gather_rows_uneven(keeps_padding)


def test_row_parallel_checker_flags_bias_added_on_every_rank():
    def bias_everywhere(x, w, b, group):
        return comm.reduce_from_tp_region(x @ w.T + b, group)
    with pytest.raises(ExerciseError, match="add the bias once"):
        check.row_parallel_forward(bias_everywhere)


def test_row_parallel_checker_flags_gradient_all_reduced_twice():
    def reduces_grad_too(x, w, b, group):  # torch.distributed.nn's all_reduce sums gradients too
        class AllReduceBoth(torch.autograd.Function):
            @staticmethod
            def forward(ctx, t):
                t = t.clone()
                dist.all_reduce(t)
                return t

            @staticmethod
            def backward(ctx, g):
                g = g.clone()
                dist.all_reduce(g)
                return g
        return AllReduceBoth.apply(x @ w.T) + b
    with pytest.raises(ExerciseError, match="wrong gradient"):
        check.row_parallel_forward(reduces_grad_too)


def test_gather_checker_flags_blocks_out_of_rank_order():
    def reversed_order(x, group):
        blocks = comm.all_gather_uneven(x, group)
        return blocks.flip(0)
    with pytest.raises(ExerciseError, match="rank order"):
        check.gather_rows_uneven(reversed_order)


@pytest.mark.parametrize("wrong, message", [
    (lambda x, w, b, group: (x @ w.T)[:, :2], "expected a tensor of shape"),
    (lambda x, w, b, group: x.no_such_method(), "raised AttributeError on rank"),
])
def test_row_parallel_checker_reports_shapes_and_exceptions(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        check.row_parallel_forward(wrong)


def test_unknown_sweep_op_is_refused():
    with pytest.raises(ValueError, match="HINT: one of"):
        measure._collective("all_scatter", 64, 2, torch.device("cpu"), torch.float32)


def test_checkers_fall_back_to_the_reference_for_stubs(capsys):
    def stub(*args):
        raise NotImplementedError
    check.predict_allreduce_ms(stub, bandwidth.AlphaBeta(10.0, 100.0, 0.0))
    out = capsys.readouterr().out
    assert "not attempted" in out and "✓ predict_allreduce_ms" in out


@pytest.mark.parametrize("wrong, hint", [
    (lambda t, h, b, fit: fit.predict_ms(t * h), "count the bytes"),
    (lambda t, h, b, fit: fit.predict_ms(t * h * b) * 1e3, "units"),
    (lambda t, h, b, fit: t * h * b / (fit.beta_gbps * 1e9) * 1e3, "left out alpha"),
    (lambda t, h, b, fit: "soon", "return a float"),
])
def test_predict_checker_hints(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        check.predict_allreduce_ms(wrong, bandwidth.AlphaBeta(10.0, 100.0, 0.0))
