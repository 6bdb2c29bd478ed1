"""Reference solutions for lab 08 (data parallelism). Peek only after trying!"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import compat


def padded_flat(t, world_size):
    """``t`` flattened and zero-padded to a multiple of world_size (the notebook's helper)."""
    flat = t.reshape(-1)
    pad = -flat.numel() % world_size
    return F.pad(flat, (0, pad)) if pad else flat


def gather_param(p, shard):
    """All-gather every rank's shard back into ``p`` (the notebook's helper)."""
    full = padded_flat(p.detach(), dist.get_world_size())
    compat.all_gather_into_tensor(full, shard.detach().clone())
    if full.numel() != p.numel():
        p.detach().copy_(full[: p.numel()].view_as(p))


def average_gradients(model):
    """Exercise 1: the gradient all-reduce of data parallelism.

    Each rank's ``p.grad`` is the gradient of the mean loss over its own B/N samples; the gradient
    of the mean over all B samples is the mean of the N ranks' gradients: sum them (all-reduce), then
    divide by N.
    """
    world_size = dist.get_world_size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad)  # SUM over ranks, in place
            p.grad /= world_size  # the mean: the gradient of the whole batch's mean loss


def zero1_step(params, shards, optimizer):
    """Exercise 2: one ZeRO-1 step (optimizer state sharded).

    1. Reduce-scatter each full gradient: rank r receives only its shard of the sum, divides by N.
    2. Step the optimizer, which holds only this rank's shards (so 1/N of Adam's state).
    3. All-gather the updated shards back into every rank's full parameters.
    Communication: a reduce-scatter and an all-gather of Psi elements, the 2 Psi of one all-reduce.
    """
    world_size = dist.get_world_size()
    for p, s in zip(params, shards):
        s.grad = torch.empty_like(s)
        compat.reduce_scatter_tensor(s.grad, padded_flat(p.grad, world_size))  # my shard of the SUM
        s.grad /= world_size  # the average, as DDP
        p.grad = None  # the full gradient is no longer needed
    optimizer.step()  # Adam on my shards only
    optimizer.zero_grad()
    for p, s in zip(params, shards):
        gather_param(p, s)  # every rank's updated shard, back into the full weights
