"""Reference solutions for lab 10's exercises. Peek only after trying!"""
from __future__ import annotations

import torch.distributed as dist

from .. import compat


def hierarchical_all_reduce(tensor, node_group, cross_group) -> None:
    """Exercise 1: sum ``tensor`` (1-D, its length a multiple of the node's size) over every rank, in place:
    reduce-scatter inside the node, all-reduce of this rank's shard across the nodes, all-gather inside the
    node. Only 1/local of the tensor crosses the node boundary."""
    local = dist.get_world_size(node_group)
    shard = tensor.new_empty(tensor.numel() // local)
    compat.reduce_scatter_tensor(shard, tensor, group=node_group)   # my node's sum of my shard
    dist.all_reduce(shard, group=cross_group)                       # + the same shard of the other nodes
    compat.all_gather_into_tensor(tensor, shard, group=node_group)  # every shard back to every rank


def sync_grads(model, mesh) -> None:
    """Exercise 2: average every gradient over the data-parallel dimension of the ("dp", "tp") mesh. The
    tensor-parallel ranks hold different shards of the weights: summing over "tp" would mix shards."""
    group, n = mesh["dp"].get_group(), mesh["dp"].size()
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)
            p.grad.div_(n)


def inter_node_bytes(size_bytes: int, local: int, nodes: int) -> float:
    """Exercise 3's prediction: bytes one rank sends across nodes in the hierarchical all-reduce of
    ``size_bytes``: a ring all-reduce of its 1/local shard among ``nodes`` ranks."""
    return 2 * (nodes - 1) / nodes * size_bytes / local
