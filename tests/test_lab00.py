"""Lab 00 (setup) on the CPU: the topology record and its table, and every verdict on both sides of its
threshold (synthetic sweeps shaped like the recordings).

Run: pytest tests/test_lab00.py -q -p no:nbval     (under a second)
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from labutils import bandwidth, hw
from labutils.labs.lab00_setup import claims as lab_claims
from labutils.labs.lab00_setup import measure

SIZES = [2**k for k in range(12, 31, 2)]
REC_DIR = Path(__file__).resolve().parent.parent / "notebooks" / "recorded"


def _sweep(kinds: dict) -> dict:
    """A sweep as ``measure.sweep`` returns it, with exact alpha-beta times: kind -> (alpha_us, beta_gbps)."""
    out = {"size_bytes": SIZES, "time_ms": {}, "gbps": {}, "fits": {}}
    for kind, (a, b) in kinds.items():
        fit = bandwidth.AlphaBeta(a, b, 0.0)
        out["time_ms"][kind] = [fit.predict_ms(s) for s in SIZES]
        out["gbps"][kind] = [fit.predict_gbps(s) for s in SIZES]
        f = bandwidth.fit_alpha_beta(SIZES, out["time_ms"][kind])
        out["fits"][kind] = {"alpha_us": f.alpha_us, "beta_gbps": f.beta_gbps, "max_rel_err": f.max_rel_err}
    return out


def _data(h2d_gbps=55.0, pageable_gbps=20.0, p2p_gbps=400.0, back_gbps=400.0, topology=None):
    local = _sweep({"H2D pinned": (12.0, h2d_gbps), "H2D pageable": (17.0, pageable_gbps),
                    "D2H pinned": (14.0, 58.0), "D2D (cuda:0)": (14.0, 2500.0)})
    peer = _sweep({"cuda:0 -> cuda:1": (21.0, p2p_gbps), "cuda:1 -> cuda:0": (21.0, back_gbps)})
    if topology is not None:
        peer["topology"] = topology
    return local, peer


def _verdicts(local, peer) -> dict:
    return {v.claim: v.verdict for v in lab_claims.all_verdicts(local, peer)}


def _one(verdicts: dict, words: str) -> str:
    found = [v for c, v in verdicts.items() if words in c]
    assert len(found) == 1, (words, list(verdicts))
    return found[0]


def _info(**kw) -> hw.HardwareInfo:
    nvlink = hw.parse_nvlink_speeds("GPU 0: H200\n" + "".join(f"\t Link {i}: 26.562 GB/s\n" for i in range(18)))
    base = dict(mode="multi-gpu", gpus=[hw.GPU(0, "H200", 140.0), hw.GPU(1, "H200", 140.0)],
                links={(0, 1): "NV18", (1, 0): "NV18"}, peer_access={(0, 1): True, (1, 0): True},
                nvlink_gbps=nvlink, pcie={0: (5, 16)}, torch_version="2.11", cuda_version="13.0",
                nccl_version="2.28.9", driver_version="580", python_version="3.12", cpu_count=32,
                nvlinks={0: hw.summarize_nvlinks([(2, 6)] * 18)})
    base.update(kw)
    return hw.HardwareInfo(**base)


# ---- topology ---------------------------------------------------------------------------------------
def test_topology_records_both_peaks_and_the_remote_ends():
    topo = measure.topology(_info())
    assert json.loads(json.dumps(topo)) == topo
    assert topo["link"] == "NV18" and topo["nvlinks"] == 18 and topo["nvlink_remote"] == {"NVSwitch": 18}
    assert topo["link_peak_gbps"] == 478.1 and topo["link_data_peak_gbps"] == 450.0
    assert topo["nvlink_version"] == "4.0" and topo["pcie_peak_gbps"] == 63.0
    rows = measure.topology_rows(topo)
    assert rows["where they end (NVML)"] == "18 to NVSwitch"
    assert rows["NVLink data rate"].startswith("450 GB/s per direction")


def test_topology_without_gpus_nvml_or_nvlink_says_unknown():
    topo = measure.topology(_info(gpus=[], links={}, peer_access={}, nvlink_gbps={}, pcie={}, nvlinks={}))
    assert topo["link"] is None and topo["nvlinks"] is None and topo["nvlink_remote"] == {}
    rows = measure.topology_rows(topo)
    assert rows["nvidia-smi topo -m, GPU0-GPU1"] == "no GPU pair"
    assert rows["where they end (NVML)"].startswith("unknown") and rows["NVLink line rate"] == "unknown"


# ---- verdicts on both sides of their thresholds (more in tests/test_claims_lab00.py) -----------------
def test_orders_of_magnitude_claim():
    assert _one(_verdicts(*_data(h2d_gbps=55.0)), "orders of magnitude") == "FALSE"   # 7x
    assert _one(_verdicts(*_data(h2d_gbps=30.0)), "orders of magnitude") == "TRUE"    # 13x


def test_data_rate_claim_needs_the_topology_and_follows_it():
    assert not any("data rate" in c for c in _verdicts(*_data()))             # an older recording: no line
    topo = {"link_data_peak_gbps": 450.0, "link_peak_gbps": 478.1}
    assert _one(_verdicts(*_data(p2p_gbps=400.0, topology=topo)), "data rate") == "TRUE"    # 0.89
    assert _one(_verdicts(*_data(p2p_gbps=300.0, topology=topo)), "data rate") == "FALSE"   # 0.67


def test_the_topology_is_a_table_not_a_verdict():
    switch = {"link": "NV18", "nvlink_remote": {"NVSwitch": 18}}
    assert not any("directly" in c for c in _verdicts(*_data(topology=switch)))
    assert measure.topology_rows(switch)["where they end (NVML)"] == "18 to NVSwitch"


def test_fit_claim():
    local, peer = _data()
    assert _one(_verdicts(local, peer), "describes") == "TRUE"
    peer["fits"]["cuda:0 -> cuda:1"]["max_rel_err"] = 0.4
    assert _one(_verdicts(local, peer), "describes") == "FALSE"


def test_pinned_claim():
    assert _one(_verdicts(*_data(pageable_gbps=20.0)), "pageable") == "TRUE"
    assert _one(_verdicts(*_data(pageable_gbps=50.0)), "pageable") == "FALSE"


def test_symmetry_claim():
    assert _one(_verdicts(*_data(back_gbps=390.0)), "symmetric") == "TRUE"
    assert _one(_verdicts(*_data(back_gbps=300.0)), "symmetric") == "FALSE"


def test_prediction_claim_is_held_out():
    local, peer = _data()
    assert _one(_verdicts(local, peer), "predicts") == "TRUE"
    i = SIZES.index(lab_claims.PREDICTED_SIZE)
    peer["time_ms"]["cuda:0 -> cuda:1"][i] *= 1.5
    assert _one(_verdicts(local, peer), "predicts") == "FALSE"


@pytest.mark.skipif(not (REC_DIR / "00_copy_bandwidth.json").exists(), reason="no recording yet")
def test_verdicts_of_the_recordings():
    local = json.loads((REC_DIR / "00_copy_local.json").read_text())["data"]
    peer = json.loads((REC_DIR / "00_copy_bandwidth.json").read_text())["data"]
    assert len(lab_claims.all_verdicts(local, peer)) >= 5


# ---- the exercises: three states each, wrong-but-plausible answers rejected with their HINT ----------
import statistics
import sys

import cloudpickle
import torch
import torch.distributed as dist

from labutils import RankPool
from labutils.checks import ExerciseError
from labutils.checks import lab00 as check
from notebook_defs import load_definitions

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file


@pytest.fixture(scope="module")
def nb():
    return load_definitions("00_setup")


@pytest.fixture(scope="module")
def pool3():
    with RankPool(world_size=3, backend="gloo", timeout=60, output="quiet") as p:
        yield p


def _samples(op, clock, iters, repeat, *, warm=0, sync=True, per_call=True):
    for _ in range(warm):
        op()
    out = []
    for _ in range(repeat):
        dist.barrier()
        a = clock.mark()
        for _ in range(iters):
            op()
        b = clock.mark()
        if sync:
            clock.synchronize()
        out.append(clock.elapsed_ms(a, b) / (iters if per_call else 1))
    return out


def _max_over_ranks(xs):
    t = torch.tensor(xs, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def times_the_warmup(op, clock, *, warmup, iters, repeat):
    out = []
    for _ in range(repeat):
        dist.barrier()
        a = clock.mark()
        for _ in range(warmup):                   # "warm-up" inside the timed region
            op()
        for _ in range(iters):
            op()
        b = clock.mark()
        clock.synchronize()
        out.append(clock.elapsed_ms(a, b) / iters)
    return statistics.median(_max_over_ranks(out))


def rank0_time(op, clock, *, warmup, iters, repeat):
    t = torch.tensor([statistics.median(_samples(op, clock, iters, repeat, warm=warmup))], dtype=torch.float64)
    dist.broadcast(t, src=0)                      # every rank reports rank 0's
    return t.item()


def own_time(op, clock, *, warmup, iters, repeat):
    return statistics.median(_samples(op, clock, iters, repeat, warm=warmup))


def mean_over_ranks(op, clock, *, warmup, iters, repeat):
    t = torch.tensor(_samples(op, clock, iters, repeat, warm=warmup), dtype=torch.float64)
    dist.all_reduce(t)                            # SUM ...
    return statistics.median((t / dist.get_world_size()).tolist())   # ... / n: nccl-tests' -a 1


def mean_over_samples(op, clock, *, warmup, iters, repeat):
    return statistics.mean(_max_over_ranks(_samples(op, clock, iters, repeat, warm=warmup)))


def per_sample_not_per_call(op, clock, *, warmup, iters, repeat):
    return statistics.median(_max_over_ranks(_samples(op, clock, iters, repeat, warm=warmup, per_call=False)))


def reads_before_sync(op, clock, *, warmup, iters, repeat):
    return statistics.median(_max_over_ranks(_samples(op, clock, iters, repeat, warm=warmup, sync=False)))


def one_call_per_sample(op, clock, *, warmup, iters, repeat):
    return statistics.median(_max_over_ranks(_samples(op, clock, 1, repeat, warm=warmup)))


def no_warmup(op, clock, *, warmup, iters, repeat):
    return statistics.median(_max_over_ranks(_samples(op, clock, iters, repeat, warm=0)))


def stub_timer(op, clock, *, warmup, iters, repeat):
    raise NotImplementedError()


def test_timing_loop_solution_passes_on_three_ranks_and_is_usable(nb, pool3, capsys):
    check.time_collective(nb.time_collective, pool=pool3)
    out = capsys.readouterr().out
    assert "✓ time_collective on 3 ranks of different speeds" in out and "all_reduce" in out
    assert check.usable_timer(nb.time_collective) is nb.time_collective


def test_timing_loop_stub_is_not_attempted_and_gets_the_library_stand_in(pool3, capsys):
    check.time_collective(stub_timer, pool=pool3)
    out, err = capsys.readouterr()
    assert "… not attempted: time_collective still raises NotImplementedError" in err and "✓" not in out
    fn = check.usable_timer(stub_timer)
    assert fn is check.standin_time_collective and "benchmark_collective" in capsys.readouterr().err


@pytest.mark.parametrize("fn,hint", [
    (times_the_warmup, "warm-up calls are inside a timed sample"),
    (no_warmup, "fewer than warmup = 2 calls came before the first timed sample"),
    (rank0_time, "that is rank 0's time"),
    (own_time, "the ranks returned different times"),
    (mean_over_ranks, "that is the mean over ranks"),
    (mean_over_samples, "that is the mean of the samples"),
    (per_sample_not_per_call, "divide a sample by iters"),
    (reads_before_sync, "read before clock.synchronize"),
    (one_call_per_sample, "brackets 1 calls of op, iters = 4"),
], ids=lambda x: getattr(x, "__name__", "hint"))
def test_timing_loop_wrong_but_plausible_answers_fail_with_their_hint(pool3, fn, hint):
    with pytest.raises(ExerciseError, match=re.escape(hint)):
        check.time_collective(fn, pool=pool3)


def test_timing_loop_on_a_pool_of_the_wrong_size_is_refused():
    with RankPool(world_size=2, backend="gloo", timeout=60, output="quiet") as p2:
        with pytest.raises(ValueError, match="this checker runs on 3 gloo ranks"):
            check.time_collective(rank0_time, pool=p2)


def _peer_sweep():
    peer = json.loads((REC_DIR / "00_copy_bandwidth.json").read_text())["data"]
    return peer["size_bytes"], peer["time_ms"]["cuda:0 -> cuda:1"]


def test_fit_solution_passes_and_stub_is_not_attempted(nb, capsys):
    sizes, times = _peer_sweep()
    check.fit_alpha_beta(nb.fit_alpha_beta, sizes, times)
    assert "✓ fit_alpha_beta matches labutils.bandwidth.fit_alpha_beta" in capsys.readouterr().out

    def stub(size_bytes, time_ms):
        raise NotImplementedError()
    check.fit_alpha_beta(stub, sizes, times)
    out, err = capsys.readouterr()
    assert "… not attempted: fit_alpha_beta still raises NotImplementedError" in err and "✓" not in out
    assert check.usable_fit(stub) is check.standin_fit


def _scaled(fn, da=1.0, db=1.0, swap=False):
    def wrong(size_bytes, time_ms):
        a, b = fn(size_bytes, time_ms)
        return (b * db, a * da) if swap else (a * da, b * db)
    return wrong


@pytest.mark.parametrize("make,hint", [
    (lambda nb: check._two_points, "the line through the smallest and the largest point"),
    (lambda nb: check._unweighted, "plain least-squares line"),
    (lambda nb: _scaled(nb.fit_alpha_beta, da=1e-3), "alpha is in microseconds"),
    (lambda nb: _scaled(nb.fit_alpha_beta, db=1e9), "beta is in GB/s = 1e9 B/s"),
    (lambda nb: _scaled(nb.fit_alpha_beta, swap=True), "you returned (beta, alpha)"),
    (lambda nb: (lambda s, t: (1.0, 2.0)), "minimise sum"),
    (lambda nb: (lambda s, t: None), "return a pair (alpha_us, beta_gbps)"),
], ids=["two-points", "unweighted", "alpha-in-ms", "beta-in-B/s", "swapped", "constant", "none"])
def test_fit_wrong_but_plausible_answers_fail_with_their_hint(nb, make, hint):
    with pytest.raises(ExerciseError, match=re.escape(hint)):
        check.fit_alpha_beta(make(nb), *_peer_sweep())


def test_the_picture_draws_any_small_world_and_refuses_others():
    from labutils.labs.lab00_setup import picture
    fig = picture.all_reduce_picture(4)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "1 + 2 + 3 + 4 = 10" in texts and texts.count("t = [10]") == 4
    with pytest.raises(ValueError, match="from 2 to 8"):
        picture.all_reduce_picture(1)
