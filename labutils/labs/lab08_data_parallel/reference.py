"""The code lab 08 teaches, as a module: data parallelism by hand, ZeRO-1/2 by hand, FSDP2 wrapping.

The notebook defines these same functions in its cells (the learner reads and runs them there) and
passes its own copies to the measurements; this module is what ``record.py``, the tests and the
checkers use outside the notebook. ``tests/test_lab08.py`` checks that the notebook's definitions
and these are the same code, so they cannot drift apart. (The two exercises' references,
``average_gradients`` and ``zero1_step``, are in ``labutils.solutions.lab08``.)
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed import fsdp
from torch.distributed.device_mesh import init_device_mesh

from labutils import compat
from labutils.config import rank_device

__all__ = ["replicate", "split_batch", "all_reduce_sum", "train_data_parallel", "accumulate",
           "padded_flat", "shard_of", "gather_param", "zero2_attach", "zero2_step", "shard_transformer"]


# ---- part 1: data parallelism by hand -------------------------------------------------------------
def replicate(model):
    """Give every rank rank 0's weights: one broadcast per tensor (DDP's constructor does the same)."""
    for t in list(model.parameters()) + list(model.buffers()):
        dist.broadcast(t.data, src=0)
    return model


def split_batch(images, labels):
    """This rank's share of the batch: the r-th of world_size equal slices."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    return images.chunk(world_size)[rank], labels.chunk(world_size)[rank]


def all_reduce_sum(model):
    """Source 002 §2.1 taken literally: pool the gradients by summing them."""
    for p in model.parameters():
        dist.all_reduce(p.grad)  # SUM over ranks, in place


def train_data_parallel(model, batches, optimizer, reduce_gradients):
    """Every rank trains the same model on its share of each batch; gradients pooled before each step."""
    for images, labels in batches:
        x, y = split_batch(images, labels)
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()  # the gradient of the mean loss over MY images
        reduce_gradients(model)  # pool the ranks' gradients
        optimizer.step()  # same gradients + same weights -> same update on every rank
    return model


# ---- part 2: gradient accumulation with DDP --------------------------------------------------------
def accumulate(ddp_model, micro_batches, use_no_sync):
    """Gradient accumulation over micro-batches. Under ``no_sync()`` DDP skips the all-reduce and
    gradients just add up locally; only the last backward all-reduces (the accumulated sum)."""
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        context = ddp_model.no_sync() if use_no_sync and not last else contextlib.nullcontext()
        with context:  # forward AND backward inside: DDP decides in forward whether to sync
            (F.cross_entropy(ddp_model(x), y) / len(micro_batches)).backward()


# ---- part 3: ZeRO by hand -------------------------------------------------------------------------
def padded_flat(t, world_size):
    """``t`` flattened and zero-padded to a multiple of world_size (a view of ``t`` when no padding
    is needed): rank r's shard is the r-th of world_size equal pieces."""
    flat = t.reshape(-1)
    pad = -flat.numel() % world_size
    return F.pad(flat, (0, pad)) if pad else flat


def shard_of(p, world_size, rank):
    """The 1/world_size of parameter ``p`` that this rank's optimizer owns. A view of ``p`` when the
    size divides (updating the shard updates ``p`` in place), else a padded copy of the piece."""
    flat = padded_flat(p.detach(), world_size)
    shard = flat.chunk(world_size)[rank]
    return nn.Parameter(shard if flat.numel() == p.numel() else shard.clone())


def gather_param(p, shard):
    """All-gather every rank's updated shard back into the full parameter ``p`` on every rank."""
    world_size = dist.get_world_size()
    full = padded_flat(p.detach(), world_size)  # a view of p when no padding is needed
    compat.all_gather_into_tensor(full, shard.detach().clone())  # clone: our shard may be a view of full
    if full.numel() != p.numel():  # padded: full is a copy, write it back
        p.detach().copy_(full[: p.numel()].view_as(p))


def zero2_attach(params, shards):
    """ZeRO-2: reduce-scatter each gradient the moment backward has accumulated it, keep only this
    rank's averaged shard, and free the full gradient: no rank ever holds all the gradients."""
    world_size = dist.get_world_size()

    def reduce_scatter_now(p, shard):
        part = torch.empty_like(shard)
        compat.reduce_scatter_tensor(part, padded_flat(p.grad, world_size))  # my shard of the SUM
        part /= world_size  # the average, as DDP
        shard.grad = part if shard.grad is None else shard.grad + part  # accumulation still works
        p.grad = None  # the full gradient is freed right here, during backward

    return [p.register_post_accumulate_grad_hook(functools.partial(reduce_scatter_now, shard=s))
            for p, s in zip(params, shards)]


def zero2_step(params, shards, optimizer):
    """ZeRO-2's step: the gradients are already sharded; update my shards, all-gather the weights."""
    optimizer.step()
    optimizer.zero_grad()
    for p, s in zip(params, shards):
        gather_param(p, s)


# ---- part 4: FSDP2 ----------------------------------------------------------------------------------
def shard_transformer(model, reshard_after_forward=True, prefetch=0):
    """FSDP2 (ZeRO-3): shard every block's parameters over the ranks, then the root's. With
    ``prefetch`` > 0, each block all-gathers the next ``prefetch`` blocks' weights ahead of time."""
    mesh = init_device_mesh(rank_device().type, (dist.get_world_size(),))
    for block in model.blocks:
        fsdp.fully_shard(block, mesh=mesh, reshard_after_forward=reshard_after_forward)
    fsdp.fully_shard(model, mesh=mesh, reshard_after_forward=reshard_after_forward)
    blocks = list(model.blocks)
    if prefetch:
        for i, block in enumerate(blocks):
            block.set_modules_to_forward_prefetch(blocks[i + 1:i + 1 + prefetch])
            block.set_modules_to_backward_prefetch(blocks[max(0, i - prefetch):i][::-1])
    return model
