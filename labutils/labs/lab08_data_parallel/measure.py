"""Lab 08's measurements, one function per recording, each run inside a ``RankPool`` (NCCL, >= 2 GPUs).

    with labutils.RankPool(backend="nccl") as pool:
        ddp = measure.ddp(pool, trace_dir="traces")   # "08_ddp": one GPU vs DDP, bucket caps x CTAs, overlap
        zero = measure.zero(pool)                     # "08_zero": memory and volume, DDP by hand / ZeRO-1 / -2
        fsdp = measure.fsdp(pool)                     # "08_fsdp": DDP vs FSDP2 variants

A training step is ``steps.train_step`` on ``model.BENCH``'s transformer with fp32 weights. Times: CUDA
events, untimed warm-up steps, the median of ``cfg["repeat"]`` samples (08_ddp: ``cfg["paired_repeat"]``
samples of ``cfg["paired_iters"]`` steps, step and no_sync in turn), each sample the slowest rank's
(``timing``). Kernel timelines: the profiler with CUDA activity only (``instruments.profiler.profile(cpu=False)``),
so that the CPU profiler's cost on the issuing thread does not enter the figures. Memory: bytes allocated above what the rank held before the model was built
(``instruments.memory.fresh_baseline``), read after ``instruments.memory.settle``. Volumes: the bytes handed to the collectives
during one step (``instruments.ledger.Ledger``), in units of Psi elements. The code under test (ZeRO,
FSDP2 wrapping) is passed in; the defaults are ``reference``'s. ``ddp_sweep`` is 08_ddp's rank side.
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils import timing
from labutils.config import rank_device
from labutils.instruments import memory as gpu_memory, profiler
from labutils.instruments.ledger import Ledger
from labutils.solutions import lab08 as solution

from . import memory, overlap, reference, steps, trace
from . import model as M
from .ddp_sweep import ddp_rank
from .ledger import volume_in_params

REFERENCE_ZERO = {"shard_of": reference.shard_of, "zero1_step": solution.zero1_step,
                  "zero2_attach": reference.zero2_attach, "zero2_step": reference.zero2_step,
                  "average_gradients": solution.average_gradients}


# ---- 08_ddp ----------------------------------------------------------------------------------------
def ddp(pool, cfg: dict | None = None, trace_dir=None) -> dict:
    """Recording ``08_ddp`` (``ddp_sweep.ddp_rank`` on every rank); trace files go to ``trace_dir`` when
    given. Each configuration keeps every rank's timeline (``row["timeline"][rank]``, None off GPUs) and
    the slowest traced rank's ``overlap.TIMELINE_FIELDS`` (None off GPUs); traces hold every rank's
    summary: ``data["traces"][label][rank]``."""
    cfg = cfg or M.BENCH
    results = pool.run(ddp_rank, cfg, str(Path(trace_dir).resolve()) if trace_dir else None,
                       timeout=600, output="quiet")
    data = {k: v for k, v in results[0].items() if k not in ("traces", "sweep")}
    data["sweep"] = []
    for i, row in enumerate(results[0]["sweep"]):
        per_rank = [r["sweep"][i]["timeline"] for r in results]
        row = dict(row, timeline=per_rank if all(per_rank) else None)
        picked = overlap.slowest(per_rank) if row["timeline"] else {}
        row.update({k: picked.get(k) for k in overlap.TIMELINE_FIELDS})
        data["sweep"].append(row)
    data["traces"] = {label: [r["traces"][label] for r in results] for label in results[0]["traces"]}
    return data


# ---- 08_zero ---------------------------------------------------------------------------------------
def _zero_scheme(scheme, world_size, rank, cfg, impl, x, y, device) -> dict:
    """One scheme of ``zero_rank``; everything it allocated is freed when it returns."""
    psi = M.n_params(cfg)
    base = gpu_memory.fresh_baseline(device)
    m = M.build_transformer(cfg, device=device)
    params = list(m.parameters())
    shards = params if scheme == "DDP" else [impl["shard_of"](p, world_size, rank) for p in params]
    opt = steps.adam(shards, device)
    hooks = impl["zero2_attach"](params, shards) if scheme == "ZeRO-2" else []

    def step():
        F.mse_loss(m(x), y).backward()
        if scheme == "DDP":
            impl["average_gradients"](m)
            opt.step()
            opt.zero_grad()
        elif scheme == "ZeRO-1":
            impl["zero1_step"](params, shards, opt)
        else:
            impl["zero2_step"](params, shards, opt)

    step()
    step()  # Adam's state exists from the first step on: now the steady state
    gpu_memory.reset_peak(device)
    with Ledger() as book:
        step()
    peak, = timing.slowest_rank([gpu_memory.peak(device) - base])      # the largest over the ranks
    row = {"scheme": scheme, "peak_bytes": peak,
           "predicted_bytes": memory.predicted_bytes(scheme, psi, world_size),
           "volume_psi": volume_in_params(book, psi), "calls": book.counts()}
    for h in hooks:
        h.remove()
    return row


def zero_rank(rank, world_size, cfg: dict, impl: dict) -> dict:
    """Peak memory and volume per step of data parallelism by hand, ZeRO-1 and ZeRO-2 (fp32, a tiny
    batch so that the model states dominate), with the notebook's (or the reference) functions."""
    device = rank_device()
    steps.prepare(device)
    gpu_memory.settle(device)  # what the measurements before left behind is gone before the first baseline
    x, y = M.token_batch(cfg, cfg["memory_rows"], seq=cfg["memory_seq"], seed=rank, device=device)
    rows = [_zero_scheme(scheme, world_size, rank, cfg, impl, x, y, device)
            for scheme in ("DDP", "ZeRO-1", "ZeRO-2")]
    return {"config": cfg, "world_size": world_size, "n_params": M.n_params(cfg), "rows": rows}


def zero(pool, cfg: dict | None = None, impl: dict | None = None) -> dict:
    """Recording ``08_zero`` (see ``zero_rank``); ``impl`` defaults to ``REFERENCE_ZERO``."""
    return pool.run(zero_rank, cfg or M.BENCH, impl or REFERENCE_ZERO, timeout=300, output="quiet")[0]


# ---- 08_fsdp ---------------------------------------------------------------------------------------
def fsdp_variants(cfg: dict) -> dict:
    """Name -> keyword arguments of ``shard_transformer`` (None: DDP)."""
    return {"DDP": None, "FSDP2": {}, "FSDP2, reshard_after_forward=False": {"reshard_after_forward": False},
            f"FSDP2, prefetch {cfg['prefetch']} blocks": {"prefetch": cfg["prefetch"]}}


def traced_variants(cfg: dict) -> tuple[str, ...]:
    """The variants whose step ``fsdp_rank`` also profiles on GPUs: FSDP2's default and explicit prefetch."""
    return ("FSDP2", f"FSDP2, prefetch {cfg['prefetch']} blocks")


def _kernel_summary(step, rank: int) -> dict:
    """``trace.summarize`` of one profiled ``step`` (after a barrier; CUDA activity only, see the module
    docstring), without the spans to draw."""
    dist.barrier()
    torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="lab08-fsdp-") as folder:
        doc = profiler.profile(step, cpu=False, path=Path(folder) / f"step_rank{rank}.json")
        summary = trace.summarize(profiler.events(doc), lane=f"rank {rank}")
    return {k: v for k, v in summary.items() if k != "spans"}


def _groups_of(module) -> list:
    """The process groups a module's collectives use: the world's, and its DTensor parameters' meshes'."""
    groups = [None]
    for p in module.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None and mesh.get_group() not in groups:
            groups.append(mesh.get_group())
    return groups


def fsdp_rank(rank, world_size, cfg: dict, shard_transformer) -> dict:
    """DDP (bucket views) and FSDP2 variants: state bytes after a step, peak bytes, step time, volume; on
    GPUs, for ``traced_variants``, a profiler summary of one step (``row["trace"]``, this rank's)."""
    reference.require_fsdp2()
    device = rank_device()
    steps.prepare(device)
    psi = M.n_params(cfg)
    x, y = M.token_batch(cfg, cfg["batch_per_rank"], seed=rank, device=device)
    rows = []
    for name, kwargs in fsdp_variants(cfg).items():
        gpu_memory.settle(device)
        base = gpu_memory.fresh_baseline(device)
        m = M.build_transformer(cfg, device=device)
        wrapped = (steps.wrap_ddp(m, device, gradient_as_bucket_view=True) if kwargs is None
                   else shard_transformer(m, **kwargs))
        groups = _groups_of(wrapped)
        opt = steps.adam(wrapped.parameters(), device)
        step = steps.train_step(wrapped, opt, x, y)
        for _ in range(cfg["warmup"]):
            step()
        with Ledger() as book:
            step()
        gpu_memory.settle(device, groups)
        state = gpu_memory.allocated(device) - base  # weights + gradients + Adam state, between steps
        gpu_memory.reset_peak(device)
        step()
        peak = gpu_memory.peak(device) - base
        state, peak = timing.slowest_rank([state, peak])             # the largest over the ranks
        row = {"name": name, "state_bytes": state, "peak_bytes": peak, "volume_psi": volume_in_params(book, psi),
               "calls": book.counts(), "step_ms": steps.time_ms(step, cfg["repeat"], device)}
        if device.type == "cuda" and name in traced_variants(cfg):
            row["trace"] = _kernel_summary(step, rank)
        rows.append(row)
        del m, wrapped, opt, step
    return {"config": cfg, "world_size": world_size, "n_params": psi, "rows": rows}


def fsdp(pool, cfg: dict | None = None, shard_transformer=None) -> dict:
    """Recording ``08_fsdp`` (see ``fsdp_rank``); ``shard_transformer`` defaults to the reference. A
    traced row's ``"trace"`` holds every rank's summary: ``row["trace"][rank]``."""
    results = pool.run(fsdp_rank, cfg or M.BENCH, shard_transformer or reference.shard_transformer,
                       timeout=300, output="quiet")
    data = results[0]
    for i, row in enumerate(data["rows"]):
        if "trace" in row:
            row["trace"] = [r["rows"][i]["trace"] for r in results]
    return data
