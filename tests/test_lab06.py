"""Lab 06 on CPU: the arithmetic of ``labs/lab06_capstone`` on synthetic data, every
verdict's threshold on both sides, the verdicts on the committed recordings, the exercise checkers on right,
wrong, hanging and untouched answers (real gloo ranks), and the missing-recording path.

Run: pytest tests/test_lab06.py -q    (one 3-rank gloo pool for the checkers)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch.distributed as dist

from labutils import bandwidth
from labutils.bench import config as bconfig
from labutils.checks import ExerciseError
from labutils.checks import lab06 as check
from labutils.labs.lab06_capstone import analysis, claims as lab_claims, p2p_channels, record
from labutils.labs.lab06_capstone.claims import CLAIMS
from labutils.solutions import lab06 as solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file
RECORDED = Path(__file__).resolve().parent.parent / "notebooks" / "recorded"


# ----------------------------------------------------------------------------- arithmetic
def test_kernel_parts_transfer_is_the_shortest_kernel_of_a_call():
    # call 0 is dropped (start-up); then rank 1 launches last in calls 1-2, rank 0 in call 3
    parts = analysis.kernel_parts([[500, 104, 106, 5], [1, 4, 6, 95]])
    assert parts["calls"] == 3 and parts["transfer_us"] == 5
    assert parts["kernel_us"] == [104, 6] and parts["wait_us"] == [100, 0]
    for bad, match in (([[1, 2]], ">= 2 ranks"), ([[1, 2], [1]], "different numbers"), ([[1], [2]], "no call left")):
        with pytest.raises(ValueError, match=match):
            analysis.kernel_parts(bad)


def test_alpha_split():
    ranks = [{"eager_us": 50.0, "host_us": 48.0, "cpu_op_us": [90, 91, 92], "kernel_us": [9, 4, 4, 4]},
             {"eager_us": 50.0, "host_us": 47.0, "cpu_op_us": [80, 81, 82], "kernel_us": [99, 40, 42, 44]}]
    a = analysis.alpha_split(ranks)
    assert (a["eager_us"], a["host_us"], a["cpu_op_us"], a["transfer_us"]) == (50.0, 48.0, 91, 4)
    assert a["device_share"] == pytest.approx(0.08) and a["kernel_us"] == [4, 42] and a["calls"] == 3


def test_predictions_use_the_fit_of_the_same_kind_of_transfer():
    fits = {"send_recv": bandwidth.AlphaBeta(100.0, 400.0, 0.0), "send_one_way": bandwidth.AlphaBeta(50.0, 500.0, 0.0)}
    base = {"what": "activations", "op": "send_recv", "size_bytes": 2**20, "world_size": 2, "count_per_step": 4,
            "measured_ms": 0.05, "step_ms": 10.0}
    ops = analysis.comm_ops({"ops": [base, {**base, "direction": "both"}, {**base, "op": "send_one_way"},
                                     {**base, "world_size": 4}, {**base, "kernel_ms": 0.01, "wait_ms": None}]})
    assert ops[4]["extra_ms"] == {"kernel_ms": 0.01} and ops[0]["extra_ms"] == {}
    rows = analysis.predictions(fits, ops, 2, default_p2p=analysis.ONE_WAY)
    assert [r["fit"] for r in rows] == ["send_one_way", "send_recv", "send_one_way", "send_one_way", "send_one_way"]
    assert rows[0]["predicted_ms"] == pytest.approx(fits["send_one_way"].predict_ms(2**20))
    assert rows[0]["ratio"] == pytest.approx(rows[0]["predicted_ms"] / 0.05)
    assert rows[3]["predicted_ms"] is None and "ran on 4 ranks" in rows[3]["note"]
    transfer = analysis.predictions(fits, ops, 2, analysis.ONE_WAY, measured="kernel_ms")
    assert transfer[4]["measured_ms"] == 0.01 and transfer[0]["ratio"] is None
    assert transfer[0]["note"] == "no kernel_ms in this recording"
    assert analysis.fit_for({"op": "all_reduce"}) == "all_reduce" and analysis.fit_for({"op": "p2p"}) == "send_recv"
    assert analysis.predictions({}, ops[:1], 2, analysis.ONE_WAY)[0]["note"].startswith("the sweep has no send_one_way")
    assert analysis.median_ratio(rows[3:4]) is None
    with pytest.raises(ValueError, match="unknown direction 'sideways'.*HINT"):
        analysis.fit_for({"op": "send_recv", "direction": "sideways"})


# ----------------------------------------------------------------------------- verdicts
def _row(coll, size, time_us, bare_us=None, wrong=0):
    ms = time_us * 1e-3
    return {"collective": coll, "placement": bconfig.FORMS[coll][0], "size_bytes": size, "count": size // 4,
            "type": "float", "redop": "sum", "root": -1, "time_us": time_us, "p10_us": time_us, "p90_us": time_us,
            "algbw_gbps": bandwidth.algbw_gbps(size, ms), "busbw_gbps": bandwidth.busbw_gbps(coll, size, ms, 2),
            "wrong": wrong, "iters": 100, "repeat": 3, "mode": "eager", "bare_us": bare_us}


def _sweep(small_ratio=2.0, large_ratio=1.1, bare=1.02, graph_latency=None, wrong=0):
    sizes = [8, 2**10, 2**20, 2**26, 2**29]
    rows = []
    for coll, alpha, beta in (("all_reduce", 50, 300), ("send_one_way", 50, 400), ("send_recv", 100, 400)):
        for s in sizes:
            t = alpha + s / (beta * 1e3)
            if coll == "send_recv":
                one = 50 + s / 400e3
                t = one * (small_ratio if s <= lab_claims.SMALL_BYTES else large_ratio if s == sizes[-1] else 1.5)
            rows.append(_row(coll, s, t, bare_us=t / bare if s == sizes[0] else None, wrong=wrong))
    cfg = bconfig.BenchConfig(collectives=("all_reduce", "send_one_way", "send_recv")).to_dict()
    meta = {"world_size": 2, "backend": "nccl", "config": cfg, "nodes": 1, "torch_version": "x", "devices": []}
    lat = {**_row("all_reduce", 8, 45.0, bare_us=45.0), "sample_start_us": 60.0}
    data = {"meta": meta, "mode": "eager", "latency": lat, "graph_latency": None, "rows": rows, "elapsed_s": 1.0,
            "link_peak_gbps": 478.1}
    if graph_latency is not None:
        data["mode"] = meta["mode"] = "graph"
        data["graph_latency"] = {**_row("all_reduce", 8, graph_latency), "mode": "graph"}
    return data


def _lines(verdicts):
    return {v.claim.split(",")[0]: v.verdict for v in verdicts}


BARE = "the benchmark adds (almost) nothing to the torch call it times: for every collective"


def test_sweep_graph_and_duplex_verdicts_follow_their_thresholds():
    good = _lines(CLAIMS["06_bench_sweep"](_sweep()))
    assert good["every collective returns the right data"] == "TRUE"
    assert good[BARE] == "TRUE"
    bad = _lines(CLAIMS["06_bench_sweep"](_sweep(bare=1.3, wrong=1)))
    assert bad["every collective returns the right data"] == "FALSE"
    assert bad[BARE] == "FALSE"
    duplex = CLAIMS[("06_bench_sweep", "06_bench_graph")]
    v = [x.verdict for x in duplex(_sweep(2.0, 1.1), _sweep(1.05))]
    assert v == ["TRUE", "TRUE"]
    assert [x.verdict for x in duplex(_sweep(1.2, 1.4), _sweep(1.6))] == ["FALSE", "FALSE"]
    # "small" is every size up to 32 KiB: one of them below "about twice" makes it FALSE
    one_off = _sweep(2.0)
    row = next(r for r in one_off["rows"] if r["collective"] == "send_recv" and r["size_bytes"] == 2**10)
    row["time_us"] = 1.2 * next(r["time_us"] for r in one_off["rows"]
                                if r["collective"] == "send_one_way" and r["size_bytes"] == 2**10)
    v = duplex(one_off, _sweep(1.05))[0]
    assert v.verdict == "FALSE" and v.figure.startswith("worst 1.2 at 1 KiB") and "8 B 2" in v.figure


def _large(ratios, first=2**26):
    """A dense sweep of the two p2p forms from ``first`` in steps of 2, send_recv = ratio x send_one_way."""
    rows = []
    for k, r in enumerate(ratios):
        s = first * 2**k
        one = 20 + s / 360e3
        rows += [{**_row("send_one_way", s, one), "iters": 5, "repeat": 5},
                 {**_row("send_recv", s, one * r), "iters": 5, "repeat": 5}]
    cfg = bconfig.BenchConfig(minbytes=first, maxbytes=first * 2**(len(ratios) - 1),
                              collectives=("send_recv", "send_one_way"), latency=False, bare=False).to_dict()
    meta = {"world_size": 2, "backend": "nccl", "config": cfg, "nodes": 1, "torch_version": "x", "devices": []}
    return {"meta": meta, "mode": "eager", "latency": None, "graph_latency": None, "rows": rows, "elapsed_s": 1.0}


def test_large_duplex_verdicts_judge_the_middle_and_the_largest_size():
    large = CLAIMS["06_duplex"]
    v = large(_large([1.31, 1.25, 1.21, 1.05, 1.04]))
    assert [x.verdict for x in v] == ["TRUE", "TRUE"]
    assert v[0].claim.startswith("from 64 MiB to 256 MiB") and v[0].figure.startswith("worst 1.21 at 256 MiB")
    assert "1 GiB 1.04" in v[0].figure and v[1].claim.startswith("the link is full duplex: at 1 GiB")
    assert [x.verdict for x in large(_large([1.05, 1.04, 1.02, 1.3, 1.4]))] == ["FALSE", "FALSE"]
    assert [x.verdict for x in large(_large([1.31, 1.25, 1.08, 1.05, 1.04]))] == ["FALSE", "TRUE"]  # one size misses
    assert [x.verdict for x in large(_large([1.12, 1.11]))] == ["FALSE"]   # no size is a quarter of the largest
    assert large(_large([1.0])) == [] and large(_sweep()) != []           # one size: nothing to judge
    assert lab_claims.middle_sizes([(1, 1.0), (2, 1.0), (4, 1.0), (8, 1.0)]) == [(1, 1.0), (2, 1.0)]


def test_alpha_and_capture_verdicts_follow_their_thresholds():
    ranks = lambda eager, host, k: [{"eager_us": eager, "host_us": host, "cpu_op_us": [90], "kernel_us": [k, k, k]},
                                    {"eager_us": eager, "host_us": host, "cpu_op_us": [90], "kernel_us": [50, 50, 50]}]
    assert [v.verdict for v in CLAIMS["06_alpha_split"]({"size_bytes": 8, "ranks": ranks(50, 45, 5)})] == ["TRUE", "TRUE"]
    assert [v.verdict for v in CLAIMS["06_alpha_split"]({"size_bytes": 8, "ranks": ranks(50, 20, 30)})] == ["FALSE", "FALSE"]
    # the appendix: the same loop after the profiler, its own function on the same recording
    after = lambda us: [{**r, "eager_after_us": us} for r in ranks(50, 45, 5)]
    assert len(CLAIMS["06_alpha_split"]({"size_bytes": 8, "ranks": after(55.0)})) == 2
    v = CLAIMS[("06_alpha_split",)]({"size_bytes": 8, "ranks": after(55.0)})
    assert [x.verdict for x in v] == ["TRUE"] and "50.0 us per call before the profiler" in v[0].figure
    assert CLAIMS[("06_alpha_split",)]({"size_bytes": 8, "ranks": after(90.0)})[0].verdict == "FALSE"
    partly = after(55.0)
    del partly[1]["eager_after_us"]   # measured on one rank only: not judged
    assert analysis.alpha_split(partly)["eager_after_us"] is None
    assert CLAIMS[("06_alpha_split",)]({"size_bytes": 8, "ranks": partly}) == []
    cap = {"size_bytes": 8, "calls": 50, "replays": 10, "correct": [True, True], "eager_us": 50.0, "graph_us": 12.0}
    assert [v.verdict for v in CLAIMS["06_graph_capture"](cap)] == ["TRUE"]
    assert [v.verdict for v in CLAIMS["06_graph_capture"]({**cap, "graph_us": 30.0})] == ["FALSE"]
    assert CLAIMS[("06_graph_capture",)](cap) == []   # no eager loop timed before the capture: nothing to judge
    # the graph is judged against the eager loop timed in turn with it, never against an earlier time; the
    # eager loop timed before the capture judges only the capture's leftover (the appendix)
    c = {**cap, "eager_before_us": 40.0, "eager_us": 75.0, "graph_us": 30.0}
    assert [x.verdict for x in CLAIMS["06_graph_capture"](c) + CLAIMS[("06_graph_capture",)](c)] == ["TRUE", "FALSE"]
    assert "75.0 us eager, the two loops timed in turn" in CLAIMS["06_graph_capture"](c)[0].figure
    assert "75.0 us after it" in CLAIMS[("06_graph_capture",)](c)[0].figure
    c = {**cap, "eager_before_us": 100.0, "eager_us": 31.0, "graph_us": 16.0}
    assert [x.verdict for x in CLAIMS["06_graph_capture"](c) + CLAIMS[("06_graph_capture",)](c)] == ["FALSE", "TRUE"]


def test_lab_predictions_judge_the_median_ratio():
    sweep = _sweep()
    lab04 = {"ops": [{"what": f"send {s}", "op": "send_recv", "size_bytes": s, "world_size": 2, "count_per_step": 1,
                      "measured_ms": (50 + s / 400e3) * 1e-3, "step_ms": 1.0} for s in (2**22, 2**24, 2**26)]}
    v = CLAIMS[("06_bench_sweep", "04_comm_summary")](sweep, lab04)
    assert [(x.claim.split(" fit")[0], x.verdict) for x in v] == [("the one-way", "TRUE")]
    lab02 = {"ops": [{**op, "op": "all_reduce", "measured_ms": (50 + op["size_bytes"] / 300e3) * 3e-3}
                     for op in lab04["ops"]]}
    fn = CLAIMS[("06_bench_sweep", "06_bench_graph", "02_comm_summary")]
    # an older lab 02 recording (no transfer times): the eager fit against the time in the step
    assert [(x.claim[:26], x.verdict) for x in fn(sweep, sweep, lab02)] == [("the all_reduce fit predict", "FALSE")]
    # with transfer times: the device-time fit against the transfer (like with like) and the time in the step
    graph = _sweep(graph_latency=10.0)
    for op in lab02["ops"]:
        op.update(kernel_ms=(50 + op["size_bytes"] / 300e3) * 1e-3, wait_ms=0.1)
    assert [x.verdict for x in fn(sweep, graph, lab02)] == ["TRUE"]
    assert lab_claims.has_transfer_times(lab02) and not lab_claims.has_transfer_times(lab04)


def test_verdicts_work_on_the_committed_recordings():
    """Whatever the recordings' version (a sweep from before send_one_way and bare loops included), every
    verdict function that has its recordings returns verdicts."""
    for key, fn in CLAIMS.items():
        names = (key,) if isinstance(key, str) else key
        paths = [RECORDED / f"{n}.json" for n in names]
        if all(p.exists() for p in paths):
            out = fn(*[json.loads(p.read_text())["data"] for p in paths])
            assert all(v.body().startswith("VERDICT") for v in out), key
    assert lab_claims.both_over_one_way(lab_claims.sweep_doc(_sweep(2.0, 1.1)))[0] == (8, pytest.approx(2.0))


# ----------------------------------------------------------------------------- NCCL's p2p rules
LOG = """[rank 0] vm:1:1 [0] NCCL INFO P2P Chunksize set to 524288
[rank 0] vm:1:1 [0] NCCL INFO 24 coll channels, 24 collnet channels, 0 nvls channels, 32 p2p channels, 32 p2p channels per peer
[rank 0] vm:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0
"""


def test_nccl_p2p_rules_follow_the_source():
    params = p2p_channels.from_nccl_log(LOG)
    assert params == {"p2p_channels": 32, "per_peer": 32, "chunk_bytes": 2**19, "n_ranks": 2, "n_nodes": 1}
    assert p2p_channels.from_nccl_log(LOG.replace("P2P Chunksize", "chunk")) is None
    # 2 ranks: 16 channels (32 per peer halved to fit 2 x 16 into 32), doubled once a part exceeds 32 x 512 KiB
    ch = {s: p2p_channels.channels(s, **params) for s in (2**16, 2**19, 2**20, 2**28, 2**28 + 1, 2**29, 2**30, 2**31)}
    assert ch == {2**16: 1, 2**19: 8, 2**20: 16, 2**28: 16, 2**28 + 1: 32, 2**29: 32, 2**30: 32, 2**31: 32}
    four = {**params, "n_ranks": 4}   # 8 to start with; 1 GiB needs 32 (parts of 32 MiB)
    assert p2p_channels.channels(2**27, **four) == 8 and p2p_channels.channels(2**30, **four) == 32
    nodes = {**params, "n_nodes": 2}  # between nodes a part holds one chunk at most
    assert p2p_channels.channels(2**20, **nodes) == 4 and p2p_channels.channels(2**30, **nodes) == 32
    assert (p2p_channels.sending_warps(16, True), p2p_channels.sending_warps(16, False)) == (160, 304)
    with pytest.raises(ValueError, match="positive.*HINT"):
        p2p_channels.channels(0, **params)
    committed = json.loads((RECORDED / "05_nccl_debug_info.json").read_text())["data"]["log"]
    assert p2p_channels.from_nccl_log(committed) is not None   # lab 05's recording has what lab 06 reads


# ----------------------------------------------------------------------------- exercises
def test_min_size_for_fraction_checker(capsys):
    check.min_size_for_fraction(solution.min_size_for_fraction)
    assert "✓ min_size_for_fraction" in capsys.readouterr().out

    def stub(fit, fraction):
        raise NotImplementedError
    check.min_size_for_fraction(stub)
    assert "not attempted" in capsys.readouterr().err
    assert check.usable(stub, "min_size_for_fraction") is check.solve_size_for_fraction
    check.min_size_for_fraction(lambda fit, f: check.solve_size_for_fraction(fit, f))  # the stand-in is right
    assert "✓ min_size_for_fraction" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="n_1/2 = alpha x beta"):
        check.min_size_for_fraction(lambda fit, f: fit.alpha_us * fit.beta_gbps)


def _both_ways(case):  # an exchange: rank 0 also receives, so its output changes
    if case.rank < 2:
        peer = 1 - case.rank
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, case.inp, peer),
                                            dist.P2POp(dist.irecv, case.out, peer)]):
            work.wait()


def _both_send(case):  # nobody receives: ranks 0 and 1 wait for their own sends forever
    if case.rank < 2:
        dist.isend(case.inp, 1 - case.rank).wait()


def _stub(case):
    raise NotImplementedError


def _every_even_sends(case):  # right on 2 ranks; on 3 the last rank sends to a rank that does not exist
    if case.rank % 2 == 0:
        dist.isend(case.inp, case.rank + 1).wait()
    else:
        dist.irecv(case.out, case.rank - 1).wait()


def _gathered(case):  # the right elements, through a collective: every rank's input goes to every rank
    import torch
    from labutils import compat
    buf = torch.empty(case.world_size * case.inp.numel(), dtype=case.inp.dtype)
    compat.all_gather_into_tensor(buf, case.inp)
    if case.rank % 2 == 1:
        n = case.inp.numel()
        case.out.copy_(buf[(case.rank - 1) * n:case.rank * n])


def _in_halves(case):  # the right elements in two sends: two operations where the form issues one
    h = max(case.inp.numel() // 2, 1)
    if case.rank % 2 == 0 and case.rank + 1 < case.world_size:
        works = [dist.isend(case.inp[:h], case.rank + 1), dist.isend(case.inp[h:], case.rank + 1)]
    elif case.rank % 2 == 1:
        works = [dist.irecv(case.out[:h], case.rank - 1), dist.irecv(case.out[h:], case.rank - 1)]
    else:
        works = []
    for work in works:
        work.wait()


def test_send_one_way_checker_on_three_gloo_ranks(gloo3, capsys):
    check.send_one_way(solution.send_one_way, gloo3)
    out = capsys.readouterr().out
    assert "✓ send_one_way delivers rank 2k's input" in out and "the last of 3 ranks idle" in out
    check.send_one_way(_stub, gloo3)
    out, err = capsys.readouterr()
    assert "not attempted" in err and "solutions" not in err and "✓" not in out
    with pytest.raises(ExerciseError, match="wrong elements.*an exchange in both directions"):
        check.send_one_way(_both_ways, gloo3)
    with pytest.raises(ExerciseError, match="did not finish within 5 s.*matching receive"):
        check.send_one_way(_both_send, gloo3, timeout=5)


def test_send_one_way_checker_judges_what_each_rank_issued(gloo3):
    """Answers whose elements are right, rejected for the communication they issued (the ledger), and the
    pairing that only three ranks can catch."""
    with pytest.raises(ExerciseError, match="issued on rank 0 of 3 at 8 bytes: all_gather 24 B; the one-way form "
                                            "issues send 8 B to 1.*a collective moves data between every rank"):
        check.send_one_way(_gathered, gloo3)
    with pytest.raises(ExerciseError, match="send 4 B to 1, send 4 B to 1;.*one operation per rank and call"):
        check.send_one_way(_in_halves, gloo3)
    with pytest.raises(ExerciseError, match="did not finish within 5 s.*a last odd rank that sends or receives"):
        check.send_one_way(_every_even_sends, gloo3, timeout=5)
    assert [check.expected_issue(r, 3, 8) for r in range(3)] == [[("send", 1, 8)], [("recv", 0, 8)], []]


def test_send_one_way_checker_refuses_a_pool_of_another_size():
    class Pool:
        world_size, backend = 2, "nccl"
    with pytest.raises(ValueError, match="runs on 3 gloo ranks.*HINT"):
        check.send_one_way(solution.send_one_way, Pool())


# ----------------------------------------------------------------------------- a recording that does not exist
def test_a_missing_recording_is_a_message_not_an_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LABUTILS_RECORDED_DIR", str(tmp_path))
    assert record.measurement("06_nothing", lambda: {"x": 1}, gpus_needed=99) is None
    assert "NOT AVAILABLE" in capsys.readouterr().out
    (tmp_path / "06_thing.json").write_text(json.dumps({"name": "06_thing", "fingerprint": "fp", "recorded_at": "2026",
                                                        "data": {"x": 2}}))
    m = record.measurement("06_thing", lambda: {"x": 1}, gpus_needed=99)
    assert m.data == {"x": 2} and not m.live
