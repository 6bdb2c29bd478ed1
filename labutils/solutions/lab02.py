"""Reference solutions for lab 02's exercises. Peek only after trying!"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from ..compat import all_gather_into_tensor


def gather_rows_uneven(x: torch.Tensor, group=None) -> torch.Tensor:
    """Exercise 1: all-gather row blocks whose lengths differ between ranks (and are known only to
    their own rank); returns them concatenated in rank order.

    ``all_gather_into_tensor`` (NCCL's ``ncclAllGather``) moves the same count from every rank, so:
    (1) all-gather the row counts, (2) pad every block to the longest, (3) one ``all_gather_into_tensor``
    of the padded blocks, (4) drop the padding. ``dist.all_gather_object`` does the same internally with
    its pickled byte strings.
    """
    n = dist.get_world_size(group)
    x = x.contiguous()
    counts = torch.empty(n, dtype=torch.int64, device=x.device)
    all_gather_into_tensor(counts, torch.tensor([x.shape[0]], dtype=torch.int64, device=x.device), group)
    counts = counts.tolist()
    longest = max(counts)
    padded = x.new_zeros((longest,) + tuple(x.shape[1:]))
    padded[: x.shape[0]] = x
    out = x.new_empty((n * longest,) + tuple(x.shape[1:]))
    all_gather_into_tensor(out, padded, group)
    return torch.cat([out[r * longest: r * longest + c] for r, c in enumerate(counts)])


class GatherFromTP(torch.autograd.Function):
    """Exercise 2: all-gather along the last dim in forward (every rank gets the whole Y); in backward keep
    this rank's columns of the gradient -- every rank holds the whole dL/dY already, and the operator f in
    front of the column-parallel layer sums dL/dX over the ranks."""

    @staticmethod
    def forward(ctx, y_shard, group):
        ctx.group = group
        blocks = [torch.empty_like(y_shard) for _ in range(dist.get_world_size(group))]
        dist.all_gather(blocks, y_shard.contiguous(), group=group)
        return torch.cat(blocks, dim=-1)

    @staticmethod
    def backward(ctx, grad):
        n, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(n, dim=-1)[rank].contiguous(), None


def transfer_and_wait(calls_ms: list[list[float]]) -> tuple[float, float]:
    """Exercise 3: ``calls_ms[rank][i]`` is the NCCL kernel time of call i on each rank. Call i is the same
    all-reduce everywhere; its kernel ends on every rank when the last rank's data arrived, so the shortest
    of them is the transfer and the difference to the longest is the time the first rank waited."""
    per_call = list(zip(*calls_ms))                      # (rank 0's time, rank 1's time, ...) per call
    transfer = statistics.median(min(c) for c in per_call)
    wait = statistics.median(max(c) - min(c) for c in per_call)
    return transfer, wait
