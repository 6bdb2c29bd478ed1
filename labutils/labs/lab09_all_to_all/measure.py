"""Lab 09's measurements: rank functions that sweep inside one call (``pool.run(fn, ...)[0]``).

They take the notebook's own code (``dispatch``, ``MoE``, ``ExpertParallelMoE``, ``Block``,
``ParallelBlock``, the DTensor plans) as arguments, time it with ``timing.benchmark_collective``
(back-to-back calls between CUDA events, the median of several samples, the slowest rank -- nccl-tests'
``-a 3``; nccl-tests itself reads a host clock and reports the mean over ranks by default) and return
JSON-able dicts for ``recorded.live_or_recorded``. They run on NCCL (the recordings) and on gloo
(the tests, with tiny sizes).

    data = pool.run(measure.collective_sweep, bandwidth.size_sweep(2**10, 2**28, 4))[0]
"""
from __future__ import annotations

import copy
import functools

import torch
import torch.distributed as dist

from ... import bandwidth, compat, timing
from ...instruments import memory
from ...config import rank_device
from .wire import SavedTensors, dropout_mask_bytes, saved_bytes_predicted

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
           "float64": torch.float64}


def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"unknown dtype {name!r}. HINT: one of {', '.join(_DTYPES)}.")
    return _DTYPES[name]


def _seeded(make, seed: int, device: torch.device):
    """``make()`` with its parameters created on ``device`` from ``seed`` (every rank starts its generator of
    that device from the seed, so the ranks agree), without filling a CPU copy first: a large layer's
    initialisation and copy cost seconds on the CPU."""
    cuda = [torch.cuda.current_device() if device.index is None else device.index] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), torch.device(device):
        torch.manual_seed(seed)
        return make()


def _generator(seed: int, device: torch.device) -> torch.Generator:
    """A generator on ``device``: inputs are drawn where they are used, not filled on the CPU and copied."""
    return torch.Generator(device=device).manual_seed(seed)


# ------------------------------------------------------------------------------ part 1
def collective_sweep(rank: int, world_size: int, sizes_bytes, *, dtype: str = "bfloat16",
                     warmup: int = 5, iters: int = 20, repeat: int = 5) -> dict:
    """``all_to_all_single`` (even splits) and ``all_gather_into_tensor`` over message sizes.

    S is nccl-tests' size for both (all-to-all: the per-rank send buffer; all-gather: the gathered
    output), so both busbw use the factor (n-1)/n and count the bytes that cross one link. After each
    timing the result is checked (rank j's block must hold j's values): ``wrong`` counts failures.
    """
    device, dt = rank_device(), _dtype(dtype)
    item, n = dt.itemsize, world_size
    ops = {"all_to_all_single": {}, "all_gather_into_tensor": {}}
    for v in ops.values():
        v.update(time_ms=[], algbw_gbps=[], busbw_gbps=[])
    sizes, wrong = [], 0
    for size in sizes_bytes:
        count = max(n, size // item // n * n)                    # elements, a multiple of n
        send = torch.full((count,), float(rank), dtype=dt, device=device)
        recv = torch.empty_like(send)
        part = send[: count // n]
        sizes.append(count * item)
        for op, call in (("all_to_all_single", lambda: dist.all_to_all_single(recv, send)),
                         ("all_gather_into_tensor", lambda: compat.all_gather_into_tensor(recv, part))):
            t = timing.benchmark_collective(call, warmup=warmup, iters=iters, repeat=repeat)
            expected = torch.arange(n, device=device, dtype=dt).repeat_interleave(count // n)
            wrong += int(not torch.equal(recv, expected))
            ops[op]["time_ms"].append(t.median_ms)
            ops[op]["algbw_gbps"].append(bandwidth.algbw_gbps(count * item, t.median_ms))
            ops[op]["busbw_gbps"].append(bandwidth.busbw_gbps(op, count * item, t.median_ms, n))
    total_wrong = torch.tensor([wrong], device=device)
    dist.all_reduce(total_wrong)
    return {"world_size": n, "dtype": dtype, "size_bytes": sizes, "ops": ops, "wrong": int(total_wrong.item())}


# ------------------------------------------------------------------------------ part 2
def _count_matrix(dest: torch.Tensor, n: int) -> torch.Tensor:
    """``m[s, d]`` = rows rank s sends to rank d, on every rank (an all-gather of the counts)."""
    mine = torch.zeros(n, dtype=torch.long, device=dest.device).index_add_(0, dest, torch.ones_like(dest))
    out = torch.empty(n * n, dtype=mine.dtype, device=mine.device)
    compat.all_gather_into_tensor(out, mine)
    return out.view(n, n).cpu()


def busiest_bytes(matrix: torch.Tensor, row_bytes: int) -> int:
    """Bytes on the busiest rank's link: max over ranks of what it sends to, or receives from, others."""
    off = matrix.clone()
    off.fill_diagonal_(0)
    return int(max(off.sum(1).max().item(), off.sum(0).max().item()) * row_bytes)


def dispatch_sweep(rank: int, world_size: int, dispatch, tokens_list, *, hidden: int = 2048,
                   dtype: str = "bfloat16", warmup: int = 3, iters: int = 10, repeat: int = 5,
                   seed: int = 0) -> dict:
    """Time ``dispatch(rows, dest, group)`` (counts exchanged, then rows) over token counts, routing
    uniform at random; and the rows' ``all_to_all_single`` alone, with the counts already known. The two
    take turns sample by sample (``timing.benchmark_loops``), so a drift of the machine hits both alike."""
    device, dt, n = rank_device(), _dtype(dtype), world_size
    out = {"world_size": n, "hidden": hidden, "dtype": dtype, "tokens": [], "size_bytes": [],
           "dispatch_ms": [], "rows_only_ms": [], "busiest_bytes": []}
    for tokens in tokens_list:
        gen = _generator(seed + 1000 * rank + tokens, device)          # each rank its own tokens
        x = torch.randn(tokens, hidden, generator=gen, device=device, dtype=dt)
        dest = torch.randint(0, n, (tokens,), generator=gen, device=device)
        matrix = _count_matrix(dest, n)
        send, recv = matrix[rank].tolist(), matrix[:, rank].tolist()
        rows = x[torch.argsort(dest, stable=True)]
        got = rows.new_empty((sum(recv), hidden))
        t = timing.benchmark_loops(
            {"dispatch": timing.repeated(lambda: dispatch(x, dest, None)),
             "rows only": timing.repeated(lambda: dist.all_to_all_single(got, rows, output_split_sizes=recv,
                                                               input_split_sizes=send))},
            warmup=warmup, iters=iters, repeat=repeat)
        out["tokens"].append(tokens)
        out["size_bytes"].append(tokens * hidden * dt.itemsize)
        out["dispatch_ms"].append(t["dispatch"].median_ms)
        out["rows_only_ms"].append(t["rows only"].median_ms)
        out["busiest_bytes"].append(busiest_bytes(matrix, hidden * dt.itemsize))
    return out


def skew_sweep(rank: int, world_size: int, MoE, ExpertParallelMoE, dispatch, router_biases, *,
               tokens: int = 65536, hidden: int = 2048, ffn: int = 8192, dtype: str = "bfloat16",
               warmup: int = 3, iters: int = 10, repeat: int = 5, layer_warmup: int = 1, layer_iters: int = 2,
               seed: int = 0) -> dict:
    """A top-1 MoE layer, one expert per rank, whose router favours expert 0 by ``bias`` (added to its
    logit). Per bias: the share of tokens expert 0 gets, the busiest link's bytes, the most rows any
    expert computes, and the times of the dispatch alone and of the whole layer's forward (median, p10 and
    p90 of the samples: the spread says how large a difference between two biases the noise can fake).
    The biases take turns sample by sample (``timing.benchmark_loops``); the layer, whose call is long,
    with fewer calls per sample (``layer_warmup``, ``layer_iters``)."""
    device, dt, n = rank_device(), _dtype(dtype), world_size
    ref = _seeded(lambda: MoE(hidden, ffn, n, 1), seed, device).to(dt)
    x = torch.randn(tokens, hidden, generator=_generator(seed + 1 + rank, device), device=device, dtype=dt)
    out = {"world_size": n, "tokens": tokens, "hidden": hidden, "ffn": ffn, "dtype": dtype,
           "router_bias": [], "hot_share": [], "busiest_bytes": [], "max_expert_rows": [],
           "dispatch_ms": [], "dispatch_p10_ms": [], "dispatch_p90_ms": [],
           "layer_ms": [], "layer_p10_ms": [], "layer_p90_ms": []}
    layers, dests = [], []
    with torch.no_grad():
        for bias in router_biases:
            layer = ExpertParallelMoE(ref, None)          # its own copy of the router and of this rank's expert
            layer.router.bias[0] += bias
            _, expert = layer.route(x)
            layers.append(layer)
            dests.append(expert.flatten())
        t_dispatch = timing.benchmark_loops(
            {i: timing.repeated(lambda d=d: dispatch(x, d, None)) for i, d in enumerate(dests)},
            warmup=warmup, iters=iters, repeat=repeat)
        t_layer = timing.benchmark_loops({i: timing.repeated(lambda m=m: m(x)) for i, m in enumerate(layers)},
                                         warmup=layer_warmup, iters=layer_iters, repeat=repeat)
    for i, bias in enumerate(router_biases):
        matrix = _count_matrix(dests[i], n)
        out["router_bias"].append(float(bias))
        out["hot_share"].append(matrix[:, 0].sum().item() / matrix.sum().item())
        out["busiest_bytes"].append(busiest_bytes(matrix, hidden * dt.itemsize))
        out["max_expert_rows"].append(int(matrix.sum(0).max().item()))
        for key, t in (("dispatch", t_dispatch[i]), ("layer", t_layer[i])):
            out[f"{key}_ms"].append(t.median_ms)
            out[f"{key}_p10_ms"].append(t.p10_ms)
            out[f"{key}_p90_ms"].append(t.p90_ms)
    return out


# ------------------------------------------------------------------------------ parts 3 and 4
def _build(ParallelBlock, ref, spec: dict):
    """A hand-written ``ParallelBlock`` of ``ref``, or ``parallelize_module(copy of ref, plan)``."""
    if "plan" not in spec:
        return ParallelBlock(ref, None, sequence_parallel=spec["sequence_parallel"])
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module
    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    return parallelize_module(copy.deepcopy(ref), mesh, spec["plan"]())


def _local(y):
    return y.to_local() if hasattr(y, "to_local") else y


def reduce_partial_grads(block) -> None:
    """Sum over the mesh every DTensor gradient whose placement is ``Partial``: redistribute it to
    ``Replicate`` (an all-reduce, issued by DTensor). The hand-written SP step does the same sum in its
    gradient sync (exercise 3); a step that skipped it would time less work than that one."""
    from torch.distributed.tensor import Replicate
    for p in block.parameters():
        g = p.grad
        if g is not None and any(pl.is_partial() for pl in getattr(g, "placements", ())):
            summed = [Replicate() if pl.is_partial() else pl for pl in g.placements]
            p.grad = g.redistribute(g.device_mesh, summed)


def _no_sync(block) -> None:
    """After backward of a TP block: every gradient is complete already."""


def _step(block, x, dy, after_backward) -> None:
    """One training step of the block: forward, backward, the gradient sync, gradients cleared first."""
    block.zero_grad(set_to_none=True)
    x.grad = None
    _local(block(x)).backward(dy)
    after_backward(block)


def _memory(block, x, dy, after_backward) -> dict:
    """Bytes the forward leaves allocated (activations kept for backward + the output) and the peak over
    forward and backward, both above what was allocated before (CUDA allocator; None on CPU); and the
    bytes autograd saved, counted by ``SavedTensors``."""
    with memory.Probe(x.device) as probe:
        with SavedTensors(exclude=block.parameters()) as saved:
            y = _local(block(x))
        held = probe.held_now()
        out_bytes = y.numel() * y.element_size()
        y.backward(dy)
        after_backward(block)
    return {"held_bytes": held, "peak_bytes": probe.peak_bytes, "saved_bytes": saved.nbytes, "output_bytes": out_bytes}


def block_sweep(rank: int, world_size: int, Block, ParallelBlock, variants: dict, tokens_list, *,
                sync=None, batch: int = 1, hidden: int = 4096, ffn: int = 16384, dropout: float = 0.1,
                dtype: str = "bfloat16", warmup: int = 3, iters: int = 5, repeat: int = 5,
                seed: int = 0) -> dict:
    """Memory and forward+backward time of the MLP block in each variant, per token count.

    Args:
        variants: ``{name: {"sequence_parallel": bool}}`` for the hand-written ``ParallelBlock``, with
            ``"plan": plan_fn`` added for ``parallelize_module(Block, mesh, plan_fn())``.
        tokens_list: sequence x batch of the whole input; rounded down to a multiple of batch x n.
        sync: SP's gradient all-reduce ``sync(block, group)``, run after each hand-written SP backward;
            the DTensor variants run ``reduce_partial_grads`` instead, so that every step sums its partial
            gradients.

    Memory is measured at the largest token count (``held_bytes``, ``peak_bytes``: CUDA allocator, None
    on CPU; ``saved_bytes``: counted, hand-written variants only), with the prediction from
    ``wire.saved_bytes_predicted`` for the hand-written variants.
    """
    device, dt, n = rank_device(), _dtype(dtype), world_size
    ffn = ffn // n * n
    ref = _seeded(lambda: Block(hidden, ffn, dropout), seed, device).to(dt)
    out = {"world_size": n, "batch": batch, "hidden": hidden, "ffn": ffn, "dropout": dropout, "dtype": dtype,
           "tokens": [], "time_ms": {name: [] for name in variants}, "memory": {}}
    for tokens in tokens_list:
        seq = tokens // batch // n * n
        out["tokens"].append(seq * batch)
        gen = _generator(seed + 1, device)
        x_full = torch.randn(seq, batch, hidden, generator=gen, device=device, dtype=dt)
        dy_full = torch.randn(seq, batch, hidden, generator=gen, device=device, dtype=dt)
        for name, spec in variants.items():
            sp, hand = spec["sequence_parallel"], "plan" not in spec
            block = _build(ParallelBlock, ref, spec)
            x = (x_full.chunk(n)[rank] if sp else x_full).clone().requires_grad_()
            dy = dy_full.chunk(n)[rank] if sp else dy_full
            if not hand:
                after = reduce_partial_grads             # DTensor: the Partial gradients, summed
            elif sp and sync is not None:
                after = lambda b: sync(b, None)  # noqa: E731 - the learner's sync, or the reference
            else:
                after = _no_sync
            out["time_ms"][name].append(timing.benchmark_collective(
                functools.partial(_step, block, x, dy, after), warmup=warmup, iters=iters, repeat=repeat).median_ms)
            if tokens == tokens_list[-1]:
                block.zero_grad(set_to_none=True)
                x.grad = None
                mem = _memory(block, x, dy, after)
                if hand:
                    pred = saved_bytes_predicted(
                        seq * batch, hidden, ffn, n, itemsize=dt.itemsize, sequence_parallel=sp,
                        stats_bytes=max(4, dt.itemsize),
                        mask_bytes=dropout_mask_bytes(device.type, dt.itemsize) if dropout else 0)
                    mem["predicted_saved_bytes"] = pred["total"]
                    # x was allocated before the forward; the output was not
                    mem["predicted_held_bytes"] = pred["total"] - x.numel() * x.element_size() + mem["output_bytes"]
                else:
                    mem["saved_bytes"] = None   # DTensor saves DTensors: the allocator's number is the one
                out["memory"][name] = mem
            del block   # before the next variant is built
    return out
