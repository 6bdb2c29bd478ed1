"""Lab 08's measurements, one function per recording, each run inside a ``RankPool`` (NCCL, >= 2 GPUs).

    with labutils.RankPool(backend="nccl") as pool:
        ddp = measure.ddp(pool, trace_dir="traces")   # "08_ddp": one GPU vs DDP, bucket sweep, overlap
        zero = measure.zero(pool)                     # "08_zero": memory and volume, DDP by hand / ZeRO-1 / -2
        fsdp = measure.fsdp(pool)                     # "08_fsdp": DDP vs FSDP2 variants

A training step is forward (bf16 autocast on GPUs), MSE loss, backward, AdamW (fused on GPUs), on
``model.BENCH``'s transformer with fp32 weights. Times: CUDA events, ``cfg["warmup"]`` untimed steps,
the median of ``cfg["repeat"]``, each sample the slowest rank's (``timing``). Memory: bytes allocated
above what the rank held before the model was built (``memory.fresh_baseline``). Volumes: the bytes
handed to the collectives during one step (``ledger.CollectiveLedger``), in units of Psi elements.
The code under test (ZeRO, FSDP2 wrapping) is passed in; the defaults are ``reference``'s.
"""
from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.profiler import record_function

from labutils import timing
from labutils.config import rank_device
from labutils.solutions import lab08 as solution

from . import memory
from . import model as M
from . import reference, trace
from .ledger import CollectiveLedger

REFERENCE_ZERO = {"shard_of": reference.shard_of, "zero1_step": solution.zero1_step,
                  "zero2_attach": reference.zero2_attach, "zero2_step": reference.zero2_step,
                  "average_gradients": solution.average_gradients}


# ---- building blocks (inside a rank) ----------------------------------------------------------------
def _prepare(device) -> None:
    """TF32 for any fp32 matmul, and cuBLAS's workspace allocated before any baseline is taken."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    a = torch.ones(64, 64, device=device, requires_grad=True)
    (a @ a).sum().backward()


def _adam(params, device):
    return torch.optim.AdamW(params, lr=1e-5, fused=device.type == "cuda")


def _ddp(module, device, **kwargs):
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None, **kwargs)


def train_step(module, optimizer, x, y, *, autocast: bool = True):
    """One training step as a closure; its phases are ``record_function`` ranges for the trace.
    Gradients stay allocated after the step (zeroed at the start of the next one)."""
    dev = x.device.type

    def step():
        optimizer.zero_grad(set_to_none=True)
        with record_function("forward"), torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast and dev == "cuda"):
            out = module(x)
        loss = F.mse_loss(out.float(), y)
        with record_function("backward"):
            loss.backward()
        with record_function("optimizer"):
            optimizer.step()
    return step


def _time_ms(step, repeat: int, device, warmup: int = 0) -> float:
    t = timing.benchmark(step, warmup=warmup, repeat=repeat, device=device)
    return timing.summarize(timing.slowest_rank(t.samples_ms)).median_ms


def _max_over_ranks(value: float, device) -> float:
    t = torch.tensor([float(value)], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


# ---- 08_ddp ----------------------------------------------------------------------------------------
def _ddp_run(cfg, x, y, device, *, comm: bool, **ddp_kwargs) -> dict:
    """Time DDP with ``ddp_kwargs``; bucket sizes from the ledger; optionally the same all-reduces alone."""
    base = memory.fresh_baseline(device)
    m = M.build_transformer(cfg, device=device)
    ddp = _ddp(m, device, **ddp_kwargs)
    opt = _adam(m.parameters(), device)
    step = train_step(ddp, opt, x, y)
    for _ in range(cfg["warmup"]):  # the first iterations also rebuild the buckets in gradient order
        step()
    with CollectiveLedger() as book:
        step()
    row = dict(ddp_kwargs)
    row["state_bytes"] = _max_over_ranks(memory.allocated(device) - base, device)
    row["bucket_bytes"] = [b for op, b, _ in book.calls if op == "all_reduce"]
    row["n_buckets"] = len(row["bucket_bytes"])
    row["volume_psi"] = book.volume_in_params(M.n_params(cfg))
    row["step_ms"] = _time_ms(step, cfg["repeat"], device)
    if comm:  # the same all-reduces, back to back, without the model: communication only
        buffers = [torch.empty(b // 4, device=device) for b in row["bucket_bytes"]]
        t = timing.benchmark_collective(lambda: [dist.all_reduce(b) for b in buffers], warmup=1, iters=2, repeat=3)
        row["comm_ms"] = t.median_ms
        del buffers
    del ddp, m, opt, step
    return row


def ddp_rank(rank, world_size, cfg: dict, trace_dir: str | None) -> dict:
    """Rank function behind ``ddp``: one GPU (the plain model), DDP per bucket cap, bucket views, traces."""
    device = rank_device()
    _prepare(device)
    x, y = M.token_batch(cfg, cfg["batch_per_rank"], seed=rank, device=device)
    out = {"config": cfg, "world_size": world_size, "n_params": M.n_params(cfg),
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"}
    base = memory.fresh_baseline(device)
    m = M.build_transformer(cfg, device=device)
    opt = _adam(m.parameters(), device)
    step = train_step(m, opt, x, y)
    out["compute_ms"] = _time_ms(step, cfg["repeat"], device, warmup=cfg["warmup"])
    out["one_gpu_state_bytes"] = _max_over_ranks(memory.allocated(device) - base, device)
    del m, opt, step
    out["sweep"] = [_ddp_run(cfg, x, y, device, comm=True, bucket_cap_mb=cap, gradient_as_bucket_view=True)
                    for cap in cfg["bucket_caps_mb"]]
    best = min(out["sweep"], key=lambda r: r["step_ms"])["bucket_cap_mb"]
    out["no_bucket_view"] = _ddp_run(cfg, x, y, device, comm=False, bucket_cap_mb=best,
                                     gradient_as_bucket_view=False)
    out["traces"] = {}
    folder = Path(trace_dir) if trace_dir else Path(tempfile.mkdtemp(prefix="lab08-traces-"))
    traced = (("best bucket", best), ("one bucket", max(cfg["bucket_caps_mb"]))) if device.type == "cuda" else ()
    for label, cap in traced:  # a timeline of GPU kernels needs GPUs
        m = M.build_transformer(cfg, device=device)
        ddp = _ddp(m, device, bucket_cap_mb=cap, gradient_as_bucket_view=True)
        step = train_step(ddp, _adam(m.parameters(), device), x, y)
        for _ in range(cfg["warmup"]):
            step()
        dist.barrier()
        path = trace.profile_step(step, folder / f"08_ddp_{label.replace(' ', '_')}_rank{rank}.json.gz")
        summary = trace.summarize(trace.load_events(path), lane=f"rank {rank}")
        out["traces"][label] = dict(summary, bucket_cap_mb=cap, file=path.name if trace_dir else None)
        del m, ddp, step
    if not trace_dir:
        shutil.rmtree(folder, ignore_errors=True)
    return out


def ddp(pool, cfg: dict | None = None, trace_dir=None) -> dict:
    """Recording ``08_ddp`` (see ``ddp_rank``); trace files go to ``trace_dir`` when given."""
    cfg = cfg or M.BENCH
    results = pool.run(ddp_rank, cfg, str(Path(trace_dir).resolve()) if trace_dir else None,
                       timeout=600, output="quiet")
    data = {k: v for k, v in results[0].items() if k != "traces"}
    data["traces"] = {label: [r["traces"][label] for r in results] for label in results[0]["traces"]}
    return data


# ---- 08_zero ---------------------------------------------------------------------------------------
def _zero_scheme(scheme, world_size, rank, cfg, impl, x, y, device) -> dict:
    """One scheme of ``zero_rank``; everything it allocated is freed when it returns."""
    psi = M.n_params(cfg)
    base = memory.fresh_baseline(device)
    m = M.build_transformer(cfg, device=device)
    params = list(m.parameters())
    shards = params if scheme == "DDP" else [impl["shard_of"](p, world_size, rank) for p in params]
    opt = _adam(shards, device)
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
    memory.reset_peak(device)
    with CollectiveLedger() as book:
        step()
    row = {"scheme": scheme, "peak_bytes": _max_over_ranks(memory.peak(device) - base, device),
           "predicted_bytes": memory.predicted_bytes(scheme, psi, world_size),
           "volume_psi": book.volume_in_params(psi), "calls": book.counts()}
    for h in hooks:
        h.remove()
    return row


def zero_rank(rank, world_size, cfg: dict, impl: dict) -> dict:
    """Peak memory and volume per step of data parallelism by hand, ZeRO-1 and ZeRO-2 (fp32, a tiny
    batch so that the model states dominate), with the notebook's (or the reference) functions."""
    device = rank_device()
    _prepare(device)
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


def fsdp_rank(rank, world_size, cfg: dict, shard_transformer) -> dict:
    """DDP (bucket views) and FSDP2 variants: state bytes after a step, peak bytes, step time, volume."""
    reference.require_fsdp2()
    device = rank_device()
    _prepare(device)
    psi = M.n_params(cfg)
    x, y = M.token_batch(cfg, cfg["batch_per_rank"], seed=rank, device=device)
    rows = []
    for name, kwargs in fsdp_variants(cfg).items():
        base = memory.fresh_baseline(device)
        m = M.build_transformer(cfg, device=device)
        wrapped = _ddp(m, device, gradient_as_bucket_view=True) if kwargs is None else shard_transformer(m, **kwargs)
        opt = _adam(wrapped.parameters(), device)
        step = train_step(wrapped, opt, x, y)
        for _ in range(cfg["warmup"]):
            step()
        with CollectiveLedger() as book:
            step()
        state = memory.allocated(device) - base  # weights + gradients + Adam state, between steps
        memory.reset_peak(device)
        step()
        peak = memory.peak(device) - base
        rows.append({"name": name, "state_bytes": _max_over_ranks(state, device),
                     "peak_bytes": _max_over_ranks(peak, device), "volume_psi": book.volume_in_params(psi),
                     "calls": book.counts(), "step_ms": _time_ms(step, cfg["repeat"], device)})
        del m, wrapped, opt, step
    return {"config": cfg, "world_size": world_size, "n_params": psi, "rows": rows}


def fsdp(pool, cfg: dict | None = None, shard_transformer=None) -> dict:
    """Recording ``08_fsdp`` (see ``fsdp_rank``); ``shard_transformer`` defaults to the reference."""
    return pool.run(fsdp_rank, cfg or M.BENCH, shard_transformer or reference.shard_transformer,
                    timeout=300, output="quiet")[0]
