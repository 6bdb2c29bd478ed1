"""Checkers for lab 09's exercises (all-to-all, expert and sequence parallelism, DTensor).

Each runs the learner's function on 3 gloo ranks (CPU tensors: the same text on every machine) and
prints ``✓ ...`` or raises ``ExerciseError`` with a HINT chosen from the symptom. A stub that raises
NotImplementedError is "not attempted": the checker says so and checks nothing; where later cells need
the result (exercises 3 and 4) it returns a stand-in of its own, named in what it prints.
Pass ``pool=`` a gloo ``labutils.RankPool`` to reuse its ranks (``warm_up(pool)`` does their slow first
imports ahead, while another pool starts); otherwise each check launches 3 ranks.
``sync_sp_grads`` and ``sp_plan`` return the function the rest of the notebook should use: yours once
it passes, else the stand-in.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from . import fail, passed, run_ranks, say_not_attempted, standin

WORLD_SIZE = 3
TIMEOUT_S = 90   # a learner's function that hangs is stopped after this long


def _run(pool, rank_fn, *args) -> list:
    """``rank_fn(rank, world_size, *args)`` on gloo ranks; failures become ExerciseError with a hint."""
    return run_ranks(rank_fn, *args, pool=pool, world_size=pool.world_size if pool is not None else WORLD_SIZE,
                     timeout_s=TIMEOUT_S,
                     hint="run it by hand in a rank function (pool.run) and print the shapes and split sizes",
                     hang_hint="every send needs the matching receive on the peer, and every rank must call the "
                               "same collectives in the same order; post all sends and receives together "
                               "(batch_isend_irecv)")


def _first_call(fn, *args):
    """``(fn(*args), True)``, or ``(None, False)`` when ``fn`` is still a stub."""
    try:
        return fn(*args), True
    except NotImplementedError:
        return None, False


def standin_grad_sync(block, group=None) -> None:
    """The stand-in for an unwritten ``my_sync_sp_grads``: on its first call for a block it finds out which
    gradients to sum by comparing a fingerprint of every parameter across the ranks (one small all-gather),
    remembers them on the block, and all-reduces those gradients -- right, and one collective more than the
    exercise's answer on the first call (its checker rejects it for that)."""
    partial = getattr(block, "labutils_standin_partial", None)
    if partial is None:
        params = [p for p in block.parameters()]
        prints = torch.stack([torch.stack([p.detach().double().sum(), p.detach().double().square().sum()])
                              for p in params])
        everyone = [torch.empty_like(prints) for _ in range(dist.get_world_size(group))]
        dist.all_gather(everyone, prints, group=group)
        same = torch.stack(everyone).eq(prints).all(dim=0).all(dim=1).tolist()
        partial = [i for i, s in enumerate(same) if s]
        block.labutils_standin_partial = partial
    params = list(block.parameters())
    for i in partial:
        if params[i].grad is not None:
            dist.all_reduce(params[i].grad, group=group)


def torch_styles_sp_plan() -> dict:
    """The stand-in for an unwritten ``my_sp_plan``: torch's parallel styles, laid out for a sequence on
    dim 0 at the block's edges."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    seq = Shard(0)
    return dict(norm=SequenceParallel(sequence_dim=0), up=ColwiseParallel(input_layouts=seq),
                down=RowwiseParallel(output_layouts=seq))


standin(standin_grad_sync, "the checker's stand-in gradient sync (labutils.checks.lab09.standin_grad_sync)")
standin(torch_styles_sp_plan, "the checker's plan of torch's parallel styles (torch_styles_sp_plan)")


# ----------------------------------------------------------------------------- set-up
LAZY_MODULES = ("torch._dynamo", "torch.distributed.tensor")


def _import_lazy_modules(rank: int, world_size: int) -> list[str]:
    import importlib
    import sys
    for name in LAZY_MODULES:
        importlib.import_module(name)
    return [name for name in LAZY_MODULES if name in sys.modules]


def warm_up(pool) -> None:
    """Import on ``pool``'s ranks what the checkers need and torch imports only on first use: DTensor
    (exercise 4) and ``torch._dynamo``, which the first TorchDispatchMode (exercise 1's ledger) or DTensor
    operation imports (``torch/_compile.py``) -- seconds per process. Called while another pool is still
    starting (``RankPool(..., wait=False)``), the two waits overlap instead of adding up. Prints nothing.

    Raises:
        ValueError: no pool, or a pool that is not gloo (the checkers run on CPU tensors).
    """
    if pool is None:
        raise ValueError("warm_up needs the pool the checkers will use. HINT: pass the gloo pool, e.g. "
                         "labutils.RankPool(world_size=3, backend='gloo', wait=False).")
    _run(pool, _import_lazy_modules)


# ----------------------------------------------------------------------------- exercise 1
def _a2a_cases(n: int) -> list[tuple[str, list, int]]:
    """(name, input_split_sizes of every rank, row width)."""
    return [("even splits", [[2] * n for _ in range(n)], 1),
            ("uneven splits with empty blocks", [[(r + 2 * j) % 4 for j in range(n)] for r in range(n)], 1),
            ("a rank that sends nothing, rows of 3", [[0] * n] + [[(r + j) % 3 + 1 for j in range(n)]
                                                                  for r in range(1, n)], 3)]


def _a2a_rank(rank: int, world_size: int, fn) -> dict:
    from labutils.instruments.ledger import Ledger
    report = {"attempted": True, "cases": []}
    for name, splits, width in _a2a_cases(world_size):
        ins, outs = splits[rank], [splits[s][rank] for s in range(world_size)]
        x = (torch.arange(sum(ins) * width, dtype=torch.float32) + 100 * rank).reshape(-1, width)
        expected = x.new_empty((sum(outs), width))
        dist.all_to_all_single(expected, x, output_split_sizes=outs, input_split_sizes=ins)
        got = torch.full_like(expected, -1.0)
        with Ledger() as ledger:
            _, attempted = _first_call(fn, got, x, outs, ins, None)
        if not attempted:
            if report["cases"]:
                raise NotImplementedError("your function raised NotImplementedError in a later case")
            return {"attempted": False, "cases": []}
        mine = got.split(outs)[rank]
        sends = [r for r in ledger.records if r.op == "send"]
        report["cases"].append({"name": name, "equal": bool(torch.equal(got, expected)),
                                "untouched": bool((got == -1).all()) and got.numel() > 0,
                                "own_block": bool(torch.equal(mine, expected.split(outs)[rank])),
                                "collectives": sorted({r.op for r in ledger.records} - {"send", "recv"}),
                                "sent_bytes": int(sum(r.wire_bytes for r in sends)),
                                "to_itself": any(r.peer == rank and r.size_bytes for r in sends),
                                "needed_bytes": (sum(ins) - ins[rank]) * width * x.element_size()})
    return report


def all_to_all_p2p(fn, pool=None) -> None:
    """Exercise 1: ``fn(output, input, output_split_sizes, input_split_sizes, group)`` fills ``output``
    like ``dist.all_to_all_single``, built from point-to-point operations."""
    reports = _run(pool, _a2a_rank, fn)
    if not all(r["attempted"] for r in reports):
        say_not_attempted("my_all_to_all_single")
        return
    for rank, r in enumerate(reports):
        for case in r["cases"]:
            if case["collectives"]:
                fail(f"rank {rank}, {case['name']}: your function called a collective "
                     f"({', '.join(case['collectives'])})",
                     "build it from point-to-point operations: dist.P2POp(dist.isend / dist.irecv, tensor, "
                     "peer) for every other rank, all posted with one dist.batch_isend_irecv")
            if case["equal"] and case["sent_bytes"] != case["needed_bytes"]:
                what = (f"rank {rank}, {case['name']}: the output is right, but this rank sent "
                        f"{case['sent_bytes']} bytes where the exchange needs {case['needed_bytes']}")
                if case["to_itself"]:
                    fail(what, "the block for this rank itself is a local copy: output block `rank` = input "
                               "block `rank`, no message to yourself")
                fail(what, "send each peer only its own block (input block j, input_split_sizes[j] rows, to "
                           "rank j): everything to everyone puts (n - 1) times the input on the wire, and the "
                           "receivers throw most of it away")
            if case["equal"]:
                continue
            what = f"rank {rank}, {case['name']}: output differs from dist.all_to_all_single's"
            if case["untouched"]:
                fail(what + " (it was never written)", "write into `output` in place: split it by "
                     "output_split_sizes and receive each block into its slice; wait() on every request")
            if not case["own_block"]:
                fail(what, "the block for this rank itself is a local copy: output block `rank` = input "
                           "block `rank` (no message to yourself)")
            fail(what, "output block i comes from rank i and has output_split_sizes[i] rows; input block j "
                       "goes to rank j and has input_split_sizes[j] rows")
    names = ", ".join(c["name"] for c in reports[0]["cases"])
    passed(f"all_to_all from send/recv equals dist.all_to_all_single on {len(reports)} ranks ({names}); each "
           "rank sent exactly the blocks of its peers")


# ----------------------------------------------------------------------------- exercise 2
def _capacity_cases(rank: int, n: int) -> list[tuple[str, torch.Tensor, int]]:
    gen = torch.Generator().manual_seed(7 + rank)
    return [("random experts, capacity 2", torch.randint(0, n, (7,), generator=gen), 2),
            ("every token to expert 0, capacity 3", torch.zeros(5, dtype=torch.int64), 3),
            ("no tokens on this rank" if rank == 1 else "one token per expert, capacity 1",
             torch.zeros(0, dtype=torch.int64) if rank == 1 else torch.arange(n), 1)]


def _expected_dispatch(rank: int, world_size: int, x, dest, capacity: int):
    """What Switch dispatch must give, from every rank's tokens (gathered as objects): (received, kept)."""
    everyone = [None] * world_size
    dist.all_gather_object(everyone, (x, dest))
    seen = [0] * world_size
    kept = torch.zeros(dest.numel(), dtype=torch.bool)
    for i, d in enumerate(dest.tolist()):
        kept[i], seen[d] = seen[d] < capacity, seen[d] + 1
    slots = []
    for xs, ds in everyone:
        rows = xs[ds == rank][:capacity]
        slots.append(torch.cat([rows, rows.new_zeros((capacity - rows.shape[0],) + tuple(xs.shape[1:]))]))
    return torch.cat(slots), kept


def _capacity_rank(rank: int, world_size: int, fn) -> dict:
    report = {"attempted": True, "cases": []}
    for name, dest, capacity in _capacity_cases(rank, world_size):
        x = torch.arange(dest.numel() * 4, dtype=torch.float32).reshape(-1, 4) + 100 * (rank + 1)
        want, want_kept = _expected_dispatch(rank, world_size, x, dest, capacity)
        from labutils.instruments.ledger import Ledger
        with Ledger() as ledger:
            got, attempted = _first_call(fn, x, dest, capacity, None)
        if not attempted:
            if report["cases"]:
                raise NotImplementedError("your function raised NotImplementedError in a later case")
            return {"attempted": False, "cases": []}
        case = {"name": name, "pair": isinstance(got, (tuple, list)) and len(got) == 2,
                "calls": ledger.counts(),
                "sent_bytes": int(ledger.wire_bytes_per_rank()),
                "needed_bytes": (world_size - 1) * capacity * math.prod(x.shape[1:]) * x.element_size()}
        if case["pair"]:
            received, kept = got
            case["shape"] = list(getattr(received, "shape", []))
            case["expected_shape"] = list(want.shape)
            case["kept"] = isinstance(kept, torch.Tensor) and kept.shape == want_kept.shape and \
                bool(torch.equal(kept.bool(), want_kept))
            case["equal"] = case["shape"] == case["expected_shape"] and bool(torch.equal(received, want))
        report["cases"].append(case)
    return report


def dispatch_with_capacity(fn, pool=None) -> None:
    """Exercise 2: ``fn(x, dest, capacity, group) -> (received, kept)``, Switch-style dispatch."""
    reports = _run(pool, _capacity_rank, fn)
    if not all(r["attempted"] for r in reports):
        say_not_attempted("my_dispatch_with_capacity")
        return
    for rank, r in enumerate(reports):
        for case in r["cases"]:
            what = f"rank {rank}, {case['name']}"
            if not case["pair"]:
                fail(f"{what}: expected a pair (received, kept)", "return received, kept")
            if case["shape"] != case["expected_shape"]:
                fail(f"{what}: received has shape {case['shape']}, expected {case['expected_shape']}",
                     "every rank sends every expert one slot of `capacity` rows, so it receives one slot "
                     "from every rank: (world_size * capacity, hidden)")
            if not case["kept"]:
                fail(f"{what}: `kept` is wrong", "a token is kept when it is among the first `capacity` "
                     "tokens (in token order) that this rank sends to its expert; kept has one entry per token")
            if not case["equal"]:
                fail(f"{what}: received holds the wrong rows", "slot d of the send buffer holds, in token "
                     "order, the kept tokens for expert d, then zeros; one even all_to_all_single moves "
                     "slot d to rank d")
            calls = ", ".join(f"{n} {op}" for op, n in case["calls"].items()) or "nothing"
            if case["calls"] != {"all_to_all": 1} or case["sent_bytes"] != case["needed_bytes"]:
                fail(f"{what}: the rows are right, but this rank issued {calls} and sent {case['sent_bytes']} "
                     f"bytes; a capacity dispatch needs one all_to_all that sends {case['needed_bytes']}",
                     "with a capacity every slot's size is known before anything is sent: no counts to "
                     "exchange, no wait for them -- one even all_to_all_single of world_size * capacity rows")
    passed(f"dispatch_with_capacity matches Switch dispatch on {len(reports)} ranks "
           "(overflowing experts, a rank without tokens, padding), with one even all_to_all and no counts exchanged")


# ----------------------------------------------------------------------------- exercise 3
def _status(got, expected, before, n: int) -> str:
    from labutils.instruments.compare import close
    if close(got, expected):
        return "ok"
    if close(got, before):
        return "unchanged"
    if close(got, expected / n):
        return "averaged"
    return "wrong"


def _sync_rank(rank: int, world_size: int, fn, Block, ParallelBlock) -> dict:
    from labutils.labs.lab09_all_to_all import verify
    ref, x, dy = verify.block_problem(world_size, Block, 3, torch.device("cpu"))
    verify.reference_grads(ref, x, dy)
    block = ParallelBlock(ref, None, sequence_parallel=True)
    block(x.chunk(world_size)[rank].clone().requires_grad_()).backward(dy.chunk(world_size)[rank])
    from labutils import bandwidth
    from labutils.instruments.ledger import Ledger
    before = {k: p.grad.clone() for k, p in block.named_parameters()}
    expected = verify.expected_grads(ref, rank, world_size)
    with Ledger() as ledger:
        _, attempted = _first_call(fn, block, None)
    if not attempted:
        return {"attempted": False, "status": {}}
    grads = dict(block.named_parameters())
    partial = sum(g.numel() * g.element_size() for k, g in before.items()
                  if not _close(g, expected[k]))            # what the sync must sum: the partial gradients
    return {"attempted": True, "status": {k: _status(grads[k].grad, e, before[k], world_size)
                                          for k, e in expected.items()},
            "calls": ledger.counts(), "sent_bytes": ledger.wire_bytes_per_rank(),
            "needed_bytes": bandwidth.bus_factor("all_reduce", world_size) * partial}


def _close(a, b) -> bool:
    from labutils.instruments.compare import close
    return bool(close(a, b))


def sync_sp_grads(fn, Block, ParallelBlock, pool=None):
    """Exercise 3: ``fn(block, group)`` after an SP backward leaves every gradient equal to the one-device
    block's. Returns the function to use from here on (yours, or the stand-in if not attempted)."""
    reports = _run(pool, _sync_rank, fn, Block, ParallelBlock)
    if not all(r["attempted"] for r in reports):
        say_not_attempted("my_sync_sp_grads", standin_grad_sync.labutils_standin)
        return standin_grad_sync
    for rank, r in enumerate(reports):
        bad = {k: s for k, s in r["status"].items() if s != "ok"}
        if not bad:
            continue
        what = f"rank {rank}: wrong gradient of " + ", ".join(f"{k} ({s})" for k, s in bad.items())
        sharded = [k for k in bad if k.startswith(("up.", "down."))]
        if sharded:
            fail(what, "leave the column and row shards alone: each rank already holds the full gradient "
                       "of its own shard")
        if "averaged" in bad.values():
            fail(what, "sum, do not average: the loss adds up every token, and each rank holds the gradient "
                       "of its own tokens' share")
        if bad.get("down_bias") == "unchanged" and len(bad) == 1:
            fail(what, "down_bias is added after the reduce-scatter, on this rank's slice of the sequence: "
                       "it needs the sum over ranks too")
        fail(what, "the LayerNorm saw only this rank's tokens, so its parameters hold partial gradients: "
                   "all-reduce (sum) the .grad of every parameter used on sequence shards")
    for rank, r in enumerate(reports):
        if r["sent_bytes"] > r["needed_bytes"] * (1 + 1e-9):
            calls = ", ".join(f"{n} {op}" for op, n in r["calls"].items())
            fail(f"rank {rank}: every gradient is right, but your sync sent {r['sent_bytes']:.0f} bytes ({calls}); "
                 f"summing the partial gradients takes {r['needed_bytes']:.0f} (a ring all-reduce of them, "
                 "2(n-1)/n of their bytes)",
                 "which gradients are partial follows from where each parameter runs (on sequence shards or "
                 "not): nothing to find out by communicating, and the sharded gradients need nothing at all")
    passed(f"after your sync, every gradient of the SP block equals the one-device block's on {len(reports)} "
           "ranks, for the bytes of an all-reduce of the partial gradients alone")
    return fn


# ----------------------------------------------------------------------------- exercise 4
def _plan_hint(plan) -> str:
    """The first thing wrong with a plan, read from its styles' settings."""
    from torch.distributed.tensor import Shard
    if not isinstance(plan, dict):
        return "return a dict {submodule name: parallel style}, as parallelize_module takes"
    norm, up, down = plan.get("norm"), plan.get("up"), plan.get("down")
    if norm is None:
        return ("the LayerNorm runs on sequence shards too: give `norm` a SequenceParallel style, so that its "
                "parameters become DTensors and their partial gradients are summed")
    if getattr(norm, "sequence_sharding", (Shard(0),)) != (Shard(0),):
        return "SequenceParallel shards dim 1 by default (batch first); here the sequence is dim 0"
    if up is None or down is None:
        return "`up` is column-parallel and `down` row-parallel, as in the TP plan"
    if tuple(getattr(down, "output_layouts", ())) != (Shard(0),):
        return ("RowwiseParallel all-reduces into a replicated output by default; ask for sequence shards "
                "(output_layouts=Shard(0)), so that it reduce-scatters")
    return ("compare with the TP plan: only the layouts where the two regions meet change, and the block's "
            "input and output are sequence shards (Shard(0)) -- see ColwiseParallel's input_layouts")


def _plan_rank(rank: int, world_size: int, fn, Block, ParallelBlock) -> dict:
    from labutils.labs.lab09_all_to_all import verify
    plan, attempted = _first_call(fn)
    if not attempted:
        return {"attempted": False}
    report = {"attempted": True, "hint": _plan_hint(plan)}
    try:
        result = verify.dtensor_matches(rank, world_size, Block, ParallelBlock, lambda: plan,
                                        sequence_parallel=True)
        report["bad"] = [k for k, v in result.items() if v is False]
        if not report["bad"]:
            report["traffic"] = _traffic_difference(rank, world_size, Block, ParallelBlock, plan)
    except Exception as exc:  # noqa: BLE001 - any failure of the learner's plan becomes a hint
        report["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return report


def _traffic_difference(rank: int, world_size: int, Block, ParallelBlock, plan) -> list[str]:
    """What the plan's forward and backward send (``Ledger``: calls and wire bytes per phase and op) where it
    differs from the hand-written SP block's; empty when they agree."""
    from labutils.labs.lab09_all_to_all import verify
    rows = verify.traffic(rank, world_size, Block, ParallelBlock, plans={"yours": (lambda: plan, True)})
    count = {}
    for r in rows:
        if r["phase"] != "gradient sync" and r["layer"] in ("SP", "yours"):
            calls, sent = count.get((r["layer"], r["phase"], r["op"]), (0, 0.0))
            count[(r["layer"], r["phase"], r["op"])] = (calls + r["calls"], sent + r["wire_bytes"])
    keys = sorted({k[1:] for k in count})
    return [f"{phase} {op}: yours {count.get(('yours', phase, op), (0, 0))[0]} call(s), "
            f"{count.get(('yours', phase, op), (0, 0.0))[1]:.0f} bytes; SP {count.get(('SP', phase, op), (0, 0))[0]}, "
            f"{count.get(('SP', phase, op), (0, 0.0))[1]:.0f} bytes"
            for phase, op in keys
            if abs(count.get(("yours", phase, op), (0, 0.0))[1] - count.get(("SP", phase, op), (0, 0.0))[1]) > 0.5
            or count.get(("yours", phase, op), (0,))[0] != count.get(("SP", phase, op), (0,))[0]]


def sp_plan(fn, Block, ParallelBlock, pool=None):
    """Exercise 4: ``fn() -> plan`` makes ``parallelize_module(Block, mesh, plan)`` the SP block: input
    and output are sequence shards, outputs and gradients equal the one-device block's. Returns the plan
    function to use from here on (yours, or the stand-in if not attempted)."""
    reports = _run(pool, _plan_rank, fn, Block, ParallelBlock)
    if not all(r["attempted"] for r in reports):
        say_not_attempted("my_sp_plan", torch_styles_sp_plan.labutils_standin)
        return torch_styles_sp_plan
    for rank, r in enumerate(reports):
        if "error" in r:
            fail(f"rank {rank}: the parallelized block failed: {r['error']}", r["hint"])
        if r["bad"]:
            fail(f"rank {rank}: differs from the one-device block: {', '.join(r['bad'])}", r["hint"])
        if r["traffic"]:
            fail(f"rank {rank}: outputs and gradients are right, but the plan communicates differently from "
                 f"sequence parallelism: {'; '.join(r['traffic'])}",
                 "between `up` and `down` the activations stay split by features, as in TP (ColwiseParallel's "
                 "output and RowwiseParallel's input keep their defaults); only the block's edges change: "
                 "one all-gather into `up`, one reduce-scatter out of `down`")
    passed(f"your plan turns Block into sequence parallelism: outputs and gradients equal on {len(reports)} ranks, "
           "and it sends what the hand-written SP block sends")
    return fn
