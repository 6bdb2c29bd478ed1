"""Lab 09 on real gloo ranks: the notebook's own layers (taken from its source) against one device, the
measurement sweeps at tiny sizes, the exercise checkers on right and wrong answers, and the verdicts'
thresholds.

Run: pytest tests/test_lab09.py -q   (two rank pools: 2 ranks for the lab's code, 3 for the checkers)
"""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils.checks import ExerciseError
from labutils.checks import lab09 as check
from labutils import compat
from labutils.instruments import compare
from labutils.labs.lab09_all_to_all import measure, verify
from labutils.instruments.ledger import Ledger
from labutils.labs.lab09_all_to_all.claims import CLAIMS
from labutils.solutions import lab09 as solution

from notebook_defs import load_definitions

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

nb = load_definitions("09_all_to_all_and_sequence_parallel")
FAST = dict(warmup=1, iters=1, repeat=2)


def _all_true(reports) -> bool:
    return not compare.failures(reports)


# ------------------------------------------------------------------ the notebook's code vs one device
def test_exchange_layouts_is_the_transpose_of_the_splits(gloo2):
    rows = gloo2.run(nb.exchange_layouts)
    assert rows[0]["even: after"] == [0, 1, 10, 11] and rows[1]["even: after"] == [2, 3, 12, 13]
    assert rows[1]["uneven: after"] == [1, 2, 12]


@pytest.mark.parametrize("kw", [dict(top_k=1), dict(top_k=2), dict(top_k=1, router_bias=50.0)],
                         ids=["top1", "top2", "all-to-expert-0"])
def test_expert_parallel_moe_equals_one_device(gloo2, kw):
    assert _all_true(gloo2.run(verify.moe_matches, nb.MoE, nb.ExpertParallelMoE, kwargs=kw))


def test_expert_parallel_moe_refuses_a_wrong_number_of_experts(gloo2):
    def build(rank, world_size, MoE, ExpertParallelMoE):
        ExpertParallelMoE(MoE(4, 8, world_size + 1), None)
    with pytest.raises(labutils.RankError, match="one expert per rank"):
        gloo2.run(build, nb.MoE, nb.ExpertParallelMoE)


def test_tp_block_equals_one_device_and_sp_needs_its_gradient_sync(gloo2):
    assert _all_true(gloo2.run(verify.block_matches, nb.Block, nb.ParallelBlock, kwargs=dict(sequence_parallel=False)))
    reports = gloo2.run(verify.block_matches, nb.Block, nb.ParallelBlock, kwargs=dict(sequence_parallel=True))
    unsynced = {check: all(r[check] for r in reports) for check in reports[0]}
    needs_sync = ["grad of norm.weight", "grad of norm.bias", "grad of down_bias"]
    assert not any(unsynced[c] for c in needs_sync)
    assert all(v for c, v in unsynced.items() if c not in needs_sync)
    assert _all_true(gloo2.run(verify.block_matches, nb.Block, nb.ParallelBlock,
                               kwargs=dict(sequence_parallel=True, sync=solution.sync_sp_grads)))


def test_dtensor_plans_equal_the_hand_written_layers(gloo2):
    assert _all_true(gloo2.run(verify.dtensor_matches, nb.Block, nb.ParallelBlock, nb.tp_plan,
                               kwargs=dict(sequence_parallel=False)))
    sp = gloo2.run(verify.dtensor_matches, nb.Block, nb.ParallelBlock, solution.sp_plan,
                   kwargs=dict(sequence_parallel=True))
    assert _all_true(sp)
    assert sp[0]["placements"]["norm.weight"] == "(Partial(sum),)"


def test_dtensor_sp_step_sums_its_partial_gradients_like_the_hand_written_sync(gloo2):
    """measure.block_sweep times the DTensor SP step with reduce_partial_grads after backward: then both SP
    steps do the same work, and their local gradients are equal."""
    for r in gloo2.run(verify.dtensor_step_sums_like_hand_written, nb.Block, nb.ParallelBlock, solution.sp_plan,
                       solution.sync_sp_grads):
        assert all(r["after"].values()), r["after"]
        assert not r["before"]["norm.weight"] and not r["before"]["norm.bias"]    # partial before the sum
        assert "Partial" not in "".join(r["placements"].values())
        assert r["placements"]["norm.weight"] == "(Replicate(),)"


def test_sp_sends_the_bytes_tp_sends_and_dtensor_the_same(gloo2):
    rows = gloo2.run(verify.traffic, nb.Block, nb.ParallelBlock,
                     kwargs=dict(sync=solution.sync_sp_grads,
                                 plans={"DTensor TP": (nb.tp_plan, False), "DTensor SP": (solution.sp_plan, True)}))[0]
    total = {}
    for r in rows:
        if r["phase"] != "gradient sync":
            total[r["layer"]] = total.get(r["layer"], 0) + r["wire_bytes"]
    assert total["TP"] == total["SP"] == total["DTensor TP"] == total["DTensor SP"] > 0
    assert {(r["layer"], r["op"]) for r in rows if r["phase"] == "forward"} == {
        ("TP", "all_reduce"), ("SP", "all_gather"), ("SP", "reduce_scatter"), ("DTensor TP", "all_reduce"),
        ("DTensor SP", "all_gather"), ("DTensor SP", "reduce_scatter")}
    assert [r["calls"] for r in rows if r["phase"] == "gradient sync"] == [3]


def test_saved_activations_are_predicted_by_the_shapes(gloo2):
    for report in gloo2.run(verify.saved_activations, nb.Block, nb.ParallelBlock):
        assert report["TP"]["counted"] == report["TP"]["predicted"]
        assert report["SP"]["counted"] == report["SP"]["predicted"] < report["TP"]["counted"]


# ------------------------------------------------------------------ bytes on the wire, counted
def _ledger_rank(rank, world_size):
    """Every collective the ledger knows, once, with sizes chosen so that each row is recognisable."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    n = world_size
    x = torch.ones(6 * n, dtype=torch.float32)                       # 24 * n bytes
    with Ledger("p") as ledger:
        dist.all_reduce(x.clone())
        compat.all_gather_into_tensor(torch.empty(6 * n * n), x)      # S = gathered output
        compat.reduce_scatter_tensor(torch.empty(6), x.clone())        # S = input
        dist.all_to_all_single(torch.empty_like(x), x)                 # even: (n-1)/n of S leaves
        splits = [rank + 1 if j == rank else 1 for j in range(n)]      # keep rank+1 rows, send 1 to each peer
        recv = [rank + 1 if i == rank else 1 for i in range(n)]
        dist.all_to_all_single(torch.empty(sum(recv)), torch.ones(sum(splits)), recv, splits)
        dist.broadcast(x.clone(), src=0)
    mesh = init_device_mesh("cpu", (n,))
    d = distribute_tensor(torch.ones(2 * n, 3), mesh, [Shard(0)])
    with Ledger("dtensor") as dt:
        d.redistribute(mesh, [Replicate()]).to_local()               # a functional all-gather
    return [(r.op, r.size_bytes, r.wire_bytes) for r in ledger.records], dt.summary()


def test_ledger_counts_every_collective_with_nccl_tests_factors(gloo3):
    n = 3
    records, dtensor = gloo3.run(_ledger_rank)[1]
    s = 24 * n
    assert records == [("all_reduce", s, 2 * (n - 1) / n * s),
                       ("all_gather", s * n, (n - 1) / n * s * n),
                       ("reduce_scatter", s, (n - 1) / n * s),
                       ("all_to_all", s, (n - 1) / n * s),
                       ("all_to_all", (n - 1 + 2) * 4, (n - 1) * 4),   # rank 1 keeps 2 rows, sends 1 to each peer
                       ("broadcast", s, s)]
    assert dtensor == [{"phase": "dtensor", "op": "all_gather", "calls": 1, "size_bytes": 2 * n * 3 * 4,
                        "wire_bytes": (n - 1) / n * 2 * n * 3 * 4}]


# ------------------------------------------------------------------ measurements (tiny, on gloo)
def test_measurement_sweeps_run_and_return_what_the_verdicts_read(gloo2):
    a2a = gloo2.run(measure.collective_sweep, [64, 4096], kwargs=dict(dtype="float32", **FAST))[0]
    assert a2a["size_bytes"] == [64, 4096] and a2a["wrong"] == 0
    moe = {"dispatch": gloo2.run(measure.dispatch_sweep, nb.dispatch, [16, 64],
                                 kwargs=dict(hidden=8, dtype="float32", **FAST))[0],
           "skew": gloo2.run(measure.skew_sweep, nb.MoE, nb.ExpertParallelMoE, nb.dispatch, [0.0, 50.0],
                             kwargs=dict(tokens=32, hidden=8, ffn=16, dtype="float32", **FAST))[0]}
    assert moe["skew"]["hot_share"][-1] == 1.0 and moe["skew"]["max_expert_rows"][-1] == 64
    skew = moe["skew"]
    for key in ("dispatch", "layer"):
        spans = zip(skew[f"{key}_p10_ms"], skew[f"{key}_ms"], skew[f"{key}_p90_ms"])
        assert all(lo <= mid <= hi for lo, mid, hi in spans)
    variants = {"TP": {"sequence_parallel": False}, "SP": {"sequence_parallel": True},
                "DTensor SP": {"sequence_parallel": True, "plan": solution.sp_plan}}
    blocks = gloo2.run(measure.block_sweep, nb.Block, nb.ParallelBlock, variants, [8, 16],
                       kwargs=dict(sync=solution.sync_sp_grads, hidden=8, ffn=16, dtype="float32", **FAST))[0]
    assert blocks["tokens"] == [8, 16] and set(blocks["time_ms"]) == set(variants)
    for name in ("TP", "SP"):
        assert blocks["memory"][name]["saved_bytes"] == blocks["memory"][name]["predicted_saved_bytes"]
    assert blocks["memory"]["SP"]["held_bytes"] is None   # no allocator statistics on CPU
    assert set(a2a["ops"]) == {"all_to_all_single", "all_gather_into_tensor"}
    assert all(len(v) == 2 for k, v in moe["dispatch"].items() if k.endswith(("_ms", "bytes")))


def test_measure_rejects_an_unknown_dtype(gloo2):
    with pytest.raises(labutils.RankError, match="unknown dtype"):
        gloo2.run(measure.collective_sweep, [64], kwargs=dict(dtype="int3"))


def test_busiest_bytes_is_the_largest_off_rank_send_or_receive():
    m = torch.tensor([[5, 1, 0], [7, 2, 0], [3, 0, 9]])
    assert measure.busiest_bytes(m, 10) == 100       # rank 0 receives 7 + 3 rows from others


# ------------------------------------------------------------------ checkers
def test_checkers_accept_the_reference_solutions(gloo3, capsys):
    check.all_to_all_p2p(solution.all_to_all_single_p2p, pool=gloo3)
    check.dispatch_with_capacity(solution.dispatch_with_capacity, pool=gloo3)
    assert check.sync_sp_grads(solution.sync_sp_grads, nb.Block, nb.ParallelBlock, pool=gloo3) is solution.sync_sp_grads
    assert check.sp_plan(solution.sp_plan, nb.Block, nb.ParallelBlock, pool=gloo3) is solution.sp_plan
    out = capsys.readouterr().out
    assert out.count("✓") == 4 and "not attempted" not in out


def _stub(*args):
    raise NotImplementedError


def test_untouched_stubs_are_not_attempted_and_stand_ins_are_used(gloo3, capsys):
    check.all_to_all_p2p(_stub, pool=gloo3)
    check.dispatch_with_capacity(_stub, pool=gloo3)
    assert check.sync_sp_grads(_stub, nb.Block, nb.ParallelBlock, pool=gloo3) is check.standin_grad_sync
    assert check.sp_plan(_stub, nb.Block, nb.ParallelBlock, pool=gloo3) is check.torch_styles_sp_plan
    out, err = capsys.readouterr()
    assert err.count("… not attempted") == 4 and "✓" not in out and "solutions" not in err
    check.sp_plan(lambda: check.torch_styles_sp_plan(), nb.Block, nb.ParallelBlock, pool=gloo3)
    assert capsys.readouterr().out.count("✓") == 1  # the plan's stand-in is right
    # the sync's stand-in gets every gradient right, by gathering every parameter: not the answer
    with pytest.raises(ExerciseError, match="nothing to find out by communicating"):
        check.sync_sp_grads(lambda b, g: check.standin_grad_sync(b, g), nb.Block, nb.ParallelBlock, pool=gloo3)


def _collective(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    dist.all_to_all_single(output, input, output_split_sizes, input_split_sizes, group=group)


def _nothing(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    return output


def _own_block_lost(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    solution.all_to_all_single_p2p(output, input, output_split_sizes, input_split_sizes, group)
    rank = dist.get_rank()
    output.split(list(output_split_sizes))[rank].fill_(-5.0)


def _everything_to_everyone(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    """Right output, by sending the whole input (and its split sizes) to every peer, who keeps its block."""
    rank, n = dist.get_rank(), dist.get_world_size()
    splits = torch.tensor(list(input_split_sizes) if input_split_sizes else [input.shape[0] // n] * n)
    theirs = [torch.empty_like(splits) for _ in range(n)]
    ops = [op for peer in range(n) if peer != rank for op in (dist.P2POp(dist.isend, splits, peer),
                                                              dist.P2POp(dist.irecv, theirs[peer], peer))]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    whole = {p: input.new_empty((int(theirs[p].sum()),) + tuple(input.shape[1:])) for p in range(n) if p != rank}
    ops = [op for peer in range(n) if peer != rank for op in (dist.P2POp(dist.isend, input.contiguous(), peer),
                                                              dist.P2POp(dist.irecv, whole[peer], peer))]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    outs = output.split(list(output_split_sizes) if output_split_sizes else output.shape[0] // n)
    for peer in range(n):
        if peer == rank:
            outs[peer].copy_(input.split(splits.tolist())[rank])
        else:
            outs[peer].copy_(whole[peer].split(theirs[peer].tolist())[rank])
    return output


def _gathered(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    """A disguised collective: all_gather every rank's input as objects, keep what is mine."""
    rank, n = dist.get_rank(), dist.get_world_size()
    every = [None] * n
    dist.all_gather_object(every, (input, list(input_split_sizes or [input.shape[0] // n] * n)))
    outs = output.split(list(output_split_sizes) if output_split_sizes else output.shape[0] // n)
    for peer, (x, splits) in enumerate(every):
        outs[peer].copy_(x.split(splits)[rank])
    return output


@pytest.mark.parametrize("fn,hint", [(_collective, "point-to-point"), (_nothing, "in place"),
                                     (_own_block_lost, "local copy"),
                                     (_everything_to_everyone, "everything to everyone"),
                                     (_gathered, "point-to-point")])
def test_all_to_all_checker_names_the_mistake(gloo3, fn, hint):
    with pytest.raises(ExerciseError, match=hint):
        check.all_to_all_p2p(fn, pool=gloo3)


def _single(x, dest, capacity, group=None):
    return solution.dispatch_with_capacity(x, dest, capacity, group)[0]


def _unpadded(x, dest, capacity, group=None):
    received, kept = solution.dispatch_with_capacity(x, dest, capacity, group)
    return received[: capacity], kept


def _keeps_all(x, dest, capacity, group=None):
    received, kept = solution.dispatch_with_capacity(x, dest, capacity, group)
    return received, torch.ones_like(kept)


def _counts_first(x, dest, capacity, group=None):
    """Right rows, but the uncapped dispatch's habit: the counts exchanged first."""
    n = dist.get_world_size(group)
    counts = torch.zeros(n, dtype=torch.long).index_add_(0, dest, torch.ones_like(dest))
    dist.all_to_all_single(torch.empty_like(counts), counts, group=group)
    return solution.dispatch_with_capacity(x, dest, capacity, group)


@pytest.mark.parametrize("fn,hint", [(_single, "a pair"), (_unpadded, "world_size \\* capacity"),
                                     (_keeps_all, "first `capacity`"), (_counts_first, "no counts to exchange")])
def test_capacity_checker_names_the_mistake(gloo3, fn, hint):
    with pytest.raises(ExerciseError, match=hint):
        check.dispatch_with_capacity(fn, pool=gloo3)


def _average(block, group=None):
    for p in (block.norm.weight, block.norm.bias, block.down_bias):
        dist.all_reduce(p.grad, group=group)
        p.grad /= dist.get_world_size(group)


def _everything(block, group=None):
    for p in block.parameters():
        dist.all_reduce(p.grad, group=group)


def _norm_only(block, group=None):
    for p in block.norm.parameters():
        dist.all_reduce(p.grad, group=group)


@pytest.mark.parametrize("fn,hint", [(_average, "do not average"), (_everything, "leave the column and row"),
                                     (_norm_only, "down_bias is added")])
def test_sync_checker_names_the_mistake(gloo3, fn, hint):
    with pytest.raises(ExerciseError, match=hint):
        check.sync_sp_grads(fn, nb.Block, nb.ParallelBlock, pool=gloo3)


def _no_norm():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    return {"up": ColwiseParallel(input_layouts=Shard(0)), "down": RowwiseParallel(output_layouts=Shard(0))}


def _batch_first():
    plan = solution.sp_plan()
    from torch.distributed.tensor.parallel import SequenceParallel
    plan["norm"] = SequenceParallel()
    return plan


def _replicated_output():
    plan = solution.sp_plan()
    from torch.distributed.tensor.parallel import RowwiseParallel
    plan["down"] = RowwiseParallel()
    return plan


def _gathered_features():
    """Right outputs and gradients, but the f-wide activations all-gathered between the two layers."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    return {"norm": SequenceParallel(sequence_dim=0),
            "up": ColwiseParallel(input_layouts=Shard(0), output_layouts=Replicate()),
            "down": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))}


@pytest.mark.parametrize("fn,hint", [(_no_norm, "SequenceParallel style"), (_batch_first, "dim 1"),
                                     (_gathered_features, "split by features"),
                                     (_replicated_output, "output_layouts=Shard\\(0\\)"),
                                     (lambda: [], "return a dict")])
def test_plan_checker_names_the_mistake(gloo3, fn, hint):
    with pytest.raises(ExerciseError, match=hint):
        check.sp_plan(fn, nb.Block, nb.ParallelBlock, pool=gloo3)


def _raises(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    raise ValueError("boom")


def test_an_exception_in_the_learners_function_becomes_an_exercise_error(gloo3):
    with pytest.raises(ExerciseError, match="raised ValueError on rank 0: boom"):
        check.all_to_all_p2p(_raises, pool=gloo3)


def _waits_forever(output, input, output_split_sizes=None, input_split_sizes=None, group=None):
    if dist.get_rank() == 0:
        dist.recv(torch.empty(1), src=1)     # rank 1 never sends


def test_a_hang_becomes_an_exercise_error_with_a_hint(monkeypatch):
    monkeypatch.setattr(check, "TIMEOUT_S", 5)
    with pytest.raises(ExerciseError, match="did not finish within 5 s"):
        check.all_to_all_p2p(_waits_forever)          # no pool: 3 fresh gloo ranks


def _loaded(rank, world_size):
    return [name for name in check.LAZY_MODULES if name in sys.modules]


def test_warm_up_imports_what_torch_loads_on_first_use():
    with labutils.RankPool(world_size=1, backend="gloo", output="quiet") as fresh:
        assert fresh.run(_loaded) == [[]]
        check.warm_up(fresh)
        assert fresh.run(_loaded) == [list(check.LAZY_MODULES)]
    with pytest.raises(ValueError, match="needs the pool"):
        check.warm_up(None)


def test_checkers_refuse_a_pool_that_is_not_gloo():
    class NcclPool:
        backend, world_size = "nccl", 3
    with pytest.raises(ValueError, match="backend='gloo'"):
        check.all_to_all_p2p(solution.all_to_all_single_p2p, pool=NcclPool())
    with pytest.raises(ValueError, match="backend='gloo'"):
        check.warm_up(NcclPool())


# ------------------------------------------------------------------ verdict thresholds (pure)
def _a2a(ratio: float, wrong: int = 0) -> dict:
    sizes = [2**10 * 4**k for k in range(6)]
    times = [0.01 + s / 200e6 for s in sizes]        # exactly alpha + S / beta
    def op(scale):
        return {"time_ms": times, "busbw_gbps": [s / t / 2e6 * scale for s, t in zip(sizes, times)]}
    return {"size_bytes": sizes, "wrong": wrong,
            "ops": {"all_to_all_single": op(ratio), "all_gather_into_tensor": op(1.0)}}


def test_a2a_verdicts_follow_their_thresholds():
    good = [v.verdict for v in CLAIMS["09_a2a_sweep"](_a2a(1.1))]
    assert good == ["TRUE", "TRUE", "TRUE"]
    bad = [v.verdict for v in CLAIMS["09_a2a_sweep"](_a2a(0.8, wrong=2))]
    assert bad == ["FALSE", "TRUE", "FALSE"]


def _moe(dispatch_small: float, dispatch_large: float, skew_ms: float, layer_ms: float,
         spread_ms: float | None = 0.002) -> dict:
    skew = {"world_size": 2, "tokens": 65536, "hot_share": [0.5, 1.0], "busiest_bytes": [10**6, 3 * 10**6],
            "max_expert_rows": [10, 20], "dispatch_ms": [1.0, skew_ms], "layer_ms": [1.0, layer_ms]}
    if spread_ms is not None:        # recordings made before the samples' p10/p90 were kept have none
        skew.update(dispatch_p10_ms=[t - spread_ms / 2 for t in skew["dispatch_ms"]],
                    dispatch_p90_ms=[t + spread_ms / 2 for t in skew["dispatch_ms"]])
    return {"dispatch": {"tokens": [512, 65536], "dispatch_ms": [dispatch_small, dispatch_large],
                         "rows_only_ms": [1.0, 1.0]}, "skew": skew}


def test_moe_verdicts_follow_their_thresholds():
    a2a = _a2a(1.0)                                   # beta = 200e6 B/ms: 2e6 extra bytes x 2 -> +0.02 ms
    fn = CLAIMS[("09_a2a_sweep", "09_moe")]
    assert [v.verdict for v in fn(a2a, _moe(2.5, 1.5, 1.02, 2.1))] == ["TRUE"] * 4
    assert [v.verdict for v in fn(a2a, _moe(1.5, 2.5, 2.0, 1.2))] == ["FALSE"] * 4


@pytest.mark.parametrize("skew_ms,spread_ms,verdict", [
    (1.02, 0.002, "TRUE"),            # rise 0.02 ms as predicted; spread 0.002 ms: resolved
    (1.0, 0.002, "FALSE"),            # no rise at all, where the predicted one stands above the noise
    (1.0149, 0.002, "FALSE"),         # 25.5% below the predicted rise: just outside 25%
    (1.0151, 0.002, "TRUE"),          # 24.5% below: just inside
    (1.014, 0.009, "TRUE"),           # 30% below, but the spread (45% of the rise) widens the tolerance
    (1.0, 0.0099, "FALSE"),           # the widest tolerance (spread just under half the rise) still fails no rise
    (1.0, 0.0101, "NOT RESOLVED"),    # predicted rise under 2 spreads: no rise cannot be told from the predicted
    (1.02, 0.0101, "NOT RESOLVED"),   # ... nor can agreement
    (1.02, None, "NOT RESOLVED"),     # no spread recorded
])
def test_skew_verdict_judges_the_rise_only_above_the_noise(skew_ms, spread_ms, verdict):
    got = CLAIMS[("09_a2a_sweep", "09_moe")](_a2a(1.0), _moe(2.5, 1.5, skew_ms, 2.1, spread_ms))[2]
    assert got.verdict == verdict, got.line()
    assert "dispatch rise" in got.figure and "NOT RESOLVED if" in got.rule


@pytest.mark.parametrize("ratio,verdict,shown", [
    (1.1516, "FALSE", "within 15.0% (off by 15.2%)"),   # the 2xH200 busbw ratio: whole percents would say 15 and 15
    (1.1496, "TRUE", "within 15% (off by 15%)"),        # inside: the rounded figure already agrees
    (1.1504, "FALSE", "within 15.00% (off by 15.04%)"),  # just outside: as many decimals as it takes
    (0.8496, "FALSE", "within 15.00% (off by 15.04%)"),  # the other side: the all-gather ahead
])
def test_a2a_off_by_figure_agrees_with_its_verdict(ratio, verdict, shown):
    v = CLAIMS["09_a2a_sweep"](_a2a(ratio))[0]
    assert v.verdict == verdict and v.rule.endswith(shown), v.line()


def test_rise_verdict_prints_its_error_on_the_verdicts_side():
    from labutils.labs.lab09_all_to_all.claims import rise_verdict
    v = rise_verdict("c", 0.7498, 1.0, 0.01, figure="f")    # 25.02% below the predicted rise, 25% allowed
    assert v.verdict == "FALSE" and v.rule.endswith("(off by 25.02%, allowed 25.00%)"), v.rule
    v = rise_verdict("c", 0.7502, 1.0, 0.01, figure="f")
    assert v.verdict == "TRUE" and v.rule.endswith("(off by 25%, allowed 25%)"), v.rule


def test_rise_verdict_refuses_a_failed_measurement():
    from labutils.labs.lab09_all_to_all.claims import rise_verdict
    with pytest.raises(ValueError, match="non-finite"):
        rise_verdict("c", float("nan"), 1.0, 0.1, figure="f")


def _blocks(sp_held: float, sp_time: float, dt_small: float) -> dict:
    mem = lambda held, pred: {"held_bytes": held, "predicted_held_bytes": pred}  # noqa: E731
    return {"tokens": [512, 8192],
            "time_ms": {"TP": [1.0, 10.0], "SP": [1.0, sp_time], "DTensor TP": [dt_small, 10.5],
                        "DTensor SP": [dt_small, sp_time * 1.05]},
            "memory": {"TP": mem(100e6, 100e6), "SP": mem(sp_held, 80e6), "DTensor TP": mem(100e6, 0),
                       "DTensor SP": mem(sp_held, 0)}}


def test_block_verdicts_follow_their_thresholds():
    assert [v.verdict for v in CLAIMS["09_sp_block"](_blocks(80e6, 10.2, 2.0))] == ["TRUE"] * 3
    assert [v.verdict for v in CLAIMS["09_sp_block"](_blocks(110e6, 12.0, 2.0))] == ["FALSE", "TRUE", "FALSE"]
    assert [v.verdict for v in CLAIMS["09_dtensor"](_blocks(80e6, 10.0, 2.0))] == ["TRUE"] * 5
    assert [v.verdict for v in CLAIMS["09_dtensor"](_blocks(80e6, 10.0, 1.0))] == [
        "TRUE", "FALSE", "TRUE", "FALSE", "TRUE"]
