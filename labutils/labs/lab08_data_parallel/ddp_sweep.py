"""The rank side of recording ``08_ddp``: the plain model, DDP per bucket cap and per NCCL CTA count,
each timed and (on GPUs) traced, then the fastest configuration's memory and a picture of its step.
``measure.ddp(pool)`` runs ``ddp_rank`` on every rank.

1. **one GPU**: the plain model (no DDP), each sample the slowest rank's -- the compute-only step.
2. **bucket caps** ``cfg["bucket_caps_mb"]`` on NCCL's default CTA count (the world's communicator).
3. **CTAs** ``cfg["ctas"]``: the best cap of step 2 again, DDP on a communicator whose collectives use
   that many CTAs (``compat.nccl_group``: fewer SMs for NCCL, each all-reduce longer). NCCL only.

Each configuration (``_configuration``) is a fresh model and DDP wrapper: its buckets (read by the
ledger); its step and the same step under ``no_sync()``, timed in turn sample by sample
(``cfg["paired_repeat"]`` samples of ``cfg["paired_iters"]`` steps; ``exposed_ms`` is the median of the
per-sample differences); the same all-reduces alone on the same communicator. On GPUs, then,
``cfg["trace_steps"]`` steps and as many ``no_sync`` steps under the profiler with **CUDA activity only**
(``_timeline``): the kernels as they run untraced, without the CPU profiler's cost on the thread that
issues them -- overlap, compute stretch and tail come from these.

Last, the fastest configuration is built again (``_held_between_steps``): one step profiled **with** CPU
activity (a Perfetto file showing DDP's hooks and launches on the host; its length shows what the CPU
profiler does to a step), and the memory it holds between steps with ``gradient_as_bucket_view`` on
and off (``instruments.memory.settle`` first: NCCL still holds the tensors of finished asynchronous collectives
until its watchdog lets go).
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
from labutils.instruments import memory as gpu_memory, profiler
from labutils.instruments.ledger import Ledger

from . import overlap, steps, trace
from . import model as M
from .ledger import volume_in_params


def _traced(step, path: Path, rank: int, *, cpu: bool, n_steps: int = 1) -> dict:
    """``trace.summarize`` of ``n_steps`` profiled steps, the ranks started together (a barrier, then
    the GPU drained, so that the barrier's own kernel is not in the trace)."""
    dist.barrier()
    torch.cuda.synchronize()
    doc = profiler.profile(step, calls=n_steps, cpu=cpu, path=path)
    return trace.summarize(profiler.events(doc), lane=f"rank {rank}", steps=n_steps)


def _timeline(step, no_sync, path: Path, rank: int, n_steps: int) -> tuple[dict, dict]:
    """The step (its trace written to ``path``) and the no_sync step, ``n_steps`` each, CUDA activity
    only: (``overlap.timeline``, the step's summary with its spans)."""
    s = _traced(step, path, rank, cpu=False, n_steps=n_steps)
    with tempfile.TemporaryDirectory(prefix="lab08-kernels-") as folder:
        n = _traced(no_sync, Path(folder) / "no_sync.json", rank, cpu=False, n_steps=n_steps)
    return overlap.timeline(s, n), s


def _configuration(cfg, x, y, device, trace_to, *, cap, ctas, group) -> tuple[dict, dict | None]:
    """One DDP configuration on a fresh model (see the module docstring): (row, the traced step's
    summary with spans, or None off GPUs). ``trace_to``: ``(folder, rank, keep_file)``."""
    m = M.build_transformer(cfg, device=device)
    ddp = steps.wrap_ddp(m, device, process_group=group, bucket_cap_mb=cap, gradient_as_bucket_view=True)
    opt = steps.adam(m.parameters(), device)
    step, no_sync = steps.train_step(ddp, opt, x, y), steps.train_step(ddp, opt, x, y, sync=False)
    step()  # DDP's first iteration runs on buckets in parameter order...
    with Ledger() as book:
        step()  # ...and rebuilds them in the order the gradients arrived: the buckets of every later step
    # warmup=1: one untimed no_sync step, where its gradients (outside the buckets) first find room
    t = timing.benchmark_loops({"step": timing.repeated(step), "no_sync": timing.repeated(no_sync)},
                               warmup=1, iters=cfg["paired_iters"], repeat=cfg["paired_repeat"])
    exposed, diffs = overlap.paired_difference(t["step"].samples_ms, t["no_sync"].samples_ms)
    sizes = [r.size_bytes for r in book.records if r.op == "all_reduce"]
    row = {"bucket_cap_mb": cap, "ctas": ctas, "bucket_bytes": sizes, "n_buckets": len(sizes),
           "volume_psi": volume_in_params(book, M.n_params(cfg)), "step_ms": t["step"].median_ms,
           "no_sync_ms": t["no_sync"].median_ms, "spread": t["step"].spread, "exposed_ms": exposed,
           "exposed_samples_ms": diffs}
    buffers = [torch.empty(b // 4, device=device) for b in sizes]  # fp32 gradients: 4 bytes each
    row["comm_ms"] = timing.benchmark_collective(lambda: [dist.all_reduce(b, group=group) for b in buffers],
                                                 warmup=1, iters=2, repeat=3, group=group).median_ms
    row["timeline"], summary = None, None
    if device.type == "cuda":
        folder, rank, keep = trace_to
        path = folder / f"08_ddp_cap{cap:g}_{'default' if ctas is None else ctas}_ctas_rank{rank}.json.gz"
        row["timeline"], summary = _timeline(step, no_sync, path, rank, cfg["trace_steps"])
        summary = dict(summary, bucket_cap_mb=cap, ctas=ctas, steps=cfg["trace_steps"],
                       file=path.name if keep else None)
    return row, summary


def _held_between_steps(cfg, x, y, device, best: dict, groups: dict, view: bool, trace_to) -> tuple[dict, dict]:
    """``best`` built again with ``gradient_as_bucket_view=view``; returns (memory, traces). Memory:
    ``state_bytes``, what the rank holds between steps above what it held before, and ``grad_copy_bytes``,
    what dropping every ``p.grad`` frees (zero when the gradients are views into DDP's buckets). Traces
    (``trace_to=(folder, rank, keep_file)``): one step with CPU activity, ``{"best, CPU activity": ...}``."""
    everyone, tags = list(groups.values()), dict(bucket_cap_mb=best["bucket_cap_mb"], ctas=best["ctas"])
    gpu_memory.settle(device, everyone)  # what earlier configurations left is gone before the baseline
    base = gpu_memory.fresh_baseline(device)
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
        path = folder / f"08_ddp_best_cpu_rank{rank}.json.gz"
        traces["best, CPU activity"] = dict(_traced(step, path, rank, cpu=True), steps=1,
                                            file=path.name if keep else None, **tags)
    gpu_memory.settle(device, everyone)  # DDP's replaced buckets, still held by NCCL, are let go
    state = gpu_memory.allocated(device) - base
    for p in m.parameters():
        p.grad = None
    grad_copy = state - (gpu_memory.allocated(device) - base)
    state, grad_copy = timing.slowest_rank([state, grad_copy])      # the largest over the ranks
    held = {"state_bytes": state, "grad_copy_bytes": grad_copy}
    return held, traces


def ddp_rank(rank, world_size, cfg: dict, trace_dir: str | None) -> dict:
    """Rank function behind ``measure.ddp`` (see the module docstring). ``out["traces"]`` holds this
    rank's summaries with spans: ``"best"`` and ``"one bucket"`` (CUDA activity only, ``trace_steps``
    steps) and ``"best, CPU activity"`` (one step); empty off GPUs."""
    device = rank_device()
    steps.prepare(device)
    x, y = M.token_batch(cfg, cfg["batch_per_rank"], seed=rank, device=device)
    out = {"config": cfg, "world_size": world_size, "n_params": M.n_params(cfg),
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    m = M.build_transformer(cfg, device=device)
    plain = steps.train_step(m, steps.adam(m.parameters(), device), x, y)
    for _ in range(cfg["warmup"]):
        plain()
    out["compute_ms"] = timing.benchmark_loops({"plain": timing.repeated(plain)}, warmup=0, iters=cfg["paired_iters"],
                                               repeat=cfg["paired_repeat"])["plain"].median_ms
    del m, plain

    on_gpu = device.type == "cuda"  # CTAs and kernel timelines exist on GPUs only
    folder = Path(trace_dir) if trace_dir else Path(tempfile.mkdtemp(prefix="lab08-traces-"))
    groups = {None: None}
    try:
        if on_gpu:
            groups.update({c: compat.nccl_group(c) for c in cfg.get("ctas", ())})
        sweep, summaries = [], []

        def run(cap, ctas):
            row, summary = _configuration(cfg, x, y, device, (folder, rank, bool(trace_dir)), cap=cap, ctas=ctas,
                                          group=groups[ctas])
            sweep.append(row)
            summaries.append(summary)
            gc.collect()  # this configuration's model and DDP, freed before the next is built

        for cap in cfg["bucket_caps_mb"]:
            run(cap, None)
        cap = min(sweep, key=lambda r: r["step_ms"])["bucket_cap_mb"]
        out["cta_cap_mb"] = cap if len(groups) > 1 else None
        for c in groups:
            if c is not None:
                run(cap, c)
        out["sweep"] = sweep
        i_best = min(range(len(sweep)), key=lambda i: sweep[i]["step_ms"])
        i_one = max((i for i, r in enumerate(sweep) if r["ctas"] is None), key=lambda i: sweep[i]["bucket_cap_mb"])
        out["traces"] = {"best": summaries[i_best], "one bucket": summaries[i_one]} if on_gpu else {}
        best = sweep[i_best]
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
