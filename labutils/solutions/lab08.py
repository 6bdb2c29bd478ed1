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


class OverlappedGradients:
    """Exercise "build your DDP" (b): every gradient's all-reduce starts the moment backward has
    accumulated it, asynchronously, so that it runs while backward computes earlier layers.

    ``register_post_accumulate_grad_hook`` runs the hook after ``p.grad`` holds this backward's gradient;
    ``dist.all_reduce(..., async_op=True)`` returns a handle at once. ``finish()`` (before the optimizer)
    waits for every handle: the averaged gradients are then in ``p.grad``.
    """

    def __init__(self, model):
        self.world_size = dist.get_world_size()
        self.handles = []
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.start)

    def start(self, p):
        p.grad /= self.world_size  # divide first (as DDP does): the all-reduce then sums to the mean
        self.handles.append(dist.all_reduce(p.grad, async_op=True))

    def finish(self):
        for handle in self.handles:
            handle.wait()
        self.handles.clear()


class BucketedGradients:
    """Exercise "build your DDP" (c): DDP's buckets. The parameters, in reverse order (about the order
    backward produces their gradients), are packed into buckets: a bucket is full once it holds at least
    ``bucket_cap_bytes``; the last one may hold less. Each gradient is copied into its bucket's flat buffer
    when it is ready; when a bucket's last gradient has arrived, one async all-reduce of the whole buffer
    starts. ``finish()`` waits for them all and copies the averaged buckets back into ``p.grad``.
    """

    def __init__(self, model, bucket_cap_bytes):
        self.world_size = dist.get_world_size()
        params = [p for p in model.parameters() if p.requires_grad]
        self.buckets, current, size = [], [], 0
        for p in reversed(params):
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= bucket_cap_bytes:
                self.buckets.append(current)
                current, size = [], 0
        if current:
            self.buckets.append(current)
        self.where = {}  # parameter -> (bucket index, offset in the bucket's buffer)
        self.buffers = []
        for b, bucket in enumerate(self.buckets):
            offset = 0
            for p in bucket:
                self.where[p] = (b, offset)
                offset += p.numel()
            self.buffers.append(torch.zeros(offset, dtype=bucket[0].dtype, device=bucket[0].device))
        self.pending = [len(bucket) for bucket in self.buckets]
        self.handles = []
        for p in params:
            p.register_post_accumulate_grad_hook(self.ready)

    def ready(self, p):
        b, offset = self.where[p]
        self.buffers[b][offset:offset + p.numel()].copy_(p.grad.reshape(-1))
        self.pending[b] -= 1
        if self.pending[b] == 0:  # the bucket's last gradient: reduce the whole bucket now
            self.buffers[b] /= self.world_size
            self.handles.append(dist.all_reduce(self.buffers[b], async_op=True))

    def finish(self):
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
        for bucket, buffer in zip(self.buckets, self.buffers):
            offset = 0
            for p in bucket:
                p.grad.copy_(buffer[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        self.pending = [len(bucket) for bucket in self.buckets]


def zero2_attach(params, shards):
    """Exercise ZeRO-2: reduce-scatter each gradient the moment backward has accumulated it, keep only this
    rank's averaged piece as the shard's gradient, and free the full gradient: no rank ever holds all the
    gradients. Returns the hook handles."""
    import functools
    world_size = dist.get_world_size()

    def reduce_scatter_now(p, shard):
        piece = torch.empty_like(shard)
        compat.reduce_scatter_tensor(piece, padded_flat(p.grad, world_size))  # my piece of the SUM
        piece /= world_size  # the average, as DDP
        shard.grad = piece if shard.grad is None else shard.grad + piece  # accumulation still works
        p.grad = None  # the full gradient is freed right here, during backward

    return [p.register_post_accumulate_grad_hook(functools.partial(reduce_scatter_now, shard=s))
            for p, s in zip(params, shards)]
