"""Lab 02 on real gloo ranks (CPU): the notebook's own code -- Megatron's f and g, the column- and row-parallel
layers, the MLP, the fixed source program -- taken from its source and checked against one-device PyTorch at
world sizes 2 and 3, gradients included; the harness (running a program as written, the measurement functions
at tiny sizes, the verdicts' thresholds); the exercise checkers on right and wrong answers.

Run: pytest tests/test_tensor_parallel.py -q   (two rank pools, 2 and 3 gloo ranks)
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import cloudpickle
import pytest
import torch
import torch.distributed as dist
from torch import nn

from labutils import bandwidth, claims, compat
from labutils.instruments import compare
from labutils.checks import ExerciseError
from labutils.checks import lab02 as check
from labutils.labs.lab02_tensor_parallel import cost_model, measure, paths, script, steps, verify
from labutils.labs.lab02_tensor_parallel.claims import (CLAIMS, paths_verdicts, source_verdicts, sweep_verdicts,
                                                        tp_verdicts, wait_verdict)
from labutils.solutions import lab02 as solution

from notebook_defs import load_definitions

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

nb = load_definitions("02_tensor_parallel")
RECORDED = Path(__file__).resolve().parent.parent / "notebooks" / "recorded"


@pytest.fixture(params=[2, 3], ids=["2 ranks", "3 ranks"])
def pool(request, gloo2, gloo3):
    return gloo2 if request.param == 2 else gloo3


def _all_ok(reports) -> bool:
    compare.report(reports, strict=True)
    return True


# ------------------------------------------------------------------ the notebook's code vs one device
def test_f_and_g_match_their_definitions(pool):
    assert _all_ok(pool.run(verify.operators, nb.CopyToTP, nb.ReduceFromTP))


def test_column_parallel_layer_matches_nn_linear(pool):
    assert _all_ok(pool.run(verify.column_parallel, nb.ColumnParallelLinear))


def test_row_parallel_layer_matches_nn_linear(pool):
    assert _all_ok(pool.run(verify.row_parallel, nb.RowParallelLinear))


def test_tp_mlp_matches_nn_sequential(pool):
    assert _all_ok(pool.run(verify.mlp, nb.TensorParallelMLP))


def test_verify_reports_a_wrong_operator(gloo2):
    class NoSumBackward(torch.autograd.Function):  # f without its all-reduce: the classic bug
        @staticmethod
        def forward(ctx, x, group):
            return x

        @staticmethod
        def backward(ctx, grad):
            return grad, None
    with pytest.raises(AssertionError, match=r"does not hold: f backward: dL/dx = sum of every rank's dL/dy \(rank 0, 1\)"):
        compare.report(gloo2.run(verify.operators, NoSumBackward, nb.ReduceFromTP), strict=True)


def _count_all_reduces(rank, world_size, TensorParallelMLP):
    """All-reduces the notebook's MLP issues in forward and in backward (dist.all_reduce wrapped)."""
    calls = []
    real = dist.all_reduce

    def counting(t, *args, **kwargs):
        calls.append(tuple(t.shape))
        return real(t, *args, **kwargs)
    mlp = TensorParallelMLP(verify.reference_mlp(6, 12, seed=0))
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    dist.all_reduce = counting
    try:
        z = mlp(x)
        forward = list(calls)
        z.sum().backward()
    finally:
        dist.all_reduce = real
    return forward, calls[len(forward):]


def test_mlp_communicates_once_forward_and_once_backward(gloo2):
    forward, backward = gloo2.run(_count_all_reduces, nb.TensorParallelMLP)[0]
    assert forward == [(4, 6)] and backward == [(4, 6)]   # tokens x hidden each way, nothing between layers


class _GatheringColumnLinear(nn.Module):
    """A column-parallel layer whose forward also all-reduces a copy of its output: right numbers, wrong
    communication (what the ledger statements must catch)."""

    def __init__(self, linear, group=None):
        super().__init__()
        self.inner = nb.ColumnParallelLinear(linear, group)
        self.weight, self.bias = self.inner.weight, self.inner.bias

    def forward(self, x):
        y = self.inner(x)
        dist.all_reduce(y.detach().clone())
        return y


def test_the_layer_checks_judge_the_communication(gloo3):
    reports = gloo3.run(verify.column_parallel, nb.ColumnParallelLinear)
    assert reports[0]["communication: forward"] == "nothing"
    assert reports[0]["communication: backward"] == "all_reduce of 320 B"    # f: dL/dX, 5 x 8 float64
    mlp = gloo3.run(verify.mlp, nb.TensorParallelMLP)[0]
    assert mlp["communication: forward"] == mlp["communication: backward"] == "all_reduce of 1 KiB"
    wrong = gloo3.run(verify.column_parallel, _GatheringColumnLinear)
    assert wrong[0]["output: this rank's columns of Y"] == verify.OK
    with pytest.raises(AssertionError, match="communication is what Megatron's design needs"):
        compare.report(wrong, strict=True)


def _indivisible(rank, world_size, ColumnParallelLinear, RowParallelLinear):
    out = []
    for make in (lambda: ColumnParallelLinear(nn.Linear(4, world_size + 1)),
                 lambda: RowParallelLinear(nn.Linear(world_size + 1, 4))):
        try:
            make()
            out.append("built")
        except ValueError as exc:
            out.append(str(exc))
    return out


def test_layers_refuse_shards_of_unequal_size(gloo2):
    for message in gloo2.run(_indivisible, nb.ColumnParallelLinear, nb.RowParallelLinear)[0]:
        assert "does not split into 2 equal shards" in message and "HINT" in message


def _without_bias(rank, world_size, ColumnParallelLinear, RowParallelLinear):
    with torch.random.fork_rng():                           # the same layers and input on every rank
        torch.manual_seed(0)
        up, down = nn.Linear(4, 6, bias=False), nn.Linear(6, 4, bias=False)
        x = torch.randn(3, 4)
    z = RowParallelLinear(down)(ColumnParallelLinear(up)(x))
    return torch.allclose(z, down(up(x)), atol=1e-6)


def test_layers_without_bias(gloo2):
    assert all(gloo2.run(_without_bias, nb.ColumnParallelLinear, nb.RowParallelLinear))


def test_fixed_program_gathers_twice_the_tensor(pool):
    assert all(all(checks.values()) for checks in pool.run(nb.tensor_parallel_fixed))


def test_source_body_gathers_a_mosaic(gloo2):
    (t0, f0), (t1, f1) = gloo2.run(nb.tensor_parallel_body)
    assert torch.equal(f0, f1) and not torch.equal(t0, t1)
    assert torch.equal(f0[:500], 2 * t0[:500]) and torch.equal(f0[500:], 2 * t1[500:])


def test_uneven_source_style_is_caught_and_the_padded_gather_is_right(gloo2):
    for line in gloo2.run(nb.uneven_source_style):
        assert "caught a mismatch: True" in line and "padded all_gather == 2 x tensor: True" in line


# ------------------------------------------------------------------ running a program as written
def test_run_program_reports_success_and_output():
    out = script.run_program("print('one')\nprint('two')\n", timeout_s=60)
    assert (out["raised"], out["returncode"], out["timed_out"], out["exc_type"]) == (False, 0, False, None)
    assert out["printed_lines"] == 2 and out["output_tail"] == "one\ntwo"


def test_run_program_reports_the_last_exception_with_short_paths():
    out = script.run_program("def f():\n    raise ValueError('bad value: 3')\nf()\n", timeout_s=60)
    assert out["raised"] and out["returncode"] == 1
    assert (out["exc_type"], out["message"]) == ("ValueError", "bad value: 3")
    assert 'File "<tmp>/program.py", line 2' in out["output_tail"]


def test_run_program_stops_a_program_and_its_children_at_the_timeout(tmp_path):
    marker, child = tmp_path / "child_outlived_the_timeout", tmp_path / "child.py"
    child.write_text(f"import pathlib, time\ntime.sleep(4)\npathlib.Path({str(marker)!r}).write_text('x')\n")
    program = (f"import subprocess, sys, time\n"
               f"subprocess.Popen([sys.executable, {str(child)!r}])   # like mp.spawn's ranks\n"
               f"print('started', flush=True)\ntime.sleep(60)\n")
    out = script.run_program(program, timeout_s=2)
    assert out["timed_out"] and out["raised"] and out["returncode"] is None, out
    assert out["output_tail"] == "started"
    time.sleep(4.5)
    assert not marker.exists(), "the program's child outlived the timeout"


def test_run_program_refuses_a_non_positive_timeout():
    with pytest.raises(ValueError, match="HINT"):
        script.run_program("pass", timeout_s=0)


def test_last_exception_and_paths():
    text = ("Traceback (most recent call last):\n"
            '  File "/x/lib/python3.12/site-packages/torch/distributed/c10d.py", line 1, in f\n'
            "torch.multiprocessing.spawn.ProcessRaisedException: \n\n-- Process 1 terminated\n"
            "torch.distributed.DistNetworkError: port in use\n[W warning line]\n")
    assert script.last_exception(text) == ("DistNetworkError", "port in use")
    assert script.last_exception("all fine\n") == (None, None)
    assert 'File "torch/distributed/c10d.py"' in script.shorten_paths(text, "/nowhere")


# ------------------------------------------------------------------ the measurement functions (tiny sizes)
def _measure_all(rank, world_size, TensorParallelMLP):
    return {"sweep": measure.collective_sweep(rank, world_size, [64, 1024], warmup=1, iters=2, repeat=2),
            "objects": measure.object_vs_tensor(rank, world_size, [256, 4096], repeat=2, link_iters=1),
            "partitions": measure.partitions(rank, world_size, [1, 2], rows=8, cols=4, dtype="float32",
                                              steps=2, warmup=1),
            "paths": paths.link_paths(rank, world_size, 1024),
            "mlp": steps.tp_mlp_sweep(rank, world_size, TensorParallelMLP, [8], tokens=4, dtype="float32",
                                      target_ms=0.5, repeat=2, profiled_steps=2)}


@pytest.fixture(scope="module")
def measured(gloo2):
    return gloo2.run(_measure_all, nb.TensorParallelMLP)


def test_collective_sweep_uses_nccl_tests_definitions(measured):
    ops = measured[0]["sweep"]["ops"]
    assert set(ops) == set(measure.SWEEP_OPS)
    for op, cols in ops.items():
        for s, t, alg, bus in zip(cols["size_bytes"], cols["time_ms"], cols["algbw_gbps"], cols["busbw_gbps"]):
            assert alg == pytest.approx(s / (t * 1e-3) / 1e9)
            assert bus == pytest.approx(alg * bandwidth.bus_factor(op, 2))


def test_object_path_pickles_about_the_tensor_bytes(measured):
    rows = measured[0]["objects"]["rows"]
    assert [r["size_bytes"] for r in rows] == [256, 4096]
    assert all(r["size_bytes"] < r["pickled_bytes"] < r["size_bytes"] + 4096 for r in rows)
    assert rows[-1]["received_devices"] == ["cpu"]
    assert measured[0]["objects"]["link"]["payload_bytes_per_call"] == 2 * 4096


def test_gloo_refuses_unequal_list_all_gather(measured):
    assert "invalid tensor size" in measured[0]["partitions"]["uneven_list"]["gloo"]


def test_imbalance_reports_every_rank_and_paths_need_gpus(measured):
    imb = measured[0]["partitions"]["imbalance"]
    assert imb["factors"] == [1, 2] and all(len(v) == 2 for v in imb["step_ms"])
    assert measured[0]["paths"] is None          # no GPU link on gloo


def test_tp_mlp_sweep_times_both_and_has_no_kernels_on_cpu(measured):
    (row,) = measured[0]["mlp"]
    assert row["allreduce_bytes"] == 4 * 8 * 4 and row["ffn_hidden"] == 32
    assert all(row[k] > 0 for k in ("one_gpu_fwd_ms", "one_gpu_train_ms", "tp_fwd_ms", "tp_train_ms"))
    assert row["allreduce_fwd_ms"] is None and row["allreduce_fwd_calls_ms"] == [[], []]


def test_tp_mlp_sweep_on_a_subgroup(gloo3):
    rows = gloo3.run(steps.tp_mlp_sweep, nb.TensorParallelMLP, [8],
                     kwargs=dict(tokens=4, dtype="float32", target_ms=0.5, repeat=2, profiled_steps=1, tp_size=2))
    assert [len(r) for r in rows] == [1, 1, 0]     # rank 2 is outside the tensor-parallel group


def test_split_calls_pairs_the_calls_across_ranks():
    split = steps.split_calls([[1.0, 5.0, 1.1], [5.0, 1.0, 5.2]])
    assert split == {"in_step_ms": 5.0, "transfer_ms": 1.0, "wait_ms": 4.0, "calls": 3}
    assert steps.split_calls([[], []])["transfer_ms"] is None
    assert steps.nccl_kernel_ms(lambda: None, 2, "cpu") == []


def _time_alone(rank, world_size):
    made = []
    group = dist.new_group(backend="gloo")

    def make():
        made.append(rank)
        return lambda: torch.ones(256).sum()
    out = paths.time_alone(rank, make, group, warmup=1, iters=2, repeat=3)
    dist.destroy_process_group(group)
    return out, made


def test_time_alone_runs_on_rank_0_only_and_shares_its_result(gloo3):
    results = gloo3.run(_time_alone)
    assert [made for _, made in results] == [[0], [], []]
    assert len({out for out, _ in results}) == 1 and results[0][0][0] > 0


def test_nvlink_counter_absent_means_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails as on a machine without NVML
    assert measure.nvlink_tx_bytes() is None


def test_unknown_sweep_op_is_refused():
    with pytest.raises(ValueError, match="HINT: one of"):
        measure._collective("all_scatter", 64, 2, torch.device("cpu"), torch.float32)


# ------------------------------------------------------------------ cost model, summary, verdicts
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


def test_comm_summary_keeps_lab06_fields_and_documents_them():
    rows = [{"hidden": 1024, "tokens": 4096, "dtype": "bfloat16", "allreduce_bytes": 8 * 2**20,
             "allreduce_fwd_ms": 0.05, "allreduce_fwd_kernel_ms": 0.03, "allreduce_fwd_wait_ms": 0.02,
             "tp_fwd_ms": 0.4}]
    summary = cost_model.comm_summary(rows, world_size=2)
    (op,) = summary["ops"]
    assert op == {"what": "TP MLP forward all_reduce, hidden=1024, tokens=4096, bfloat16",
                  "op": "all_reduce", "size_bytes": 8 * 2**20, "world_size": 2, "count_per_step": 1,
                  "measured_ms": 0.05, "kernel_ms": 0.03, "wait_ms": 0.02, "step_ms": 0.4}
    assert set(summary["fields"]) == set(op)
    old = dict(rows[0])
    del old["allreduce_fwd_kernel_ms"], old["allreduce_fwd_wait_ms"]
    assert cost_model.comm_summary([old], 2)["ops"][0]["kernel_ms"] is None


def test_every_recording_gives_verdicts():
    for key, fn in CLAIMS.items():
        names = (key,) if isinstance(key, str) else key
        if not all((RECORDED / f"{n}.json").exists() for n in names):
            continue   # not recorded yet: test_claims names it
        verdicts = fn(*[json.loads((RECORDED / f"{n}.json").read_text())["data"] for n in names])
        assert verdicts and all(v.verdict in (claims.TRUE, claims.FALSE, "UNTESTED") for v in verdicts)


def _path_rows(copy_one, copy_both, ag, ag_many, one_process):
    rows = [("copy engine, one way", None, copy_one), ("copy engine, both ways", None, copy_both),
            ("NCCL send/recv, both ways", None, 350.0), ("all_gather_into_tensor", None, ag),
            ("all_gather_into_tensor, 8 CTAs", 8, ag / 2), ("all_gather_into_tensor, 64 CTAs", 64, ag_many),
            (paths.ONE_PROCESS, None, one_process)]
    return {"size_bytes": 2**30, "rows": [{"path": p, "ctas": c, "gbps_per_direction": g, "spread": 0.02}
                                          for p, c, g in rows]}


@pytest.mark.parametrize("numbers, expected", [
    ((390.0, 380.0, 270.0, 330.0, 265.0), ["TRUE"] * 3),   # what 2xH200 looks like
    ((390.0, 200.0, 190.0, 195.0, 120.0), ["FALSE"] * 3),  # a link that halves both ways, no CTA effect
])
def test_path_verdicts_follow_their_thresholds(numbers, expected):
    assert [v.verdict for v in paths_verdicts(_path_rows(*numbers))] == expected


def test_source_verdict_on_a_timeout_and_on_success():
    (v,) = source_verdicts({"raised": True, "timed_out": True, "seconds": 120.0, "returncode": None})
    assert v.verdict == "FALSE" and "killed" in v.figure
    assert source_verdicts({"raised": False, "returncode": 0})[0].verdict == "TRUE"


def test_tp_verdicts_use_the_kernel_times_when_recorded():
    coll = json.loads((RECORDED / "02_collectives.json").read_text())["data"]
    tp = json.loads((RECORDED / "02_tp_mlp.json").read_text())["data"]
    for r in tp["rows"]:   # as an older recording without the profiled kernel times
        r.pop("allreduce_fwd_kernel_ms", None)
    base = len(tp_verdicts(coll, tp))
    for r in tp["rows"]:
        r.update(allreduce_fwd_kernel_ms=r["allreduce_bytes"] / 330e6, allreduce_fwd_ms=2 * r["allreduce_bytes"] / 330e6)
    extra = tp_verdicts(coll, tp)[base:]
    assert [v.verdict for v in extra] == ["TRUE", "TRUE"]   # kernel at the fit's beta; in-step twice the transfer


def _tp_row(hidden, in_step_ms, transfer_ms, step_ms):
    return {"hidden": hidden, "allreduce_bytes": hidden * 4096 * 2, "allreduce_fwd_ms": in_step_ms,
            "allreduce_fwd_kernel_ms": transfer_ms, "tp_fwd_ms": step_ms}


def test_wait_verdict_judges_only_sizes_whose_in_step_time_fits_inside_their_step():
    rows = [_tp_row(512, 0.65, 0.03, 0.37),     # longer than its whole unprofiled step: not judged
            _tp_row(1024, 0.05, 0.045, 0.45)]
    v = wait_verdict(rows)
    assert v.verdict == "FALSE" and v.figure.startswith("at 8 MiB") and "1 of 2 sizes" in v.figure
    rows[1]["allreduce_fwd_ms"] = 0.3
    assert wait_verdict(rows).verdict == "TRUE"
    assert wait_verdict(rows[:1]).verdict == "UNTESTED"
    assert wait_verdict([dict(rows[1], allreduce_fwd_kernel_ms=None)]).verdict == "UNTESTED"


def test_the_link_share_verdict_names_the_rate_it_judges_against():
    coll = json.loads((RECORDED / "02_collectives.json").read_text())["data"]
    (v,) = [x for x in sweep_verdicts(coll) if "large share of the link" in x.claim]
    assert "NVLink line rate (nvidia-smi)" in v.figure and "datasheet" not in v.figure


# ------------------------------------------------------------------ the exercise checkers
def test_checkers_fall_back_to_the_reference_for_stubs(gloo3, capsys):
    class Stub(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y, group):
            raise NotImplementedError

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError

    def stub(*args):
        raise NotImplementedError
    check.gather_rows_uneven(stub, pool=gloo3)
    check.gather_from_tp(Stub, nb.ColumnParallelLinear, pool=gloo3)
    check.transfer_and_wait(stub)
    out, err = capsys.readouterr()
    assert err.count("not attempted") == 3 and "✓" not in out
    assert check.usable_transfer_and_wait(stub) is None and "not attempted" in capsys.readouterr().err


def test_checkers_pass_the_reference_solutions(gloo3, capsys):
    check.gather_rows_uneven(solution.gather_rows_uneven, pool=gloo3)
    check.gather_from_tp(solution.GatherFromTP, nb.ColumnParallelLinear, pool=gloo3)
    check.transfer_and_wait(solution.transfer_and_wait)
    out = capsys.readouterr().out
    assert "not attempted" not in out and out.count("✓") == 3
    assert "3 ranks, row counts [3, 1, 2], [0, 2, 1], [4, 4, 4]" in out and "on 3 ranks; forward one all-gather" in out


def test_checkers_refuse_a_pool_of_the_wrong_shape(gloo2):
    with pytest.raises(ValueError, match="HINT"):
        check.gather_rows_uneven(solution.gather_rows_uneven, pool=gloo2)


def _keeps_padding(x, group):
    n = dist.get_world_size(group)
    counts = torch.empty(n, dtype=torch.int64)
    compat.all_gather_into_tensor(counts, torch.tensor([x.shape[0]]))
    padded = x.new_zeros(int(counts.max()), *x.shape[1:])
    padded[: x.shape[0]] = x
    out = x.new_empty(n * padded.shape[0], *x.shape[1:])
    compat.all_gather_into_tensor(out, padded)
    return out


def _counts(x, group):
    n = dist.get_world_size(group)
    counts = torch.empty(n, dtype=torch.int64)
    compat.all_gather_into_tensor(counts, torch.tensor([x.shape[0]]))
    return counts.tolist()


def _all_reduce_of_a_padded_buffer(x, group):   # right rows, but an all-reduce of mostly zeros
    counts, rank = _counts(x, group), dist.get_rank(group)
    out = x.new_zeros(sum(counts), *x.shape[1:])
    out[sum(counts[:rank]): sum(counts[:rank + 1])] = x
    dist.all_reduce(out)
    return out


def _one_broadcast_per_rank(x, group):          # right rows, n collectives for the data
    counts = _counts(x, group)
    blocks = []
    for r, c in enumerate(counts):
        block = x.clone() if r == dist.get_rank(group) else x.new_empty(c, *x.shape[1:])
        dist.broadcast(block, src=r)
        blocks.append(block)
    return torch.cat(blocks)


def _through_pickles(x, group):                 # right rows, pickled: more bytes than the rows
    blocks = [None] * dist.get_world_size(group)
    dist.all_gather_object(blocks, x)
    return torch.cat(blocks)


def _padded_to_the_total(x, group):            # right rows, every block padded to the whole batch
    counts = _counts(x, group)
    n, total = len(counts), sum(counts)
    padded = x.new_zeros(total, *x.shape[1:])
    padded[: x.shape[0]] = x
    out = x.new_empty(n * total, *x.shape[1:])
    compat.all_gather_into_tensor(out, padded)
    return torch.cat([out[r * total: r * total + c] for r, c in enumerate(counts)])


@pytest.mark.parametrize("wrong, hint", [
    (_keeps_padding, "padding is still there"),
    (lambda x, group: solution.gather_rows_uneven(x, group).flip(0), "rank order"),
    (lambda x, group: x, "sum of the counts"),
    (_all_reduce_of_a_padded_buffer, r"issued all_gather of 24 B, all_reduce of .*HINT: an all-reduce of a "
                                     r"zero-filled buffer.*2\(n-1\)/n"),
    (_one_broadcast_per_rank, "HINT: move the data in one all_gather_into_tensor"),
    (_through_pickles, "larger than every block padded to the longest"),
    (_padded_to_the_total, "larger than every block padded to the longest"),
])
def test_gather_checker_hints(gloo3, wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        check.gather_rows_uneven(wrong, pool=gloo3)


class _FullGradBack(torch.autograd.Function):   # backward forgets to keep only this rank's columns
    @staticmethod
    def forward(ctx, y, group):
        return solution.GatherFromTP.forward(ctx, y, group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _SummedGradBack(torch.autograd.Function):  # backward sums over the ranks as well
    @staticmethod
    def forward(ctx, y, group):
        return solution.GatherFromTP.forward(ctx, y, group)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return solution.GatherFromTP.backward(ctx, grad)[0], None


class _Stacked(torch.autograd.Function):         # all_gather_into_tensor without rearranging the blocks
    @staticmethod
    def forward(ctx, y, group):
        out = y.new_empty(dist.get_world_size() * y.shape[0], y.shape[1])
        compat.all_gather_into_tensor(out, y.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size())[dist.get_rank()], None


def _no_autograd(y, group):                      # right values, but gathered outside autograd
    blocks = [torch.empty_like(y) for _ in range(dist.get_world_size())]
    dist.all_gather(blocks, y.detach().contiguous())
    return torch.cat(blocks, dim=-1)


class _AllReducedBack(torch.autograd.Function):  # right gradients, but an all-reduce (then / n) for nothing
    @staticmethod
    def forward(ctx, y, group):
        return solution.GatherFromTP.forward(ctx, y, group)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad)
        return solution.GatherFromTP.backward(ctx, grad / dist.get_world_size())[0], None


class _AllReducedForward(torch.autograd.Function):  # right Y, by an all-reduce of a zero-padded Y
    @staticmethod
    def forward(ctx, y, group):
        n, rank = dist.get_world_size(), dist.get_rank()
        full = y.new_zeros(y.shape[0], n * y.shape[1])
        full[:, rank * y.shape[1]: (rank + 1) * y.shape[1]] = y
        dist.all_reduce(full)
        return full

    @staticmethod
    def backward(ctx, grad):
        return grad.chunk(dist.get_world_size(), dim=-1)[dist.get_rank()], None


@pytest.mark.parametrize("wrong, hint", [
    (_FullGradBack, "shaped like that input"),
    (_SummedGradBack, "3 x too large"),
    (_Stacked, "stacks the blocks along dim 0"),
    (_no_autograd, "carries no gradient"),
    (_AllReducedBack, r"backward issued all_reduce of 240 B, all_reduce of 160 B; expected only f's all_reduce of "
                      r"dL/dX \(160 B\).*HINT: every rank already holds the whole dL/dY"),
    (_AllReducedForward, r"forward issued all_reduce of 240 B; expected one all_gather of Y \(240 B\).*HINT: an "
                         r"all-reduce of a zero-padded Y"),
])
def test_gather_from_tp_checker_hints(gloo3, wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        check.gather_from_tp(wrong, nb.ColumnParallelLinear, pool=gloo3)


def _per_rank_medians(calls_ms):
    import statistics
    meds = [statistics.median(r) for r in calls_ms]
    return min(meds), max(meds) - min(meds)


@pytest.mark.parametrize("wrong, hint", [
    (_per_rank_medians, "pair the calls"),
    (lambda c: tuple(reversed(solution.transfer_and_wait(c))), "the order is"),
    (lambda c: 1.0, "return a tuple"),
])
def test_transfer_and_wait_checker_hints(wrong, hint):
    with pytest.raises(ExerciseError, match=hint):
        check.transfer_and_wait(wrong)
