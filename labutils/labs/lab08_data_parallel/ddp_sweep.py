"""The rank side of recording ``08_ddp``: the plain model, DDP per bucket cap and per NCCL CTA count,
the fastest configuration traced and its memory. ``measure.ddp(pool)`` runs ``ddp_rank`` on every rank.

1. **one GPU**: the plain model (no DDP), each sample the slowest rank's -- the compute-only step.
2. **bucket caps** ``cfg["bucket_caps_mb"]`` on NCCL's default CTA count (the world's communicator).
3. **CTAs** ``cfg["ctas"]``: the best cap of step 2 again, DDP on a communicator whose collectives use
   that many CTAs (``compat.nccl_group``: fewer SMs taken from backward, a slower all-reduce). NCCL only.

Each configuration (``_configuration``) is a fresh model and DDP wrapper: its buckets (read by the
ledger), its step and the same step under ``no_sync()`` (timed in turn, sample by sample), and the same
all-reduces alone on the same communicator. Then the fastest configuration is
built again (``_held_between_steps``): a profiler trace of one step and of one ``no_sync`` step on every
rank (GPUs only), and the memory it holds between steps with ``gradient_as_bucket_view`` on and off
(``memory.settle`` first: NCCL still holds the tensors of finished asynchronous collectives until its
watchdog lets go).
"""
from __future__ import annotations

import gc
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from labutils import compat, timing
from labutils.config import rank_device

from . import memory, steps, trace
from . import model as M
from .ledger import CollectiveLedger


def _trace(step, path: Path, rank: int, keep_file: bool, **tags) -> dict:
    """Profile one ``step`` (after a barrier, so that the ranks start together) and summarize it."""
    dist.barrier()
    trace.profile_step(step, path)
    summary = trace.summarize(trace.load_events(path), lane=f"rank {rank}")
    return dict(summary, file=path.name if keep_file else None, **tags)


def _configuration(cfg, x, y, device, *, cap, ctas, group, trace_to=None) -> dict:
    """One DDP configuration on a fresh model (see the module docstring); ``trace_to``: ``(path, rank,
    keep_file)`` to also profile one step."""
    m = M.build_transformer(cfg, device=device)
    ddp = steps.wrap_ddp(m, device, process_group=group, bucket_cap_mb=cap, gradient_as_bucket_view=True)
    opt = steps.adam(m.parameters(), device)
    step, no_sync = steps.train_step(ddp, opt, x, y), steps.train_step(ddp, opt, x, y, sync=False)
    step()  # DDP's first iteration runs on buckets in parameter order...
    with CollectiveLedger() as book:
        step()  # ...and rebuilds them in the order the gradients arrived: the buckets of every later step
    no_sync()  # its gradients live outside the buckets: the allocator finds room for them once, untimed
    t = timing.benchmark_loops({"step": steps.repeated(step), "no_sync": steps.repeated(no_sync)},
                               warmup=0, iters=1, repeat=cfg["repeat"])
    sizes = [b for op, b, _ in book.calls if op == "all_reduce"]
    row = {"bucket_cap_mb": cap, "ctas": ctas, "bucket_bytes": sizes, "n_buckets": len(sizes),
           "volume_psi": book.volume_in_params(M.n_params(cfg)), "step_ms": t["step"].median_ms,
           "no_sync_ms": t["no_sync"].median_ms, "spread": t["step"].spread}
    buffers = [torch.empty(b // 4, device=device) for b in sizes]  # fp32 gradients: 4 bytes each
    row["comm_ms"] = timing.benchmark_collective(lambda: [dist.all_reduce(b, group=group) for b in buffers],
                                                 warmup=1, iters=2, repeat=3, group=group).median_ms
    if trace_to is not None:
        path, rank, keep = trace_to
        row["trace"] = _trace(step, path, rank, keep, bucket_cap_mb=cap, ctas=ctas)
    return row


def _held_between_steps(cfg, x, y, device, best: dict, groups: dict, view: bool, trace_to) -> tuple[dict, dict]:
    """``best`` built again with ``gradient_as_bucket_view=view``; returns (memory, traces). Memory:
    ``state_bytes``, what the rank holds between steps above what it held before, and ``grad_copy_bytes``,
    what dropping every ``p.grad`` frees (zero when the gradients are views into DDP's buckets). Traces
    (``trace_to=(folder, rank, keep_files)``): one step and one ``no_sync`` step."""
    everyone, tags = list(groups.values()), dict(bucket_cap_mb=best["bucket_cap_mb"], ctas=best["ctas"])
    memory.settle(device, everyone)  # what earlier configurations left is gone before the baseline
    base = memory.fresh_baseline(device)
    m = M.build_transformer(cfg, device=device)
    ddp = steps.wrap_ddp(m, device, process_group=groups[best["ctas"]], bucket_cap_mb=best["bucket_cap_mb"],
                         gradient_as_bucket_view=view)
    opt = steps.adam(m.parameters(), device)
    step = steps.train_step(ddp, opt, x, y)
    step()
    step()  # buckets rebuilt
    traces = {}
    if trace_to is not None:
        folder, rank, keep = trace_to
        traces["best"] = _trace(step, folder / f"08_ddp_best_rank{rank}.json.gz", rank, keep, **tags)
    memory.settle(device, everyone)  # DDP's replaced buckets, still held by NCCL, are let go
    state = memory.allocated(device) - base
    for p in m.parameters():
        p.grad = None
    grad_copy = state - (memory.allocated(device) - base)
    held = {"state_bytes": steps.max_over_ranks(state, device),
            "grad_copy_bytes": steps.max_over_ranks(grad_copy, device)}
    if trace_to is not None:
        no_sync = steps.train_step(ddp, opt, x, y, sync=False)
        no_sync()  # its gradients find room once, untraced
        traces["best, no_sync"] = _trace(no_sync, folder / f"08_ddp_best_no_sync_rank{rank}.json.gz", rank,
                                         keep, **tags)
    return held, traces


def ddp_rank(rank, world_size, cfg: dict, trace_dir: str | None) -> dict:
    """Rank function behind ``measure.ddp`` (see the module docstring)."""
    device = rank_device()
    steps.prepare(device)
    x, y = M.token_batch(cfg, cfg["batch_per_rank"], seed=rank, device=device)
    out = {"config": cfg, "world_size": world_size, "n_params": M.n_params(cfg),
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    m = M.build_transformer(cfg, device=device)
    plain = steps.train_step(m, steps.adam(m.parameters(), device), x, y)
    for _ in range(cfg["warmup"]):
        plain()
    out["compute_ms"] = timing.benchmark_loops({"plain": steps.repeated(plain)}, warmup=0, iters=1,
                                               repeat=cfg["repeat"])["plain"].median_ms
    del m, plain

    on_gpu = device.type == "cuda"  # CTAs and kernel timelines exist on GPUs only
    folder = Path(trace_dir) if trace_dir else Path(tempfile.mkdtemp(prefix="lab08-traces-"))
    groups = {None: None}
    try:
        if on_gpu:
            groups.update({c: compat.nccl_group(c) for c in cfg.get("ctas", ())})
        caps = cfg["bucket_caps_mb"]
        sweep = []
        for cap in caps:
            trace_to = ((folder / f"08_ddp_one_bucket_rank{rank}.json.gz", rank, bool(trace_dir))
                        if on_gpu and cap == max(caps) else None)
            sweep.append(_configuration(cfg, x, y, device, cap=cap, ctas=None, group=None, trace_to=trace_to))
            gc.collect()  # the last configuration's model and DDP, freed before the next is built
        cap = min(sweep, key=lambda r: r["step_ms"])["bucket_cap_mb"]
        out["cta_cap_mb"] = cap if len(groups) > 1 else None
        for c, g in groups.items():
            if c is not None:
                sweep.append(_configuration(cfg, x, y, device, cap=cap, ctas=c, group=g))
                gc.collect()
        out["traces"] = {"one bucket": r.pop("trace") for r in sweep if "trace" in r}  # one row has it
        out["sweep"] = sweep
        best = min(sweep, key=lambda r: r["step_ms"])
        trace_to = (folder, rank, bool(trace_dir)) if on_gpu else None
        view, traces = _held_between_steps(cfg, x, y, device, best, groups, True, trace_to)
        no_view, _ = _held_between_steps(cfg, x, y, device, best, groups, False, None)
        out["memory"] = {"bucket_cap_mb": best["bucket_cap_mb"], "ctas": best["ctas"], "view": view,
                         "no_view": no_view}
        out["traces"].update(traces)
    finally:
        for g in groups.values():
            if g is not None:
                dist.destroy_process_group(g)
        if not trace_dir:
            shutil.rmtree(folder, ignore_errors=True)
    return out
