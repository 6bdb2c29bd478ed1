"""Checkers for lab 10's exercises (the hierarchical all-reduce, the mesh's group choice, one prediction).

Each runs on 4 gloo ranks (2 "nodes" x 2, or a ("dp", "tp") mesh of 2 x 2: CPU tensors, the same text on
every machine) and judges the result *and* what the communication ledger saw: the bytes per tier, the
group each collective ran on. It prints ``✓ ...`` or raises ``ExerciseError`` with a HINT chosen from the
symptom. A stub that raises NotImplementedError is "not attempted": the checker says so on stderr, checks
nothing, and returns a stand-in that does not show the answer where later cells need one (torch's own
``dist.all_reduce`` for the hierarchical all-reduce, torch's ``average_parameters`` for the gradient
sync). Pass ``pool=`` a 4-rank gloo ``labutils.RankPool`` to reuse its ranks; otherwise each check
launches 4.
"""
from __future__ import annotations

from .. import bandwidth
from . import attempted, fail, is_standin, passed, run_ranks, say_not_attempted, standin

WORLD_SIZE = 4
LOCAL = 2                  # ranks per "node"
NUMEL = 4096               # float64: 32 KiB
TIMEOUT_S = 90


def torch_all_reduce(tensor, node_group, cross_group) -> None:
    """The stand-in for an unwritten hierarchical all-reduce: torch's own flat ``dist.all_reduce`` over
    every rank (the same sum; the whole tensor crosses the nodes)."""
    import torch.distributed as dist
    dist.all_reduce(tensor)


def torch_average_gradients(model, mesh) -> None:
    """The stand-in for an unwritten ``my_sync_grads``: torch's own
    ``torch.distributed.algorithms.model_averaging.utils.average_parameters`` on the gradients, over the
    mesh's data-parallel group (one all-reduce of them all, flattened)."""
    from torch.distributed.algorithms.model_averaging.utils import average_parameters
    average_parameters(iter([p.grad for p in model.parameters() if p.grad is not None]), mesh["dp"].get_group())


standin(torch_all_reduce, "torch's flat dist.all_reduce over every rank")
standin(torch_average_gradients, "torch's average_parameters on the gradients")


# ----------------------------------------------------------------------------- exercise 1
def _probe_hierarchical(fn):
    """Call the stub outside any rank: a stub raises NotImplementedError before it touches a group."""
    import torch
    fn(torch.zeros(4), None, None)


def hierarchical_all_reduce(fn, pool=None):
    """Exercise 1: ``fn(tensor, node_group, cross_group)`` sums ``tensor`` over every rank, in place, sending
    only the node's shard across nodes. Returns the function to use from here on: yours once it passes,
    else the stand-in ``torch_all_reduce``."""
    from labutils.labs.lab10_scaling_out import model, verify
    if not attempted(fn, _probe_hierarchical):
        say_not_attempted("my_hierarchical_all_reduce", torch_all_reduce.labutils_standin)
        return torch_all_reduce
    reports = run_ranks(verify.hierarchical, fn, LOCAL, NUMEL, pool=pool, world_size=WORLD_SIZE,
                        timeout_s=TIMEOUT_S, hint="every rank must call the same collectives on the same groups: "
                        "reduce-scatter on node_group, all-reduce on cross_group, all-gather on node_group")
    size = NUMEL * 8
    want = model.hierarchical_bytes(size, LOCAL, WORLD_SIZE // LOCAL)
    for rank, r in enumerate(reports):
        if not r["equal"]:
            fail(f"rank {rank}: the tensor is not the sum over all {WORLD_SIZE} ranks"
                 + (" (it was never written)" if r["untouched"] else ""),
                 "work in place: reduce-scatter into a shard of numel / local elements, all-reduce the shard "
                 "across nodes, then all-gather the shards back into `tensor`")
        if r["other"]:
            fail(f"rank {rank}: {r['other']:,.0f} bytes went over a group that is neither your node nor your "
                 "cross group", "pass group=node_group or group=cross_group to every collective")
        if r["inter"] > want["inter"] * 1.001:
            fail(f"rank {rank}: {r['inter']:,.0f} bytes crossed the node boundary, the hierarchical algorithm "
                 f"sends {want['inter']:,.0f}",
                 "reduce-scatter inside the node first, so that only this rank's 1/local shard crosses nodes "
                 "(an all-reduce inside the node leaves every rank the whole tensor to send)")
        if abs(r["intra"] - want["intra"]) > want["intra"] * 1e-3:
            fail(f"rank {rank}: {r['intra']:,.0f} bytes inside the node, the hierarchical algorithm sends "
                 f"{want['intra']:,.0f}", "one reduce-scatter and one all-gather of the whole tensor inside the node")
    passed(f"hierarchical all-reduce on {WORLD_SIZE} ranks ({WORLD_SIZE // LOCAL} nodes x {LOCAL}): the sum, with "
           f"{want['intra']:,.0f} bytes per rank inside the node and {want['inter']:,.0f} across")
    return fn


# ----------------------------------------------------------------------------- exercise 3
def _probe_sync(fn):
    fn(None, None)


def sync_grads(fn, TensorParallelMLP, pool=None):
    """Exercise 3: ``fn(model, mesh)`` averages the gradients over the mesh's "dp" dimension, so that the 2-D
    mesh's training equals one device's. Returns the function to use from here on: yours once it passes,
    else the stand-in ``torch_average_gradients``."""
    from labutils.labs.lab10_scaling_out import verify
    if not attempted(fn, _probe_sync):
        say_not_attempted("my_sync_grads", torch_average_gradients.labutils_standin)
        return torch_average_gradients
    reports = run_ranks(verify.mesh_training, TensorParallelMLP, fn, pool=pool, world_size=WORLD_SIZE,
                        timeout_s=TIMEOUT_S, hint="every rank must call the same collectives on the same group; "
                        "mesh['dp'].get_group() is the data-parallel group")
    for rank, r in enumerate(reports):
        synced = [g for g in r["groups"] if g["phase"] == "gradient sync"]
        groups = sorted({g["group"] for g in synced})
        if any(g != "dp" for g in groups):
            fail(f"rank {rank}: your sync ran collectives on {', '.join(groups)}",
                 "the tensor-parallel ranks hold different shards of each weight, so nothing is summed over "
                 "'tp'; the data-parallel ranks hold the same shard for different data: all-reduce over "
                 "mesh['dp'].get_group()")
        if not synced:
            fail(f"rank {rank}: your sync issued no collective", "all-reduce each p.grad over mesh['dp'].get_group()")
        sent = sum(g["wire_bytes"] for g in synced)
        want = bandwidth.bus_factor("all_reduce", r["dp"]) * r["shard_bytes"]
        if abs(sent - want) > 1e-6 * want:
            fail(f"rank {rank}: your sync sent {sent:,.0f} bytes per step, an all-reduce of this rank's shards over "
                 f"'dp' sends {want:,.0f}", "all-reduce every parameter's .grad exactly once per step")
        bad = [k for k, ok in r["equal"].items() if not ok]
        if bad:
            fail(f"rank {rank} (dp {r['coordinate']['dp']}, tp {r['coordinate']['tp']}): after training, "
                 f"{', '.join(bad)} differ from one-device training",
                 "average, do not sum: each dp rank's loss is the mean over its half of the batch, so the "
                 "batch's gradient is the mean of theirs (divide by mesh['dp'].size())")
    passed(f"2-D mesh (dp 2 x tp 2) trains like one device on {WORLD_SIZE} ranks: the gradient sync ran on 'dp' "
           f"only, {want:,.0f} bytes per rank per step")
    return fn


# ----------------------------------------------------------------------------- exercise 2
_PREDICTION_CASES = ((2**20, 2, 2), (2**20, 8, 2), (3 * 2**20, 4, 3), (2**20, 1, 4))


def _prediction_hint(size_bytes: int, local: int, nodes: int, got: float) -> str:
    if abs(got - size_bytes) <= 0.01 * size_bytes or abs(got - 2 * (nodes - 1) / nodes * size_bytes) <= 0.01 * size_bytes:
        return ("that is what crosses when the whole tensor is all-reduced across the nodes; the "
                "reduce-scatter inside the node leaves each rank only its 1/local shard to send")
    return ("only this rank's 1/local shard crosses, in a ring all-reduce among the nodes: section 1's ring "
            "model gives what one rank sends for it")


def inter_node_bytes(fn, hierarchical=None, pool=None) -> None:
    """Exercise 2: ``fn(size_bytes, local, nodes)`` predicts the bytes one rank sends across nodes in the
    hierarchical all-reduce of ``size_bytes`` on ``nodes`` x ``local`` ranks. Judged on a few shapes against
    the ring model that exercise 1's checker holds every hierarchical all-reduce to, and, where
    ``hierarchical`` is yours (it passed exercise 1, not a stand-in), against what the ledger counts it
    sending across the 2 "nodes" of 4 gloo ranks (within 1%)."""
    from labutils.labs.lab10_scaling_out import model, verify
    if not attempted(fn, lambda f: f(2**20, 2, 2)):
        say_not_attempted("my_inter_node_bytes")
        return
    for size_bytes, local, nodes in _PREDICTION_CASES:
        got = fn(size_bytes, local, nodes)
        want = model.hierarchical_bytes(size_bytes, local, nodes)["inter"]
        try:
            p = float(got)
        except (TypeError, ValueError):
            fail(f"my_inter_node_bytes({size_bytes}, {local}, {nodes}) returned {got!r}, not a number of bytes",
                 "return a number, e.g. 1_000_000")
        if abs(p - want) > 0.01 * max(want, 1):
            fail(f"for S = {size_bytes:,} bytes on {nodes} nodes x {local} you predicted {p:,.0f} bytes across "
                 f"nodes; the hierarchical algorithm sends {want:,.0f}",
                 _prediction_hint(size_bytes, local, nodes, p))
    cases = f"{len(_PREDICTION_CASES)} shapes, up to {max(c[1] for c in _PREDICTION_CASES)} ranks a node"
    if hierarchical is None or is_standin(hierarchical):
        passed(f"your prediction of the bytes across nodes matches the ring model on {cases} (no all-reduce "
               "of yours passed exercise 1, so the ledger counted none)")
        return
    size_bytes = 2**20
    reports = run_ranks(verify.hierarchical, hierarchical, LOCAL, size_bytes // 8, pool=pool,
                        world_size=WORLD_SIZE, timeout_s=TIMEOUT_S)
    counted = max(r["inter"] for r in reports)
    p = float(fn(size_bytes, LOCAL, WORLD_SIZE // LOCAL))
    if abs(p - counted) > 0.01 * counted:
        fail(f"you predicted {p:,.0f} bytes for 1 MiB on 2 nodes x 2; the ledger counted {counted:,.0f} from your "
             "hierarchical all-reduce", "count only the collectives on cross_group")
    passed(f"your prediction of the bytes across nodes matches the ring model on {cases}, and the ledger: "
           f"{counted:,.0f} bytes per rank across nodes for 1 MiB on 2 nodes x 2 with your all-reduce")
