"""One training step of lab 08's measurements, and the pieces every measurement builds it from.

    step = steps.train_step(steps.wrap_ddp(model, device), steps.adam(model.parameters(), device), x, y)
    t = timing.benchmark_loops({"step": timing.repeated(step)}, warmup=0, iters=1, repeat=3)

A step is forward (bf16 autocast on GPUs), MSE loss, backward, AdamW (fused on GPUs); its phases are
``record_function`` ranges, so that a profiler trace shows them. Gradients are set to None at the start
of a step and stay allocated after it (between steps a model holds weights, gradients, Adam state).
Everything here runs inside a rank.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from labutils import timing


def prepare(device) -> None:
    """TF32 for any fp32 matmul, and cuBLAS's workspace allocated before any memory baseline is taken."""
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    a = torch.ones(64, 64, device=device, requires_grad=True)
    (a @ a).sum().backward()


def adam(params, device):
    """AdamW, fused on GPUs."""
    return torch.optim.AdamW(params, lr=1e-5, fused=device.type == "cuda")


def wrap_ddp(module, device, **kwargs):
    """``DistributedDataParallel(module, ...)`` on this rank's GPU (or the CPU); ``kwargs`` are DDP's."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    return DDP(module, device_ids=[device.index] if device.type == "cuda" else None, **kwargs)


def train_step(module, optimizer, x, y, *, autocast: bool = True, sync: bool = True):
    """One training step as a closure. ``sync=False`` runs it under ``module.no_sync()`` (a DDP module:
    the same forward, backward and hooks, without the gradient all-reduce)."""
    dev = x.device.type

    def step():
        optimizer.zero_grad(set_to_none=True)
        context = contextlib.nullcontext() if sync else module.no_sync()
        with context:  # DDP decides in forward whether backward all-reduces
            with record_function("forward"), torch.autocast(dev, dtype=torch.bfloat16,
                                                            enabled=autocast and dev == "cuda"):
                out = module(x)
            loss = F.mse_loss(out.float(), y)
            with record_function("backward"):
                loss.backward()
        with record_function("optimizer"):
            optimizer.step()
    return step


def time_ms(step, repeat: int, device, warmup: int = 0) -> float:
    """Median of ``repeat`` back-to-back steps (CUDA events), each sample the slowest rank's."""
    t = timing.benchmark(step, warmup=warmup, repeat=repeat, device=device)
    return timing.summarize(timing.slowest_rank(t.samples_ms)).median_ms
