"""Lab 09's correctness harness: the notebook's parallel layers against the same layer on one device.

Every function here is a rank function (``pool.run(fn, ...)`` / ``labutils.launch(fn, ...)``) that takes
the notebook's classes as arguments, so what is checked is exactly the code the learner reads. Each builds
the one-device reference from a seed (identical on every rank), runs the parallel version on this rank's
share, compares output and every gradient with ``torch.testing.assert_close`` in float64, and returns
``{check: True/False}``; ``table(reports)`` turns the ranks' reports into a DataFrame.

    reports = pool.run(verify.moe_matches, MoE, ExpertParallelMoE)
    verify.table(reports)

Expected interfaces (the notebook's):
* ``MoE(hidden, ffn, n_experts, top_k)`` with ``.router`` (nn.Linear), ``.experts`` (ModuleList);
  ``ExpertParallelMoE(moe, group)`` with ``.router`` and ``.expert`` (this rank's expert).
* ``Block(hidden, ffn, dropout)`` with ``.norm``, ``.up``, ``.down``; ``ParallelBlock(block, group,
  sequence_parallel)`` with ``.norm``, ``.up`` (column shard), ``.down`` (row shard, no bias), ``.down_bias``.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from ...config import rank_device
from ...instruments.compare import close
from ...instruments.ledger import Ledger

from .wire import SavedTensors, dropout_mask_bytes, saved_bytes_predicted

DTYPE = torch.float64  # rounding cannot hide a bug, and NCCL and gloo both move float64


def _inputs(shape, seed: int, device):
    """``x`` and the output gradient ``dy`` of the whole problem, identical on every rank."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen, dtype=DTYPE)
    dy = torch.randn(*shape, generator=gen, dtype=DTYPE)
    return x.to(device), dy.to(device)


def _seeded(make, seed: int, device, dtype=DTYPE):
    """Build a module from ``make()`` with the CPU RNG at ``seed`` (same weights everywhere)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        module = make()
    return module.to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------------- experts
def moe_matches(rank: int, world_size: int, MoE, ExpertParallelMoE, *, top_k: int = 1,
                tokens_per_rank: int = 12, hidden: int = 8, ffn: int = 16, seed: int = 0,
                router_bias: float = 0.0) -> dict:
    """One expert per rank vs the MoE on one device over every rank's tokens.

    Rank r holds tokens ``r * tokens_per_rank ...`` of the whole batch. The router is replicated, so
    its gradient is summed over ranks here (data parallelism would do it); expert r's gradient lives
    on rank r only. ``router_bias`` is added to expert 0's logit (a skewed router).
    """
    device = rank_device()
    ref = _seeded(lambda: MoE(hidden, ffn, world_size, top_k), seed, device)
    with torch.no_grad():
        ref.router.bias[0] += router_bias
    ep = ExpertParallelMoE(ref, None)
    x_all, dy_all = _inputs((world_size * tokens_per_rank, hidden), seed + 1, device)
    x_ref = x_all.clone().requires_grad_()
    ref(x_ref).backward(dy_all)
    x = x_all.chunk(world_size)[rank].clone().requires_grad_()
    y = ep(x)
    y.backward(dy_all.chunk(world_size)[rank])
    for p in ep.router.parameters():
        dist.all_reduce(p.grad)
    with torch.no_grad():
        y_ref = ref(x_all).chunk(world_size)[rank]
    return {"output": close(y, y_ref), "grad of the input": close(x.grad, x_ref.grad.chunk(world_size)[rank]),
            "grad of the router (summed over ranks)": all(
                close(p.grad, q.grad) for p, q in zip(ep.router.parameters(), ref.router.parameters())),
            "grad of this rank's expert": all(
                close(p.grad, q.grad) for p, q in zip(ep.expert.parameters(), ref.experts[rank].parameters()))}


# ----------------------------------------------------------------------------------- blocks
BLOCK_SHAPE = {"seq_per_rank": 3, "batch": 2, "hidden": 8, "ffn_per_rank": 8}


def block_problem(world_size: int, Block, seed: int, device, shape: dict | None = None):
    """The one-device ``Block`` (dropout 0), the whole input ``x`` (sequence, batch, hidden) and ``dy``."""
    s = dict(BLOCK_SHAPE, **(shape or {}))
    seq, hidden, ffn = s["seq_per_rank"] * world_size, s["hidden"], s["ffn_per_rank"] * world_size
    ref = _seeded(lambda: Block(hidden, ffn, 0.0), seed, device)
    x, dy = _inputs((seq, s["batch"], hidden), seed + 1, device)
    return ref, x, dy


def reference_grads(ref, x, dy):
    """Output and input gradient of the one-device block; its parameters' ``.grad`` are filled."""
    xr = x.clone().requires_grad_()
    y = ref(xr)
    y.backward(dy)
    return y.detach(), xr.grad


def expected_grads(ref, rank: int, n: int) -> dict:
    """Where each ParallelBlock parameter's gradient comes from in the one-device Block."""
    return {"norm.weight": ref.norm.weight.grad, "norm.bias": ref.norm.bias.grad,
            "up.weight": ref.up.weight.grad.chunk(n, 0)[rank], "up.bias": ref.up.bias.grad.chunk(n, 0)[rank],
            "down.weight": ref.down.weight.grad.chunk(n, 1)[rank], "down_bias": ref.down.bias.grad}


def block_matches(rank: int, world_size: int, Block, ParallelBlock, *, sequence_parallel: bool,
                  sync=None, seed: int = 0, shape: dict | None = None) -> dict:
    """``ParallelBlock`` (TP, or SP with ``sequence_parallel``) vs ``Block`` on one device.

    Under SP this rank gets, and returns, its slice of the sequence (dim 0). ``sync(block, group)``, if
    given, runs after backward (SP's gradient all-reduce). Dropout is 0 here: equal outputs need equal
    masks, and each rank draws its own.
    """
    device = rank_device()
    ref, x, dy = block_problem(world_size, Block, seed, device, shape)
    y_ref, dx_ref = reference_grads(ref, x, dy)
    par = ParallelBlock(ref, None, sequence_parallel=sequence_parallel)
    mine = (lambda t: t.chunk(world_size)[rank]) if sequence_parallel else (lambda t: t)
    xs = mine(x).clone().requires_grad_()
    y = par(xs)
    y.backward(mine(dy))
    if sync is not None:
        sync(par, None)
    grads = dict(par.named_parameters())
    report = {"output": close(y, mine(y_ref)), "grad of the input": close(xs.grad, mine(dx_ref))}
    for name, expected in expected_grads(ref, rank, world_size).items():
        report[f"grad of {name}"] = close(grads[name].grad, expected)
    return report


def traffic(rank: int, world_size: int, Block, ParallelBlock, *, sync=None, plans: dict | None = None,
            seed: int = 0, shape: dict | None = None) -> list[dict]:
    """Collectives of one forward and one backward pass of each variant, counted by ``instruments.ledger.Ledger``.

    Variants: ``"TP"`` and ``"SP"`` (hand-written; SP followed by ``sync``), and one per entry of
    ``plans``: ``{"DTensor TP": (plan_fn, sequence_parallel), ...}`` with ``plan_fn()`` returning a
    ``parallelize_module`` plan.
    Returns rows ``{"layer", "phase", "op", "calls", "size_bytes", "wire_bytes"}``; phases are
    ``"forward"``, ``"backward"`` and ``"gradient sync"`` (what ``sync`` sends).
    """
    device = rank_device()
    ref, x, dy = block_problem(world_size, Block, seed, device, shape)
    rows = []
    variants = {"TP": (lambda: ParallelBlock(ref, None, sequence_parallel=False), False, None),
                "SP": (lambda: ParallelBlock(ref, None, sequence_parallel=True), True, sync)}
    for name, (plan_fn, sp) in (plans or {}).items():
        variants[name] = (lambda plan_fn=plan_fn: _parallelize(ref, plan_fn()), sp, None)
    for layer, (build, sp, after) in variants.items():
        block = build()
        xs = x.chunk(world_size)[rank] if sp else x
        with Ledger("forward") as fwd:
            y = block(xs.clone().requires_grad_())
        with Ledger("backward") as bwd:
            y.backward(dy.chunk(world_size)[rank] if sp else dy)
        with Ledger("gradient sync") as grads:
            if after is not None:
                after(block, None)
        rows += [dict(r, layer=layer) for r in fwd.summary() + bwd.summary() + grads.summary()]
    return rows


def saved_activations(rank: int, world_size: int, Block, ParallelBlock, *, tokens_per_rank: int = 32,
                      hidden: int = 64, ffn_per_rank: int = 64, dropout: float = 0.1, seed: int = 0) -> dict:
    """Bytes autograd keeps for backward after one forward of the TP and of the SP block (float32, dropout
    on), counted with ``SavedTensors`` and predicted from the shapes by ``saved_bytes_predicted``."""
    device, n = rank_device(), world_size
    tokens, ffn = tokens_per_rank * n, ffn_per_rank * n
    ref = _seeded(lambda: Block(hidden, ffn, dropout), seed, device, torch.float32)
    x = torch.randn(tokens, 1, hidden, generator=torch.Generator().manual_seed(seed + 1)).to(device)
    out = {}
    for name, sp in (("TP", False), ("SP", True)):
        block = ParallelBlock(ref, None, sequence_parallel=sp)
        xs = (x.chunk(n)[rank] if sp else x).clone().requires_grad_()
        with SavedTensors(exclude=block.parameters()) as saved:
            block(xs)
        predicted = saved_bytes_predicted(tokens, hidden, ffn, n, itemsize=4, sequence_parallel=sp,
                                          mask_bytes=dropout_mask_bytes(device.type, 4) if dropout else 0)
        out[name] = {"counted": saved.nbytes, "predicted": predicted["total"], "tensors": saved.tensors}
    return out


# ----------------------------------------------------------------------------------- DTensor
def _parallelize(block, plan):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    return parallelize_module(copy.deepcopy(block), mesh, plan)


def _full(t):
    """A DTensor gradient as the full tensor (a ``Partial`` one is summed over ranks here)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def dtensor_matches(rank: int, world_size: int, Block, ParallelBlock, plan_fn, *, sequence_parallel: bool,
                    sync=None, seed: int = 0, shape: dict | None = None) -> dict:
    """``parallelize_module(Block, mesh, plan_fn())`` vs the hand-written ``ParallelBlock`` and ``Block``.

    Returns ``{check: bool}`` plus ``"placements"``: each parameter gradient's DTensor placement.
    """
    device = rank_device()
    ref, x, dy = block_problem(world_size, Block, seed, device, shape)
    y_ref, dx_ref = reference_grads(ref, x, dy)
    mine = (lambda t: t.chunk(world_size)[rank]) if sequence_parallel else (lambda t: t)
    hand = ParallelBlock(ref, None, sequence_parallel=sequence_parallel)
    y_hand = hand(mine(x))
    dt = _parallelize(ref, plan_fn())
    xs = mine(x).clone().requires_grad_()
    y = dt(xs)
    y = y.to_local() if hasattr(y, "to_local") else y
    y.backward(mine(dy))
    report = {"output == hand-written output": close(y, y_hand),
              "output == one device": close(y, mine(y_ref)), "grad of the input": close(xs.grad, mine(dx_ref))}
    placements = {}
    for (name, p), (_, q) in zip(dt.named_parameters(), ref.named_parameters()):
        placements[name] = str(tuple(getattr(p.grad, "placements", ("plain tensor",))))
        report[f"grad of {name}"] = close(_full(p.grad), q.grad)
    return dict(report, placements=placements)


def dtensor_step_sums_like_hand_written(rank: int, world_size: int, Block, ParallelBlock, plan_fn, sync, *,
                                        seed: int = 0, shape: dict | None = None) -> dict:
    """The SP steps that ``measure.block_sweep`` times end with the same gradients: the hand-written
    ``ParallelBlock`` after ``sync`` (exercise 3), and ``parallelize_module(Block, plan_fn())`` after
    ``measure.reduce_partial_grads``. Compares this rank's local gradients, no collective added.

    Returns ``{"before": {name: bool}, "after": {name: bool}, "placements": {name: str}}``: each
    parameter's local gradient equal to the hand-written one before and after the sum, and its DTensor
    placement after.
    """
    from .measure import reduce_partial_grads
    device = rank_device()
    ref, x, dy = block_problem(world_size, Block, seed, device, shape)
    mine = lambda t: t.chunk(world_size)[rank]  # noqa: E731 - this rank's slice of the sequence
    hand = ParallelBlock(ref, None, sequence_parallel=True)
    hand(mine(x).clone().requires_grad_()).backward(mine(dy))
    sync(hand, None)
    expected = {("down.bias" if name == "down_bias" else name): p.grad for name, p in hand.named_parameters()}
    dt = _parallelize(ref, plan_fn())
    y = dt(mine(x).clone().requires_grad_())
    (y.to_local() if hasattr(y, "to_local") else y).backward(mine(dy))

    def equal() -> dict:
        return {name: close(getattr(p.grad, "to_local", lambda: p.grad)(), expected[name])
                for name, p in dt.named_parameters()}
    before = equal()
    reduce_partial_grads(dt)
    return {"before": before, "after": equal(),
            "placements": {name: str(tuple(getattr(p.grad, "placements", ("plain tensor",))))
                           for name, p in dt.named_parameters()}}


# ----------------------------------------------------------------------------------- reports
def table(reports: list[dict]):
    """Per check: True when every rank's check passed, and the ranks where it did not."""
    import pandas as pd
    checks = [k for k, v in reports[0].items() if isinstance(v, bool)]
    rows = [{"check": c, "every rank": all(r[c] for r in reports),
             "ranks that differ": ", ".join(str(i) for i, r in enumerate(reports) if not r[c]) or "-"}
            for c in checks]
    return pd.DataFrame(rows).set_index("check")
