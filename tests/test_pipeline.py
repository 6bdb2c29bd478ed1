"""Lab 04: the bubble math and schedules (pure), and the pipelined model against the one-device model
on real gloo ranks (our GPipe loop at 2 and 3 stages, torch.distributed.pipelining's GPipe and 1F1B),
plus the measurement plumbing on CPU ranks (structure only: no timing asserts).

Run: pytest tests/test_pipeline.py -q     (CPU only; ~1 min, mostly rank start-up)
"""
from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import labutils
from labutils import RankError, timing
from labutils.labs.lab04_pipeline import measure, model, pipelining, schedule, verify
from labutils.checks import ExerciseError
from labutils.checks import lab04 as check

TINY = {"n_layers": 4, "hidden": 16, "rows": 32, "dtype": "float32", "ms": [1, 2, 4], "schedule_m": 4,
        "warmup": 1, "repeat": 2}


# ---------------------------------------------------------------- bubble math

@pytest.mark.parametrize("p,m,want", [(1, 1, 0.0), (1, 8, 0.0), (2, 1, 0.5), (2, 8, 1 / 9), (4, 4, 3 / 7),
                                      (8, 32, 7 / 39)])
def test_bubble_fraction(p, m, want):
    assert schedule.bubble_fraction(p, m) == pytest.approx(want)


@pytest.mark.parametrize("p,m", [(0, 1), (2, 0), (2.0, 4), (True, 4), (2, None)])
def test_bubble_fraction_rejects_bad_input(p, m):
    with pytest.raises(ValueError, match="must be an int >= 1"):
        schedule.bubble_fraction(p, m)


def test_ideal_speedup_is_p_times_busy_share():
    for p in (1, 2, 4, 8):
        for m in (1, 4, 16):
            assert schedule.ideal_speedup(p, m) == pytest.approx(p * (1 - schedule.bubble_fraction(p, m)))
    assert schedule.ideal_speedup(2, 1) == 1.0  # naive model parallelism: no gain


@pytest.mark.parametrize("n,p,want", [(8, 2, [(0, 4), (4, 8)]), (8, 3, [(0, 3), (3, 6), (6, 8)]),
                                      (5, 5, [(i, i + 1) for i in range(5)]), (3, 1, [(0, 3)])])
def test_partition(n, p, want):
    assert schedule.partition(n, p) == want


@pytest.mark.parametrize("n,p", [(2, 3), (8, 0), (0, 1)])
def test_partition_errors(n, p):
    with pytest.raises(ValueError):
        schedule.partition(n, p)


def test_activation_bytes():
    assert schedule.activation_bytes(1024, 4096, 2) == 8 * 2**20


# ---------------------------------------------------------------- schedules

@pytest.mark.parametrize("kind", schedule.SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 1), (2, 1), (2, 8), (3, 5), (4, 4), (4, 16), (4, 2)])
def test_orders_run_every_forward_before_its_backward(kind, p, m):
    for ops in schedule.schedule_order(kind, p, m):
        assert sorted(ops) == sorted([("F", i) for i in range(m)] + [("B", i) for i in range(m)])
        for i in range(m):
            assert ops.index(("F", i)) < ops.index(("B", i))


def test_1f1b_order_matches_torch_schedule():
    # torch's Schedule1F1B: min(m, p - s) warm-up forwards, then backward/forward pairs, then backwards
    assert schedule.schedule_order("1f1b", 2, 4) == [
        [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2), ("B", 3)],
        [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2), ("F", 3), ("B", 3)]]


def test_unknown_schedule():
    with pytest.raises(ValueError, match="unknown schedule"):
        schedule.schedule_order("zero-bubble", 2, 4)


@pytest.mark.parametrize("kind", schedule.SCHEDULES)
@pytest.mark.parametrize("p,m", [(1, 3), (2, 2), (2, 8), (3, 3), (4, 8), (5, 12)])
@pytest.mark.parametrize("t_b", [1.0, 2.0])
def test_simulated_bubble_is_the_formula(kind, p, m, t_b):
    spans, makespan = schedule.simulate(schedule.schedule_order(kind, p, m), t_f=1.0, t_b=t_b)
    assert makespan == pytest.approx((m + p - 1) * (1.0 + t_b))
    assert schedule.bubble_from_spans(spans)["mean"] == pytest.approx(schedule.bubble_fraction(p, m))
    assert len(spans) == 2 * p * m


def test_communication_delays_the_fill_and_the_drain():
    p, m, t_c = 3, 6, 0.25
    _, free = schedule.simulate(schedule.schedule_order("gpipe", p, m), 1.0, 2.0)
    _, slow = schedule.simulate(schedule.schedule_order("gpipe", p, m), 1.0, 2.0, t_comm=t_c)
    assert slow == pytest.approx(free + 2 * (p - 1) * t_c)


def test_simulate_detects_a_deadlock():
    bad = [[("B", 0), ("F", 0)], [("F", 0), ("B", 0)]]  # stage 0 waits for a backward that needs its forward
    with pytest.raises(ValueError, match="deadlocks"):
        schedule.simulate(bad)


@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (4, 4), (3, 10)])
def test_peak_in_flight(p, m):
    assert schedule.peak_in_flight(schedule.schedule_order("gpipe", p, m)) == [m] * p
    assert schedule.peak_in_flight(schedule.schedule_order("1f1b", p, m)) == [min(m, p - s) for s in range(p)]


def test_bubble_from_spans_by_hand():
    spans = [{"lane": "a", "start_ms": 0, "end_ms": 3}, {"lane": "a", "start_ms": 5, "end_ms": 8},
             {"lane": "b", "start_ms": 2, "end_ms": 10}]
    got = schedule.bubble_from_spans(spans)
    assert got["step_ms"] == 10 and got["busy_ms"] == {"a": 6, "b": 8}
    assert got["bubble"] == pytest.approx({"a": 0.4, "b": 0.2}) and got["mean"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="no spans"):
        schedule.bubble_from_spans([])


def test_span_timer_on_cpu():
    timer = timing.SpanTimer()
    cpu = torch.device("cpu")
    timer.begin([cpu])
    for i in range(3):
        with timer.span(cpu, "stage 0", "forward", f"F{i}"):
            torch.ones(100).sum()
    spans = timer.spans()
    assert [s["label"] for s in spans] == ["F0", "F1", "F2"]
    assert all(0 <= s["start_ms"] <= s["end_ms"] for s in spans)
    assert all(a["end_ms"] <= b["start_ms"] for a, b in zip(spans, spans[1:]))


# ---------------------------------------------------------------- one process

def test_naive_step_in_one_process_equals_one_device():
    blocks = model.make_blocks(4, 8, dtype=torch.float64)
    x, y = model.make_batch(12, 8, dtype=torch.float64)
    ref = nn.Sequential(*[b for b in model.make_blocks(4, 8, dtype=torch.float64)])
    F.mse_loss(ref(x), y).backward()
    stages = [nn.Sequential(*blocks[a:b]) for a, b in schedule.partition(4, 2)]
    timer = timing.SpanTimer()
    timer.begin([torch.device("cpu")])
    loss = measure.naive_step(stages, [torch.device("cpu")] * 2, x, y, F.mse_loss, timer)
    torch.testing.assert_close(loss, F.mse_loss(ref(x), y).detach())
    torch.testing.assert_close([q.grad for s in stages for q in s.parameters()], [q.grad for q in ref.parameters()])
    assert [s["label"] for s in timer.spans()] == ["F0", "F1", "B1", "B0"]


def test_blocks_are_deterministic_per_layer():
    full = model.make_blocks(4, 8)
    part = model.make_blocks(4, 8, layers=range(2, 4))
    torch.testing.assert_close(list(part[0].parameters()), list(full[2].parameters()))


def test_measure_one_process_on_cpu_structure():
    d = measure.measure_one_process(TINY, devices=("cpu", "cpu"))
    json.dumps(d)
    assert d["one_gpu_ms"] > 0 and d["naive_ms"] > 0 and len(d["naive_samples_ms"]) == TINY["repeat"]
    assert [s["label"] for s in d["spans"]] == ["F0", "F1", "B1", "B0"]


def test_make_schedule_rejects_unknown_schedule():
    with pytest.raises(ValueError, match="not in torch"):
        pipelining.make_schedule(nn.Linear(2, 2), 2, F.mse_loss, "zero-bubble")


def test_summarize_check_raises_on_mismatch(capsys):
    ok = {"not_attempted": False, 1: {"output": None, "grads": "ok", "n_grads": 3}}
    verify.report([ok, {**ok, 1: {"output": "ok", "grads": "ok", "n_grads": 3}}], "x")
    assert "output == one device: True, gradients == one device: True (6 tensors on 2 ranks)" in capsys.readouterr().out
    bad = {**ok, 1: {"output": "output: Tensor-likes are not close!", "grads": "ok", "n_grads": 3}}
    with pytest.raises(AssertionError, match="rank 1: output"):
        verify.report([ok, bad], "x")


# ---------------------------------------------------------------- gloo ranks

@pytest.mark.parametrize("world_size", [2, 3])
def test_gpipe_step_equals_one_device(world_size, no_leaks, capsys):
    res = labutils.launch(verify.against_one_device, schedule.gpipe_step, (1, 2, 4), world_size=world_size, backend="gloo")
    verify.report(res, "gpipe_step")  # raises on any mismatch (torch.testing.assert_close in the ranks)
    assert all(res[-1][m]["output"] == "ok" for m in (1, 2, 4))
    assert all(r[m]["grads"] == "ok" for r in res for m in (1, 2, 4))
    assert sum(r[1]["n_grads"] for r in res) == verify.SMALL["n_layers"] * 6


def test_check_rank_detects_wrong_gradients(no_leaks):
    def double_loss(stage, x, target, loss_fn, m, act_shape):  # a classic bug: forgot a factor
        return schedule.gpipe_step(stage, x, target, lambda o, t: 2 * loss_fn(o, t), m, act_shape)
    res = labutils.launch(verify.against_one_device, double_loss, (2,), world_size=2, backend="gloo")
    assert res[1][2]["output"] == "ok"
    assert all(r[2]["grads"].startswith(f"stage {i} gradients") for i, r in enumerate(res))
    with pytest.raises(AssertionError):
        verify.report(res, "double loss")


def test_torch_pipelining_schedules_equal_one_device(no_leaks, capsys):
    def both(rank, world_size):
        return {s: verify.against_one_device(rank, world_size, functools.partial(pipelining.torch_schedule_step, schedule=s), (2, 4))
                for s in pipelining.available_schedules()}
    res = labutils.launch(both, world_size=2, backend="gloo")
    assert set(res[0]) == {"gpipe", "1f1b"}
    for s in res[0]:
        verify.report([r[s] for r in res], s)


def test_gpipe_step_rejects_indivisible_batch(no_leaks):
    def run(rank, world_size):
        stage = nn.Sequential(*model.make_blocks(2, 4))
        x, y = model.make_batch(10, 4)
        schedule.gpipe_step(stage, x, y, F.mse_loss, 4, (2, 4))
    with pytest.raises(RankError, match="not divisible into 4 equal micro-batches"):
        labutils.launch(run, world_size=1, backend="gloo")


def test_measure_rank_merge_and_comm_summary(no_leaks):
    res = labutils.launch(measure.measure_rank, TINY, world_size=2, backend="gloo")
    d = measure.merge(res, TINY)
    json.dumps(d)
    n = len(TINY["ms"])
    assert d["world_size"] == 2 and len(d["step_ms"]) == n == len(d["bubble_measured"])
    assert d["bubble_predicted"] == [schedule.bubble_fraction(2, m) for m in TINY["ms"]]
    assert all(0 <= b < 1 for b in d["bubble_measured"])
    assert all(len(r) == 2 for r in d["bubble_per_rank"])
    assert len(d["spans"]["4"]) == 2 * 2 * 4  # 2 ranks x (F + B) x m
    assert set(d["schedules_ms"]) == {"gpipe", "1f1b"}
    assert d["memory_bytes"]["ours m=4"] == [None, None]  # CPU: no memory statistics
    assert d["p2p"]["size_bytes"] == [TINY["rows"] // m * TINY["hidden"] * 4 for m in TINY["ms"]]
    ops = measure.comm_summary(d)["ops"]
    assert len(ops) == 2 * n
    assert {k for op in ops for k in op} == {"what", "op", "size_bytes", "world_size", "count_per_step",
                                            "measured_ms", "step_ms"}
    assert ops[0]["what"] == "pipeline activation send, m=1, micro-batch=32, hidden=16, fp32"
    assert [op["count_per_step"] for op in ops[::2]] == TINY["ms"]
    assert all(isinstance(op["size_bytes"], int) and op["measured_ms"] > 0 for op in ops)


# ---------------------------------------------------------------- exercise checkers

def test_bubble_checker(capsys):
    check.bubble_fraction(lambda p, m: (p - 1) / (m + p - 1))
    assert "✓" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="Megatron"):
        check.bubble_fraction(lambda p, m: (p - 1) / m)
    with pytest.raises(ExerciseError, match="one stage"):
        check.bubble_fraction(lambda p, m: 1 / (m + p - 1))

    def stub(p, m):
        raise NotImplementedError
    check.bubble_fraction(stub)
    assert "not attempted" in capsys.readouterr().out
    assert check.usable_bubble(stub)(2, 8) == pytest.approx(1 / 9)


def test_prediction_checker(capsys):
    check.prediction_bubble(None, 2, 8)
    check.prediction_bubble(0.11, 2, 8)
    check.prediction_bubble(11.1, 2, 8)  # a percentage
    out = capsys.readouterr().out
    assert "no prediction" in out and out.count("✓") == 2
    with pytest.raises(ExerciseError, match="HINT"):
        check.prediction_bubble(0.5, 2, 8)
    with pytest.raises(ExerciseError, match="must be a number"):
        check.prediction_bubble("a tenth", 2, 8)


def test_gpipe_loop_checker(no_leaks, capsys):
    def stub(stage, x, target, loss_fn, n_microbatches, act_shape):
        raise NotImplementedError
    check.gpipe_loop(stub, world_size=2, ms=(2,))
    out = capsys.readouterr().out
    assert "not attempted" in out and "✓" in out

    def forgets_the_output(stage, x, target, loss_fn, n_microbatches, act_shape):
        schedule.gpipe_step(stage, x, target, loss_fn, n_microbatches, act_shape)
    with pytest.raises(ExerciseError, match="torch.cat"):
        check.gpipe_loop(forgets_the_output, world_size=2, ms=(2,))


def test_gpipe_loop_checker_explains_a_hang(no_leaks):
    def never_sends(stage, x, target, loss_fn, n_microbatches, act_shape):
        import torch.distributed as dist
        if dist.get_rank() == 1:  # waits for an activation that rank 0 never sends
            dist.recv(torch.empty(act_shape, dtype=torch.float64), src=0)
    with pytest.raises(ExerciseError, match="did not finish within 8 s"):
        check.gpipe_loop(never_sends, world_size=2, ms=(1,), timeout=8)
