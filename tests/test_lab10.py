"""Lab 10 on real gloo ranks and in pure functions: the notebook's three all-reduces (taken from its source)
against the model and the ledger, the 2-D mesh against one device, the exercise checkers on right, wrong
and missing answers, NCCL's tuning lines as NCCL 2.28 prints them, and the verdicts' thresholds.

Run: pytest tests/test_lab10.py -q   (one pool of 4 gloo ranks for the whole module)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch.distributed as dist

import labutils
from labutils import compat, recorded
from labutils.checks import ExerciseError
from labutils.checks import lab10 as check
from labutils.labs.lab10_scaling_out import measure, model, tuning, verify
from labutils.labs.lab10_scaling_out.claims import (CLAIMS, cost_verdicts, crossover, ledger_mismatches,
                                                    predicted_8gpu_busbw, roofline_verdicts)
from labutils.solutions import lab10 as solution

from notebook_defs import load_definitions

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

nb = load_definitions("10_scaling_out")
ROOT = Path(__file__).resolve().parent.parent
ALGORITHMS = {"ring": nb.ring_all_reduce, "tree": nb.tree_all_reduce, "direct": nb.direct_all_reduce}


@pytest.fixture(scope="module")
def gloo4():
    """Four gloo ranks kept for the whole test module (the checkers' size)."""
    with labutils.RankPool(world_size=4, backend="gloo", output="quiet") as p:
        yield p


# ------------------------------------------------------------------ NCCL's tuning lines (pure)
# NCCL 2.28.9, src/enqueue.cc: INFO(NCCL_TUNING, "%s: %ld Bytes -> Algo %s proto %s channel{Lo..Hi}={%d..%d}", ...)
# behind debug.cc's "host:pid:tid [cudaDev] NCCL INFO " prefix, and labutils' "[rank r] " in front.
LOG_2_28 = """\
[rank 0] vm:2741:2741 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
[rank 0] vm:2741:2741 [0] NCCL INFO AllReduce: 8 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
[rank 0] vm:2741:2741 [0] NCCL INFO AllReduce: 8 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}
[rank 0] vm:2741:2741 [0] NCCL INFO AllReduce: 2097152 Bytes -> Algo RING proto LL128 channel{Lo..Hi}={0..15}
[rank 0] vm:2741:2741 [0] NCCL INFO AllGather: 2097152 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..7}
[rank 0] vm:2741:2741 [0] NCCL INFO AllReduce: 67108864 Bytes -> Algo TREE proto SIMPLE channel{Lo..Hi}={0..23}
[rank 1] vm:2742:2742 [1] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via P2P/CUMEM/read"""
# NCCL 2.18-2.21 (src/enqueue.cc of those versions): "%ld Bytes -> Algo %d proto %d time %f"
LOG_2_18 = "node-0:309:309 [0] NCCL INFO AllGather: 37756928 Bytes -> Algo 1 proto 2 time 2860.208008"


def test_tuning_lines_of_nccl_2_28_are_read_with_channels():
    got = tuning.parse_tuning(LOG_2_28)
    assert [(c.func, c.size_bytes, c.algo, c.proto, c.channels) for c in got] == [
        ("AllReduce", 8, "RING", "LL", 1), ("AllReduce", 8, "RING", "LL", 1),
        ("AllReduce", 2097152, "RING", "LL128", 16), ("AllGather", 2097152, "RING", "SIMPLE", 8),
        ("AllReduce", 67108864, "TREE", "SIMPLE", 24)]
    by_size = tuning.choices_by_size(got)
    assert by_size == {8: "RING/LL", 2097152: "RING/LL128", 67108864: "TREE/SIMPLE"}
    assert tuning.switch_points(by_size) == [(2097152, "RING/LL", "RING/LL128"),
                                             (67108864, "RING/LL128", "TREE/SIMPLE")]
    assert tuning.choices_by_size(got, "AllGather") == {2097152: "RING/SIMPLE"}


def test_tuning_lines_of_older_nccl_map_numbers_to_names():
    (c,) = tuning.parse_tuning(LOG_2_18)
    assert (c.func, c.size_bytes, c.algo, c.proto, c.channels) == ("AllGather", 37756928, "RING", "SIMPLE", 0)
    assert tuning.parse_tuning("NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM") == []


def test_the_environment_line_is_read_by_the_course_parser():
    from labutils import debugging
    assert debugging.parse_nccl_log(LOG_2_28).env == {"NCCL_NVLS_ENABLE": "0"}


def test_forcing_a_choice_is_checked():
    assert tuning.forced_env("Ring", "LL128") == {"NCCL_ALGO": "Ring", "NCCL_PROTO": "LL128"}
    assert tuning.forced_env(None, None) == {}
    with pytest.raises(ValueError, match="no algorithm 'Butterfly'.*HINT"):
        tuning.forced_env("Butterfly", None)
    with pytest.raises(ValueError, match="no protocol 'LL64'.*HINT"):
        tuning.forced_env(None, "LL64")


# ------------------------------------------------------------------ the model (pure)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 16])
def test_tree_sends_add_up_to_the_reduce_and_the_broadcast(n):
    assert sum(model.tree_sends(r, n) for r in range(n)) == 2 * (n - 1)
    assert model.tree_sends(0, n) == (n - 1).bit_length()          # the root: once per level


def test_model_table():
    assert [model.rounds("ring", n) for n in (1, 2, 8)] == [0, 2, 14]
    assert [model.rounds("tree", n) for n in (2, 3, 8, 9)] == [2, 4, 6, 8]
    assert model.rounds("direct", 8) == 1
    assert model.sent_bytes("ring", 3, 8, 800) == pytest.approx(1400)
    assert model.busiest_bytes("direct", 8, 10) == 70
    t = model.time_ms("ring", 1e6, 4, alpha_us=10, beta_gbps=1)
    assert t == pytest.approx(6 * 0.01 + 1.5 * 1e6 / 1e9 * 1e3)
    with pytest.raises(ValueError, match="unknown all-reduce algorithm.*HINT"):
        model.rounds("butterfly", 4)
    with pytest.raises(ValueError, match="int >= 1"):
        model.rounds("ring", 0)


def test_crossover_is_where_the_two_lines_meet():
    s = model.crossover_bytes("ring", "direct", 8, alpha_us=10, beta_gbps=1)
    assert s > 0
    assert model.time_ms("ring", s, 8, 10, 1) == pytest.approx(model.time_ms("direct", s, 8, 10, 1))
    assert model.time_ms("ring", 2 * s, 8, 10, 1) < model.time_ms("direct", 2 * s, 8, 10, 1)
    assert model.crossover_bytes("direct", "ring", 8, 10, 1) is None     # never faster for large messages
    assert model.crossover_bytes("ring", "ring", 8, 10, 1) is None
    assert model.crossover_bytes("ring", "tree", 2, 10, 1) == 0          # same rounds, fewer bytes


def test_hierarchy_and_roofline():
    assert model.hierarchical_bytes(1024, 2, 2) == {"intra": 1024, "inter": 512}
    assert model.hierarchical_bytes(1024, 8, 2)["inter"] == 128
    h = model.roofline_hidden(4, 1e15, 100, itemsize=2)
    assert h == 7500
    t = model.tp_mlp_times_ms(512, 7500, 4, 1e15, 100)
    assert t["compute_ms"] == pytest.approx(t["comm_ms"], rel=1e-3)   # equal at h*
    assert model.roofline_hidden(8, 1e12, 100) > model.roofline_hidden(2, 1e12, 100)


# ------------------------------------------------------------------ the notebook's all-reduces on gloo ranks
def test_the_three_all_reduces_sum_and_send_what_the_model_says(gloo4):
    parts = gloo4.run(measure.allreduce_sweep, ALGORITHMS, [1024], [3, 4],
                      kwargs=dict(ledger_size=6144, warmup=1, iters=1, repeat=1))
    data = measure.combine(parts, [1024], [3, 4], 6144, cores=2)
    assert all(all(v.values()) for v in data["correct"].values())
    assert ledger_mismatches(data) == []
    assert data["ledger"]["tree"]["4"]["messages"] == [2, 1, 2, 1]
    assert all(not data["ledger"][a]["4"]["collectives"] for a in ALGORITHMS)   # point-to-point only
    assert all(t > 0 for a in ALGORITHMS for t in data["time_ms"][a]["4"])


def test_a_sweep_larger_than_the_pool_is_refused(gloo4):
    with pytest.raises(labutils.RankError, match="n = 8 ranks but the pool has 4"):
        gloo4.run(measure.allreduce_sweep, ALGORITHMS, [1024], [2, 8])


def test_the_mesh_trains_like_one_device_and_says_which_group_ran_what(gloo4):
    reports = gloo4.run(verify.mesh_training, nb.TensorParallelMLP, solution.sync_grads)
    assert all(all(r["equal"].values()) for r in reports)
    groups = {(g["phase"], g["op"], g["group"]) for g in reports[0]["groups"]}
    assert groups == {("forward + backward", "all_reduce", "tp"), ("gradient sync", "all_reduce", "dp")}


def test_the_mesh_check_can_fail(gloo4):
    def no_sync(model, mesh):
        pass
    reports = gloo4.run(verify.mesh_training, nb.TensorParallelMLP, no_sync)
    assert not all(all(r["equal"].values()) for r in reports)


# ------------------------------------------------------------------ exercise 1: the hierarchical all-reduce
def _stub(*args):
    raise NotImplementedError


def test_hierarchical_reference_passes(gloo4, capsys):
    fn = solution.hierarchical_all_reduce
    assert check.hierarchical_all_reduce(fn, pool=gloo4) is fn
    assert "✓ hierarchical all-reduce on 4 ranks" in capsys.readouterr().out


def test_hierarchical_not_attempted_says_so_and_gives_torch_s_all_reduce(gloo4, capsys):
    fn = check.hierarchical_all_reduce(_stub, pool=gloo4)
    assert fn is check.torch_all_reduce and labutils.checks.is_standin(fn)
    out, err = capsys.readouterr()
    assert "✓" not in out and "not attempted: my_hierarchical_all_reduce" in err and "no points" in err
    assert "torch's flat dist.all_reduce" in err
    reports = gloo4.run(verify.hierarchical, fn, 2, 1024)           # the stand-in sums, flat, over the world
    assert all(r["equal"] and r["other"] > 0 for r in reports)


def test_hierarchical_that_sends_the_whole_tensor_across_is_rejected(gloo4):
    def all_reduce_twice(tensor, node_group, cross_group):     # the right sum, L times the bytes across
        dist.all_reduce(tensor, group=node_group)
        dist.all_reduce(tensor, group=cross_group)
    with pytest.raises(ExerciseError, match="crossed the node boundary.*HINT: reduce-scatter inside the node"):
        check.hierarchical_all_reduce(all_reduce_twice, pool=gloo4)


def test_hierarchical_with_a_wrong_sum_is_rejected(gloo4):
    def forgets_the_other_node(tensor, node_group, cross_group):
        shard = tensor.new_empty(tensor.numel() // dist.get_world_size(node_group))
        compat.reduce_scatter_tensor(shard, tensor, group=node_group)
        compat.all_gather_into_tensor(tensor, shard, group=node_group)
    with pytest.raises(ExerciseError, match="not the sum over all 4 ranks.*HINT"):
        check.hierarchical_all_reduce(forgets_the_other_node, pool=gloo4)


def test_hierarchical_on_the_world_group_is_rejected(gloo4):
    def flat(tensor, node_group, cross_group):                 # the stand-in, submitted as an answer
        dist.all_reduce(tensor)
    with pytest.raises(ExerciseError, match="neither your node nor your cross group"):
        check.hierarchical_all_reduce(flat, pool=gloo4)


# ------------------------------------------------------------------ exercise 2: the prediction
def test_prediction_right_with_the_ledger_and_without(gloo4, capsys):
    check.inter_node_bytes(solution.inter_node_bytes, solution.hierarchical_all_reduce, pool=gloo4)
    assert "and the ledger: 524,288 bytes per rank across nodes" in capsys.readouterr().out
    check.inter_node_bytes(solution.inter_node_bytes, check.torch_all_reduce, pool=gloo4)
    assert "the ledger counted none" in capsys.readouterr().out


def test_prediction_not_attempted(gloo4, capsys):
    assert check.inter_node_bytes(_stub, solution.hierarchical_all_reduce, pool=gloo4) is None
    out, err = capsys.readouterr()
    assert "✓" not in out and "not attempted: my_inter_node_bytes" in err and "no points" in err


def test_prediction_wrong_but_plausible_is_rejected(gloo4):
    def whole_tensor(size_bytes, local, nodes):              # plausible: the flat all-reduce's share
        return size_bytes
    with pytest.raises(ExerciseError, match="predicted 1,048,576.*sends 524,288.*HINT: that is what crosses when "
                                            "the whole tensor"):
        check.inter_node_bytes(whole_tensor, solution.hierarchical_all_reduce, pool=gloo4)

    def forgets_the_shard(size_bytes, local, nodes):         # the ring's factor among the nodes, on all of S
        return 2 * (nodes - 1) / nodes * size_bytes
    with pytest.raises(ExerciseError, match="HINT: that is what crosses when the whole tensor"):
        check.inter_node_bytes(forgets_the_shard, None, pool=gloo4)

    def right_for_two_nodes_only(size_bytes, local, nodes):  # S / L: the 2-node case, by luck
        return size_bytes / local
    with pytest.raises(ExerciseError, match="on 3 nodes x 4 you predicted.*HINT: only this rank's 1/local shard"):
        check.inter_node_bytes(right_for_two_nodes_only, None, pool=gloo4)

    with pytest.raises(ExerciseError, match="not a number of bytes"):
        check.inter_node_bytes(lambda s, l, n: "half", None, pool=gloo4)


# ------------------------------------------------------------------ exercise 3: the mesh's group choice
def test_sync_reference_passes(gloo4, capsys):
    assert check.sync_grads(solution.sync_grads, nb.TensorParallelMLP, pool=gloo4) is solution.sync_grads
    assert "✓ 2-D mesh" in capsys.readouterr().out


def test_sync_not_attempted_says_so_and_its_stand_in_trains_like_one_device(gloo4, capsys):
    fn = check.sync_grads(_stub, nb.TensorParallelMLP, pool=gloo4)
    assert fn is check.torch_average_gradients and labutils.checks.is_standin(fn)
    out, err = capsys.readouterr()
    assert "✓" not in out and "not attempted: my_sync_grads" in err and "average_parameters" in err
    reports = gloo4.run(verify.mesh_training, nb.TensorParallelMLP, fn)
    assert all(all(r["equal"].values()) for r in reports)


def test_sync_over_the_tensor_parallel_group_is_rejected(gloo4):
    def wrong_group(model, mesh):                 # plausible: "tp" is the other name on the mesh
        for p in model.parameters():
            dist.all_reduce(p.grad, group=mesh["tp"].get_group())
            p.grad.div_(mesh["tp"].size())
    with pytest.raises(ExerciseError, match="ran collectives on tp.*HINT: the tensor-parallel ranks hold different"):
        check.sync_grads(wrong_group, nb.TensorParallelMLP, pool=gloo4)


def test_sync_that_sums_is_rejected(gloo4):
    def sums(model, mesh):
        for p in model.parameters():
            dist.all_reduce(p.grad, group=mesh["dp"].get_group())
    with pytest.raises(ExerciseError, match="differ from one-device training.*HINT: average, do not sum"):
        check.sync_grads(sums, nb.TensorParallelMLP, pool=gloo4)


def test_sync_that_reduces_twice_is_rejected_by_its_bytes(gloo4):
    def twice(model, mesh):                       # the right average, twice the traffic
        for p in model.parameters():
            for _ in range(2):                    # the second average changes nothing: all dp ranks agree
                dist.all_reduce(p.grad, group=mesh["dp"].get_group())
                p.grad.div_(mesh["dp"].size())
    with pytest.raises(ExerciseError, match="sent 2,304 bytes per step.*sends 1,152.*HINT: all-reduce every"):
        check.sync_grads(twice, nb.TensorParallelMLP, pool=gloo4)


def test_a_checker_refuses_a_pool_of_the_wrong_size(gloo2):
    with pytest.raises(ValueError, match="4 gloo ranks.*HINT"):
        check.hierarchical_all_reduce(solution.hierarchical_all_reduce, pool=gloo2)


# ------------------------------------------------------------------ verdicts and missing recordings
def _synthetic(ring_big=1.0, tree_big=2.0, mess=False):
    ns, sizes = [2, 4], [256, 1024]
    ledger = {a: {str(n): {"messages": [{"ring": 2 * (n - 1), "tree": model.tree_sends(r, n), "direct": n - 1}[a]
                                        for r in range(n)],
                           "wire_bytes": [model.sent_bytes(a, r, n, 6144) for r in range(n)], "collectives": []}
                  for n in ns} for a in ALGORITHMS}
    if mess:
        ledger["ring"]["4"]["wire_bytes"][1] += 4
    times = {"ring": {"2": [0.1, 0.5], "4": [0.6, ring_big]}, "tree": {"2": [0.1, 0.6], "4": [0.3, tree_big]},
             "direct": {"2": [0.1, 0.7], "4": [0.2, 3.0]}}
    return {"sizes": sizes, "ns": ns, "ledger_size_bytes": 6144, "cores": 2, "algorithms": list(ALGORITHMS),
            "time_ms": times, "correct": {a: {str(n): True for n in ns} for a in ALGORITHMS}, "ledger": ledger}


def test_cost_verdicts_follow_their_thresholds():
    ok = {v.claim.split(" (")[0]: v.verdict for v in cost_verdicts(_synthetic())}
    assert set(ok.values()) == {"TRUE"}
    bad = [v.verdict for v in cost_verdicts(_synthetic(ring_big=3.0, mess=True))]
    assert bad[1] == "FALSE" and bad[3] == "FALSE"
    assert crossover(_synthetic(), 4) == 1024 and crossover(_synthetic(ring_big=3.0), 4) is None


def test_roofline_verdict_can_fail():
    data = {"n": 2, "tokens": 256, "hiddens": [32, 64, 128, 256, 512],
            "compute_ms": [0.01, 0.04, 0.16, 0.64, 2.56], "comm_ms": [0.3, 0.31, 0.32, 0.34, 0.38]}
    assert roofline_verdicts(data)[0].verdict == "TRUE"
    data["compute_ms"][0] = 0.5                                # a noisy first point: measured from 32,
    assert roofline_verdicts(data)[0].verdict == "FALSE"      # modelled from 256
    assert set(CLAIMS) == {"10_cost_vs_n", "06_bench_sweep", "10_roofline"}


def test_the_8_gpu_prediction_comes_from_the_recorded_2_gpu_fit():
    bench = json.loads((ROOT / "notebooks" / "recorded" / "06_bench_sweep.json").read_text())["data"]
    busbw, size = predicted_8gpu_busbw(bench)
    assert size == max(r["size_bytes"] for r in bench["rows"] if r["collective"] == "all_reduce")
    assert 0 < busbw < max(r["busbw_gbps"] for r in bench["rows"] if r["collective"] == "all_reduce") * 1.5
    assert [v.verdict in ("TRUE", "FALSE") for v in CLAIMS["06_bench_sweep"](bench)] == [True, True]


def test_a_missing_recording_says_so_and_shows_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("LABUTILS_RECORDED_DIR", str(tmp_path))
    got = recorded.live_or_none("10_nowhere", lambda: pytest.fail("measured without GPUs"), gpus_needed=99,
                               shows="something")
    out = capsys.readouterr().out
    assert got is None and "NO RECORDING YET" in out and "Nothing is shown" in out and "something" in out
