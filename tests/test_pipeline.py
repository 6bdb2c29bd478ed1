"""Lab 04: the bubble math, schedules (and the 1F1B-order checker) and their analysis (pure), the verdicts' thresholds, and the
pipelined model against the one-device model on real gloo ranks -- the notebook's own GPipe loop
(``tests/notebook_defs.py`` loads it from ``notebooks/src/04_pipeline.py``) at 2 and 3 stages,
torch.distributed.pipelining's GPipe and 1F1B, the 1F1B reference and its checker -- plus the
measurement plumbing on CPU ranks (structure only: no timing asserts).

Run: pytest tests/test_pipeline.py -q     (CPU only; a few minutes on 2 cores, mostly rank start-up)
"""
from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import labutils
from labutils import claims, timing
from labutils.labs.lab04_pipeline import analysis, gpu_clock, measure, model, naive, pipelining, schedule, verify
from labutils.labs.lab04_pipeline import claims as lab_claims
from labutils.checks import ExerciseError
from labutils.checks import lab04 as check
from labutils.solutions import lab04 as solution

from notebook_defs import load_definitions  # tests/notebook_defs.py (pytest puts tests/ on sys.path)

nb = load_definitions("04_pipeline")  # the notebook's own naive_send_recv and gpipe_step

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


def test_simulate_with_per_stage_times_and_directional_transfers():
    # p = 2, m = 1: F0 on stage 0, transfer, F0 on stage 1, B0 on stage 1, transfer back, B0 on stage 0
    spans, makespan = schedule.simulate(schedule.schedule_order("gpipe", 2, 1), t_f=[1.0, 2.0], t_b=[3.0, 4.0],
                                        t_comm=(0.5, 0.25))
    assert makespan == pytest.approx(1.0 + 0.5 + 2.0 + 4.0 + 0.25 + 3.0)
    by_label = {(s["lane"], s["label"]): (s["start_ms"], s["end_ms"]) for s in spans}
    assert by_label[("stage 1", "F0")] == pytest.approx((1.5, 3.5))
    assert by_label[("stage 0", "B0")] == pytest.approx((7.75, 10.75))
    # the slower stage sets the pace: with m micro-batches the step is at least m x its forward + backward
    _, slow = schedule.simulate(schedule.schedule_order("gpipe", 2, 8), t_f=[1.0, 2.0], t_b=[2.0, 4.0])
    assert slow >= 8 * 6.0
    with pytest.raises(ValueError, match="one per stage"):
        schedule.simulate(schedule.schedule_order("gpipe", 2, 2), t_f=[1.0, 2.0, 3.0])


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
    loss = naive.naive_step(stages, [torch.device("cpu")] * 2, x, y, F.mse_loss, timer)
    torch.testing.assert_close(loss, F.mse_loss(ref(x), y).detach())
    torch.testing.assert_close([q.grad for s in stages for q in s.parameters()], [q.grad for q in ref.parameters()])
    assert [s["label"] for s in timer.spans()] == ["F0", "F1", "B1", "B0"]


def test_blocks_are_deterministic_per_layer():
    full = model.make_blocks(4, 8)
    part = model.make_blocks(4, 8, layers=range(2, 4))
    torch.testing.assert_close(list(part[0].parameters()), list(full[2].parameters()))


def test_measure_one_process_on_cpu_structure():
    d = naive.measure_one_process(TINY, devices=("cpu", "cpu"))
    json.dumps(d)
    assert d["one_gpu_ms"] > 0 and d["naive_ms"] > 0 and len(d["naive_samples_ms"]) == TINY["repeat"]
    assert len(d["one_gpu_samples_ms"]) == len(d["one_gpu_rested_samples_ms"]) == TINY["repeat"]
    assert d["rest_ms"] == pytest.approx(d["one_gpu_ms"])  # rests as long as a step lasts
    assert d["gpu_clock"] == {"back to back": None, "rested": None}  # no NVML on the CPU
    assert [s["label"] for s in d["spans"]] == ["F0", "F1", "B1", "B0"]
    assert len(lab_claims.naive_verdicts(d)) == 2  # the speedup and the rested comparison; no clocks


def test_gpu_clock_without_a_gpu():
    assert gpu_clock.read("cpu") is None
    assert gpu_clock.while_running(12.5, "cpu") == []  # a host time: nothing to poll
    assert gpu_clock.median([]) is None
    assert gpu_clock.median([{"clock_mhz": 1500.0, "power_w": 300.0}, {"clock_mhz": 1700.0, "power_w": 500.0},
                             {"clock_mhz": 1600.0, "power_w": 100.0}]) == {"clock_mhz": 1600.0, "power_w": 300.0}


def test_order_recorder_notes_forwards_and_backwards():
    stage = nn.Linear(3, 3)
    order = verify.order_recorder(stage)
    outs = [stage(torch.ones(2, 3)) for _ in range(3)]
    outs[1].sum().backward()
    outs[0].sum().backward()
    assert order == [("F", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 0)]


def test_make_schedule_rejects_unknown_schedule():
    with pytest.raises(ValueError, match="not in torch"):
        pipelining.make_schedule(nn.Linear(2, 2), 2, F.mse_loss, "zero-bubble")


def test_summarize_check_raises_on_mismatch(capsys):
    ok = {"not_attempted": False, 1: {"output": None, "grads": "ok", "n_grads": 3}}
    verify.report([ok, {**ok, 1: {"output": "ok", "grads": "ok", "n_grads": 3}}], "x")
    assert capsys.readouterr().out.splitlines() == [
        "x, 2 stages", "  m = 1: output == one device: True", "  m = 1: gradients == one device: True",
        "  m = 1: gradient tensors on 2 ranks: 6"]
    bad = {**ok, 1: {"output": "output: Tensor-likes are not close!", "grads": "ok", "n_grads": 3}}
    with pytest.raises(AssertionError, match="does not hold: m = 1: output == one device$"):
        verify.report([ok, bad], "x")
    assert "m = 1: output == one device: rank 1: output: Tensor-likes are not close!" in capsys.readouterr().out


# ---------------------------------------------------------------- analysis and verdicts (pure)

def _bench(spans_by_m, ms=(1, 4), p=2, p2p_ms=0.0, samples=None):
    """A synthetic "04_pipeline_bench" recording around spans made by the simulator."""
    measured = [schedule.bubble_from_spans(spans_by_m[m])["mean"] for m in ms]
    return {"world_size": p, "config": {"ms": list(ms), "schedule_m": 4, "rows": 8, "hidden": 4},
            "spans": {str(m): spans_by_m[m] for m in ms}, "bubble_measured": measured,
            "bubble_predicted": [schedule.bubble_fraction(p, m) for m in ms],
            "bubble_samples": samples, "p2p": {"fwd_ms": [p2p_ms] * len(ms), "bwd_ms": [p2p_ms] * len(ms)},
            "memory_bytes": {}, "element_size": 2}


def test_bubble_breakdown_explains_a_simulated_step():
    p, t_f, t_b, c = 2, [1.0, 1.5], [2.0, 3.0], 0.2
    spans = {m: schedule.simulate(schedule.schedule_order("gpipe", p, m), t_f, t_b, c)[0] for m in (1, 4)}
    rows = analysis.bubble_breakdown(_bench(spans, p2p_ms=c))
    for r in rows:
        assert r["with_sends"] == pytest.approx(r["measured"]) and abs(r["unexplained"]) < 1e-9
        assert r["stage_times"] <= r["with_sends"] and r["ideal"] == schedule.bubble_fraction(p, r["m"])
        assert r["host_wait"] is None and r["tolerance"] == 0.02  # simulated spans carry no host times
    assert analysis.stage_times(spans[4], p) == {"t_f": t_f, "t_b": t_b}
    with pytest.raises(ValueError, match="no forward spans for stage 2"):
        analysis.stage_times(spans[4], 3)


def test_host_wait_counts_idle_time_before_ops_the_host_issued_late():
    spans = [  # stage 0: idle 2 ms before F1, which the host issued at 5.0 (GPU start 5.02): host-bound
        {"lane": "stage 0", "start_ms": 0.0, "end_ms": 3.0, "host_start_ms": 0.0},
        {"lane": "stage 0", "start_ms": 5.02, "end_ms": 10.0, "host_start_ms": 5.0},
        # stage 1: idle 4 ms before its op, issued long before the GPU got there: waiting for data
        {"lane": "stage 1", "start_ms": 4.0, "end_ms": 10.0, "host_start_ms": 0.5}]
    assert analysis.host_wait_share(spans) == pytest.approx((2.02 / 10 + 0.0) / 2)
    assert analysis.host_wait_share([{k: v for k, v in s.items() if k != "host_start_ms"} for s in spans]) is None


def test_bubble_tolerance_is_two_points_or_the_samples_range():
    assert analysis.bubble_tolerance(None) == 0.02
    assert analysis.bubble_tolerance([0.10, 0.11]) == 0.02
    assert analysis.bubble_tolerance([0.10, 0.20, 0.30]) == pytest.approx(0.16)  # p90 - p10


def test_memory_prediction_from_its_parts():
    data = {"world_size": 2, "element_size": 2, "config": {"schedule_m": 4, "rows": 8, "hidden": 4},
            "memory_bytes": {"one micro-batch kept": [100, 110], "one micro-batch backward": [50, 60],
                             "ours m=4": [460, 560], "torch gpipe m=4": [450, 560], "torch 1f1b m=4": [250, 234]}}
    pred = analysis.memory_prediction(data)
    outputs = 8 * 4 * 2  # the last stage keeps the whole batch's output
    assert pred["ours gpipe"] == [4 * 100 + 50, 4 * 110 + 60 + outputs]
    assert pred["torch 1f1b"] == [2 * 100 + 50, 1 * 110 + 60 + outputs]  # 1F1B holds p - s
    assert analysis.measured_memory(data)["torch 1f1b"] == [250, 234]
    assert analysis.memory_prediction({**data, "memory_bytes": {"one micro-batch kept": [None, None]}}) is None


def test_naive_verdicts_follow_their_thresholds():
    nd = {"one_gpu_ms": 84.0, "one_gpu_samples_ms": [84.0, 84.1, 83.9], "naive_ms": 77.0,
          "naive_samples_ms": [77.0, 77.1, 76.9], "one_gpu_rested_ms": 78.0,
          "one_gpu_rested_samples_ms": [78.0, 78.1, 77.9], "rest_ms": 84.0,
          "gpu_clock": {"back to back": {"clock_mhz": 1500.0, "power_w": 400.0},
                        "rested": {"clock_mhz": 1800.0, "power_w": 600.0}}}
    v = lab_claims.naive_verdicts(nd)
    assert [x.verdict for x in v] == ["TRUE", "TRUE", "TRUE"]
    assert v[0].rule == "TRUE if > 1.02"  # tight samples: the 2% floor
    noisy = {**nd, "one_gpu_samples_ms": [84.0, 70.0, 100.0]}  # a 30% spread: 1.09x is noise
    assert lab_claims.naive_verdicts(noisy)[0].verdict == "FALSE"
    far = {**nd, "one_gpu_rested_ms": 84.0, "gpu_clock": {"back to back": {"clock_mhz": 1500.0, "power_w": 1.0},
                                                          "rested": {"clock_mhz": 1510.0, "power_w": 1.0}}}
    assert [x.verdict for x in lab_claims.naive_verdicts(far)[1:]] == ["FALSE", "FALSE"]


def test_bubble_verdict_words():
    rows = [{"m": m, "measured": meas, "ideal": ideal, "tolerance": 0.02}
            for m, meas, ideal in ((1, 0.50, 0.50), (4, 0.21, 0.20), (16, 0.10, 0.06))]
    assert lab_claims._bubble_verdict("c", rows, "ideal").verdict == "UP TO m=4"
    assert lab_claims._bubble_verdict("c", rows[:2], "ideal").verdict == "TRUE"
    assert lab_claims._bubble_verdict("c", rows[2:], "ideal").verdict == "FALSE"


def test_verdicts_work_on_the_recordings():
    """Old recordings lack the newer fields: the verdicts that need them are left out, the others hold."""
    from labutils import recorded
    for name, fn in lab_claims.CLAIMS.items():
        if not (recorded.recorded_dir() / f"{name}.json").exists():
            continue   # not recorded yet: test_claims names it
        verdicts = fn(recorded.load(name).data)
        assert verdicts and all(isinstance(x, claims.Verdict) for x in verdicts)


# ---------------------------------------------------------------- gloo ranks


def test_notebook_loops_equal_one_device_on_3_ranks(gloo3, capsys):
    res = gloo3.run(verify.against_one_device, nb.gpipe_step, (1, 2, 4))
    verify.report(res, "gpipe_step")  # raises on any mismatch (torch.testing.assert_close in the ranks)
    assert all(res[-1][m]["output"] == "ok" for m in (1, 2, 4))
    assert all(r[m]["grads"] == "ok" for r in res for m in (1, 2, 4))
    assert sum(r[1]["n_grads"] for r in res) == verify.SMALL["n_layers"] * 6
    verify.report(gloo3.run(verify.against_one_device, nb.naive_send_recv, (1,)), "naive_send_recv")
    res = gloo3.run(verify.against_one_device, solution.one_f_one_b_step, (2, 6), kwargs={"record_order": True})
    verify.report(res, "one_f_one_b_step")
    assert [schedule.peak_in_flight([r[6]["order"]])[0] for r in res] == [3, 2, 1]
    assert [op for op in res[1][6]["order"]] == schedule.schedule_order("1f1b", 3, 6)[1]


def test_check_rank_detects_wrong_gradients(gloo3):
    def double_loss(stage, x, target, loss_fn, m, act_shape):  # a classic bug: forgot a factor
        return nb.gpipe_step(stage, x, target, lambda o, t: 2 * loss_fn(o, t), m, act_shape)
    res = gloo3.run(verify.against_one_device, double_loss, (2,))
    assert res[2][2]["output"] == "ok"
    assert all(r[2]["grads"].startswith(f"stage {i} gradients") for i, r in enumerate(res))
    with pytest.raises(AssertionError):
        verify.report(res, "double loss")


def test_torch_pipelining_schedules_equal_one_device(gloo3, capsys):
    def both(rank, world_size):
        return {s: verify.against_one_device(rank, world_size, functools.partial(pipelining.torch_schedule_step, schedule=s), (3, 6))
                for s in pipelining.available_schedules()}
    res = gloo3.run(both)
    assert set(res[0]) == {"gpipe", "1f1b"}
    for s in res[0]:
        verify.report([r[s] for r in res], s)


def test_measure_rank_merge_and_comm_summary(no_leaks):
    res = labutils.launch(measure.measure_rank, nb.gpipe_step, TINY, world_size=2, backend="gloo")
    d = measure.merge(res, TINY)
    json.dumps(d)
    n = len(TINY["ms"])
    assert d["world_size"] == 2 and len(d["step_ms"]) == n == len(d["bubble_measured"])
    assert d["bubble_predicted"] == [schedule.bubble_fraction(2, m) for m in TINY["ms"]]
    assert all(0 <= b < 1 for b in d["bubble_measured"])
    assert [len(b) for b in d["bubble_samples"]] == [TINY["repeat"]] * n
    assert all(len(r) == 2 for r in d["bubble_per_rank"])
    assert all(len(st["t_f"]) == len(st["t_b"]) == 2 for st in d["stage_ms"])
    assert len(d["spans"]["4"]) == 2 * 2 * 4  # 2 ranks x (F + B) x m
    assert all("host_start_ms" in s for s in d["spans"]["4"])
    assert set(d["schedules_ms"]) == {"gpipe", "1f1b"}
    assert d["memory_bytes"]["ours m=4"] == [None, None]  # CPU: no memory statistics
    assert d["memory_bytes"]["one micro-batch backward"] == [None, None]
    assert d["p2p"]["size_bytes"] == [TINY["rows"] // m * TINY["hidden"] * 4 for m in TINY["ms"]]
    rows = analysis.bubble_breakdown(d)
    assert [r["m"] for r in rows] == TINY["ms"] and all(r["host_wait"] is not None for r in rows)
    assert lab_claims.pipeline_verdicts(d)  # every threshold evaluates on a fresh measurement
    ops = measure.comm_summary(d)["ops"]
    assert len(ops) == 2 * n
    assert {k for op in ops for k in op} == {"what", "op", "size_bytes", "world_size", "count_per_step",
                                            "measured_ms", "step_ms"}
    assert ops[0]["what"] == "pipeline activation send, m=1, micro-batch=32, hidden=16, fp32"
    assert [op["count_per_step"] for op in ops[::2]] == TINY["ms"]
    assert all(isinstance(op["size_bytes"], int) and op["measured_ms"] > 0 for op in ops)


# ---------------------------------------------------------------- exercise checkers

def _warm_up_order(warm):
    """A 1F1B-shaped order whose stage s runs ``warm(p, s)`` forwards before its first backward."""
    def order(p, m):
        out = []
        for s in range(p):
            w = min(m, warm(p, s))
            ops = [("F", i) for i in range(w)]
            for i in range(m - w):
                ops += [("B", i), ("F", w + i)]
            out.append(ops + [("B", i) for i in range(m - w, m)])
        return out
    return order


def test_order_checker_passes_the_reference_and_says_not_attempted(capsys):
    check.one_f_one_b_order(solution.one_f_one_b_order)
    out = capsys.readouterr().out
    assert out.startswith("✓") and f"on {len(check.ORDER_CASES)} cases" in out
    assert any(m < p for p, m in check.ORDER_CASES) and any(m >= 8 * p for p, m in check.ORDER_CASES)

    def stub(p, m):
        raise NotImplementedError
    check.one_f_one_b_order(stub)
    out, err = capsys.readouterr()
    assert "not attempted" in err and "✓" not in out
    assert check.usable_order(stub)(3, 5) == schedule.schedule_order("1f1b", 3, 5)
    assert check.usable_order(solution.one_f_one_b_order) is solution.one_f_one_b_order


@pytest.mark.parametrize("wrong,match", [
    # GPipe's order passed as 1F1B: right dependencies, every micro-batch held at once
    (lambda p, m: schedule.schedule_order("gpipe", p, m),
     r"stage 0 holds 9 micro-batches.*at most p - s = 4.*GPipe's order.*HINT: .*not all forwards first"),
    # stage 0 goes to its first backward after one forward: the next stages starve
    (_warm_up_order(lambda p, s: 1 if s == 0 else p - s),
     r"deadlocks: stage 0 waits at B0 for stage 1's B0; stage 1 waits at F1 for stage 0's F1.*HINT: each stage runs"),
    # warm-up one short everywhere: the last stage does B0 before its F0 exists
    (_warm_up_order(lambda p, s: p - s - 1), r"stage 3 runs B0 before its own F0.*HINT: a micro-batch's backward"),
    # one forward too many in the warm-up: valid, but it holds one more micro-batch than 1F1B may
    (_warm_up_order(lambda p, s: p - s + 1), r"stage 0 holds 5 micro-batches.*at most p - s = 4"),
    # one forward then one backward everywhere: valid and lean, but no pipelining at all
    (_warm_up_order(lambda p, s: 1), r"valid but its step lasts 108 t_f, GPipe's 36 t_f.*HINT: the stages wait"),
    # a micro-batch missing on one stage
    (lambda p, m: [o[:-1] if s == 1 else o for s, o in enumerate(schedule.schedule_order("1f1b", p, m))],
     r"stage 1 runs B of micro-batches \[0, 1, 2, 3, 4, 5, 6, 7\] \(missing \[8\]\).*HINT: every stage runs"),
    # not a list of ops
    (lambda p, m: [["F0", "B0"]] * p, r"stage 0 has 'F0', which is not an op.*HINT: return one list per stage"),
    (lambda p, m: schedule.schedule_order("1f1b", p, m)[:-1], r"not 4 lists"),
])
def test_order_checker_rejects_wrong_but_plausible_orders(wrong, match):
    with pytest.raises(ExerciseError, match=match):
        check.one_f_one_b_order(wrong)


def test_simulate_names_who_waits_for_whom():
    last_b_first = [[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]  # the last stage's backward before its forward
    with pytest.raises(schedule.ScheduleDeadlock, match="stage 1 waits at B0 for its own F0") as info:
        schedule.simulate(last_b_first)
    assert info.value.stuck == {0: (("B", 0, 0), ("B", 1, 0)), 1: (("B", 1, 0), ("F", 1, 0))}
    with pytest.raises(ValueError, match="not an op"):
        schedule.simulate([[("X", 0)]])


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


def test_1f1b_checker(gloo3, capsys):
    def stub(stage, x, target, loss_fn, n_microbatches, act_shape):
        raise NotImplementedError
    check.one_f_one_b(stub, pool=gloo3)
    out, err = capsys.readouterr()
    assert "not attempted" in err and "✓" not in out
    check.one_f_one_b(solution.one_f_one_b_step, pool=gloo3)
    assert "at most (3, 2, 1) micro-batches" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match=r"stage 2 held 2 micro-batches.*min\(m, p - s\) = 1"):
        check.one_f_one_b(nb.gpipe_step, pool=gloo3)  # GPipe: right numbers, all m held

    def forgets_the_output(stage, x, target, loss_fn, n_microbatches, act_shape):
        solution.one_f_one_b_step(stage, x, target, loss_fn, n_microbatches, act_shape)
    with pytest.raises(ExerciseError, match="torch.cat"):
        check.one_f_one_b(forgets_the_output, pool=gloo3)


def test_1f1b_checker_explains_a_hang(gloo3):
    def never_sends(stage, x, target, loss_fn, n_microbatches, act_shape):
        import torch.distributed as dist
        if dist.get_rank() == 1:  # waits for an activation that rank 0 never sends
            dist.recv(torch.empty(act_shape, dtype=torch.float64), src=0)
    with pytest.raises(ExerciseError, match="did not finish within 5 s"):
        check.one_f_one_b(never_sends, pool=gloo3, timeout=5)
