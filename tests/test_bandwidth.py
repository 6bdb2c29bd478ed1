"""algbw/busbw with nccl-tests' factors, the alpha-beta fit, ring model, sizes."""
import math

import pytest

from labutils import bandwidth as bw


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16])
def test_bus_factors_match_nccl_tests(n):
    # doc/PERFORMANCE.md of NVIDIA/nccl-tests
    assert bw.bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    for op in ("all_gather", "reduce_scatter", "all_to_all"):
        assert bw.bus_factor(op, n) == pytest.approx((n - 1) / n)
    for op in ("broadcast", "reduce", "send_recv"):
        assert bw.bus_factor(op, n) == 1.0


def test_busbw_example():
    # 1 GiB all_reduce on 8 ranks in 10 ms: algbw 107.4 GB/s, busbw x 1.75
    a = bw.algbw_gbps(2**30, 10.0)
    assert a == pytest.approx(2**30 / 0.010 / 1e9)
    assert bw.busbw_gbps("allreduce", 2**30, 10.0, 8) == pytest.approx(a * 1.75)


@pytest.mark.parametrize("alias, canon", [("allgather", "all_gather"), ("all_gather_into_tensor", "all_gather"),
                                          ("reduce_scatter_tensor", "reduce_scatter"), ("AllToAll", "all_to_all"),
                                          ("sendrecv", "send_recv"), ("all-reduce", "all_reduce")])
def test_aliases(alias, canon):
    assert bw.canonical_op(alias) == canon


@pytest.mark.parametrize("call, match", [
    (lambda: bw.bus_factor("gossip", 2), "unknown collective 'gossip'"),
    (lambda: bw.bus_factor("all_reduce", 0), "world_size must be an int >= 1"),
    (lambda: bw.algbw_gbps(10, 0), "time_ms > 0"),
    (lambda: bw.algbw_gbps(-1, 1), "size_bytes >= 0"),
    (lambda: bw.fit_alpha_beta([1], [1.0]), "at least 2 distinct sizes"),
    (lambda: bw.fit_alpha_beta([1, 2], [1.0]), "differ in length"),
    (lambda: bw.fit_alpha_beta([1, 2], [1.0, -1.0]), "positive"),
    (lambda: bw.fit_alpha_beta([1, 2**20], [2.0, 1.0]), "do not grow with size"),
    (lambda: bw.size_sweep(0, 10), "min_bytes"),
])
def test_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_fit_recovers_alpha_beta_over_decades():
    sizes = bw.size_sweep(8, 2**30, 4)
    alpha_us, beta_gbps = 12.5, 350.0
    times = [alpha_us * 1e-3 + s / (beta_gbps * 1e9) * 1e3 for s in sizes]
    fit = bw.fit_alpha_beta(sizes, times)
    assert fit.alpha_us == pytest.approx(alpha_us, rel=1e-6)
    assert fit.beta_gbps == pytest.approx(beta_gbps, rel=1e-6)
    assert fit.max_rel_err < 1e-9
    assert fit.predict_ms(2**29) == pytest.approx(times[sizes.index(2**29)])
    assert fit.half_bw_bytes == pytest.approx(alpha_us * 1e-6 * beta_gbps * 1e9)
    assert fit.predict_gbps(fit.half_bw_bytes) == pytest.approx(beta_gbps / 2)


def test_fit_is_relative_not_dominated_by_large_sizes():
    # 10 % noise on a tiny size must not move beta much; an unweighted fit would ignore alpha entirely
    sizes = [8, 2**20, 2**30]
    times = [0.010 * 1.1, 0.010 + 2**20 / 1e11 * 1e3, 0.010 + 2**30 / 1e11 * 1e3]
    fit = bw.fit_alpha_beta(sizes, times)
    assert 9 < fit.alpha_us < 12 and fit.beta_gbps == pytest.approx(100, rel=0.02)


def test_ring_model():
    assert bw.ring_time_ms("all_reduce", 2**30, 1, 10, 100) == 0.0
    n, S = 4, 2**30
    t = bw.ring_time_ms("all_reduce", S, n, alpha_us=10, beta_gbps=100)
    assert t == pytest.approx(2 * 3 * 0.010 + 1.5 * S / 1e11 * 1e3)
    # busbw of the model's time equals beta when alpha -> 0
    t0 = bw.ring_time_ms("all_gather", S, n, alpha_us=0, beta_gbps=100)
    assert bw.busbw_gbps("all_gather", S, t0, n) == pytest.approx(100)


def test_sizes_and_format():
    assert bw.size_sweep(1024, 8192) == [1024, 2048, 4096, 8192]
    assert bw.format_size(3 * 2**20) == "3 MiB" and bw.format_size(1536) == "1.5 KiB"
    assert bw.format_size(8) == "8 B" and bw.format_size(2**30) == "1 GiB"
    assert not math.isnan(bw.algbw_gbps(0, 1.0))
