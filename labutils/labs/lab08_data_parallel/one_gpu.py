"""Lab 08 on one GPU: the plain model (no DDP) -- its training step, and the memory it holds, against the
ZeRO paper's 16 bytes per parameter. Run it::

    from labutils.labs.lab08_data_parallel import one_gpu
    data = one_gpu.plain_step()          # model.BENCH on cuda:0; JSON-able

The step is ``steps.train_step`` (bf16 autocast, MSE, backward, fused AdamW) on one GPU's share of the
batch (``batch_per_rank`` sequences), timed back to back (``timing.benchmark``: CUDA events, median).
Memory is counted from the allocator (``memory``) from a zero taken after the batch exists: the weights
once built; between steps (weights, gradients, AdamW's two moments: the model states); and the peak of
one steady-state step (the model states plus the activations and temporaries of that step).
"""
from __future__ import annotations

import torch

from ... import timing
from ...instruments import memory as probe
from . import memory, steps
from . import model as M


def plain_step(cfg: dict | None = None, device="cuda:0") -> dict:
    """Time and memory of the plain model's training step on ``device``.

    Returns:
        ``{"config", "gpu", "n_params", "step_ms", "samples_ms", "weights_bytes", "state_bytes",
        "peak_bytes", "predicted_state_bytes"}`` (bytes on CUDA; 0 on the CPU, which has no allocator
        statistics).
    """
    cfg = {**M.BENCH, **(cfg or {})}
    dev = torch.device(device)
    steps.prepare(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):   # bf16 GEMM workspaces
        a = torch.ones(64, 64, device=dev, requires_grad=True)
        (a @ a).float().sum().backward()
    del a
    psi = M.n_params(cfg)
    x, y = M.token_batch(cfg, cfg["batch_per_rank"], seed=0, device=dev)
    base = probe.fresh_baseline(dev)
    m = M.build_transformer(cfg, device=dev)
    weights = probe.allocated(dev) - base
    step = steps.train_step(m, steps.adam(m.parameters(), dev), x, y)
    for _ in range(max(2, cfg["warmup"])):   # AdamW's state exists from the first step on
        step()
    timing.Clock(dev).synchronize()
    state = probe.allocated(dev) - base
    probe.reset_peak(dev)
    step()
    timing.Clock(dev).synchronize()
    peak = probe.peak(dev) - base
    t = timing.benchmark(step, warmup=0, repeat=max(5, cfg["repeat"]), device=dev)
    out = {"config": cfg, "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
           "n_params": psi, "step_ms": t.median_ms, "samples_ms": list(t.samples_ms),
           "weights_bytes": weights, "state_bytes": state, "peak_bytes": peak,
           "predicted_state_bytes": memory.predicted_bytes("DDP", psi, 1)}
    del m, step, x, y
    probe.fresh_baseline(dev)
    return out
