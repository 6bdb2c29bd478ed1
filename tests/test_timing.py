"""Timing statistics (pure) and the two benchmark helpers on CPU, with real gloo ranks."""
import time

import pytest
import torch.distributed as dist

import labutils
from labutils import timing


def test_summarize_statistics():
    t = timing.summarize([5, 1, 3, 2, 4])
    assert (t.median_ms, t.min_ms, t.max_ms) == (3, 1, 5)
    assert t.p10_ms == pytest.approx(1.4) and t.p90_ms == pytest.approx(4.6)
    assert t.samples_ms == (5, 1, 3, 2, 4)  # measurement order kept
    assert t.spread == pytest.approx((4.6 - 1.4) / 3)
    assert "median of 5" in str(t) and t.median_us == 3000


@pytest.mark.parametrize("bad, match", [([], "at least one sample"), ([1, -2], "finite and >= 0"),
                                        ([float("nan")], "finite"), ([float("inf")], "finite")])
def test_summarize_rejects(bad, match):
    with pytest.raises(ValueError, match=match):
        timing.summarize(bad)


@pytest.mark.parametrize("kw", [dict(repeat=0), dict(warmup=-1), dict(inner=0), dict(repeat=2.5)])
def test_benchmark_rejects_counts(kw):
    with pytest.raises(ValueError, match="must be an int"):
        timing.benchmark(lambda: None, **kw)


def test_benchmark_cpu_counts_calls_and_measures_the_work():
    calls = []

    def work():
        calls.append(1)
        time.sleep(0.002)
    t = timing.benchmark(work, warmup=2, repeat=5, inner=2, device="cpu")
    assert len(calls) == 2 + 5 * 2
    assert len(t.samples_ms) == 5 and t.min_ms >= 2.0  # each call sleeps 2 ms


def _collective_timing(rank, world_size):
    # rank 1 is slower on every call; no collective inside op, so nothing couples the ranks:
    # only the max over ranks can report rank 1's time on rank 0.
    def op():
        if rank == 1:
            time.sleep(0.004)
    t = timing.benchmark_collective(op, warmup=1, iters=3, repeat=4)
    return t.samples_ms


def test_benchmark_collective_reports_slowest_rank(no_leaks):
    out = labutils.launch(_collective_timing, world_size=2, backend="gloo")
    assert out[0] == out[1]                      # every rank reports the same samples
    assert len(out[0]) == 4 and min(out[0]) >= 4.0


def _loops_timing(rank, world_size):
    calls = {"fast": 0, "slow": 0}

    def fast(k):
        calls["fast"] += k

    def slow(k):  # rank 1 sleeps: only the max over ranks shows it on rank 0
        calls["slow"] += k
        if rank == 1:
            time.sleep(0.002 * k)
    ts = timing.benchmark_loops({"fast": fast, "slow": slow}, warmup=2, iters=3, repeat=4)
    return {name: t.samples_ms for name, t in ts.items()}, calls


def test_benchmark_loops_take_turns_and_report_the_slowest_rank(no_leaks):
    out = labutils.launch(_loops_timing, world_size=2, backend="gloo")
    assert out[0][0] == out[1][0]                # the same samples on every rank
    samples, calls = out[0]
    assert calls == {"fast": 2 + 4 * 3, "slow": 2 + 4 * 3}
    assert min(samples["slow"]) >= 2.0 and max(samples["fast"]) < min(samples["slow"])
    with pytest.raises(ValueError, match="at least one loop"):
        timing.benchmark_loops({})


def test_clock_on_cpu_measures_host_time():
    clock = timing.Clock("cpu")
    assert not clock.on_gpu and clock.device.type == "cpu"
    a = clock.mark()
    time.sleep(0.01)
    b = clock.mark()
    clock.synchronize()  # nothing to wait for on the CPU
    assert 9.0 <= clock.elapsed_ms(a, b) < 1000.0
    assert timing.Clock(None).device.type == ("cuda" if timing.Clock(None).on_gpu else "cpu")


def test_span_timer_spans_from_a_common_zero():
    timer = timing.SpanTimer()
    timer.begin(["cpu"])
    time.sleep(0.005)
    with timer.span("cpu", "stage 0", "forward", "F0"):
        time.sleep(0.01)
    (span,) = timer.spans()
    assert (span["lane"], span["kind"], span["label"]) == ("stage 0", "forward", "F0")
    assert 4.0 <= span["start_ms"] < span["end_ms"] and span["end_ms"] - span["start_ms"] >= 9.0


def test_repeated_calls_fn_k_times_back_to_back():
    calls = []
    loop = timing.repeated(lambda: calls.append(len(calls)))
    loop(3)
    loop(0)
    assert calls == [0, 1, 2]
