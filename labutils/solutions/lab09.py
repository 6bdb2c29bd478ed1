"""Reference solutions for lab 09's exercises. Peek only after trying!"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def all_to_all_single_p2p(output: torch.Tensor, input: torch.Tensor, output_split_sizes=None,
                          input_split_sizes=None, group=None) -> torch.Tensor:
    """Exercise 1: ``dist.all_to_all_single`` from point-to-point operations.

    Block j of ``input`` goes to rank j, block i of ``output`` comes from rank i; this rank's own block
    is a local copy. All sends and receives are posted together (``batch_isend_irecv``), so no rank
    waits for a partner that is itself waiting -- the deadlock of a naive loop of blocking sends.
    """
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    ins = input.split(list(input_split_sizes) if input_split_sizes else input.shape[0] // n)
    outs = output.split(list(output_split_sizes) if output_split_sizes else output.shape[0] // n)
    ops = []
    for peer in range(n):
        if peer == rank:
            outs[peer].copy_(ins[peer])
            continue
        peer_global = dist.get_global_rank(group, peer) if group is not None else peer
        ops.append(dist.P2POp(dist.isend, ins[peer].contiguous(), peer_global, group))
        ops.append(dist.P2POp(dist.irecv, outs[peer], peer_global, group))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return output


def dispatch_with_capacity(x: torch.Tensor, dest: torch.Tensor, capacity: int, group=None):
    """Exercise 2: Switch-Transformer dispatch with a fixed capacity and one even all-to-all.

    Each rank sends each expert at most ``capacity`` tokens -- the first ones, in token order -- in a
    zero-padded slot of ``capacity`` rows, so every block has the same size and no counts need to be
    exchanged. Tokens over capacity are dropped (the layer passes them on through the residual).

    Returns:
        ``received``: (n * capacity, hidden), block s = the slot rank s filled for this rank's expert;
        ``kept``: (tokens,) bool, which of this rank's tokens were sent.
    """
    n = dist.get_world_size(group)
    onehot = F.one_hot(dest, n)                                   # (tokens, n)
    position = (onehot.cumsum(0) - 1).gather(1, dest[:, None]).squeeze(1)   # k-th token for its expert
    kept = position < capacity
    send = x.new_zeros((n * capacity,) + tuple(x.shape[1:]))
    send[dest[kept] * capacity + position[kept]] = x[kept]
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received, kept


def sync_sp_grads(block, group=None) -> None:
    """Exercise 3: sum over ranks the gradients of the parameters used on sequence shards.

    Under sequence parallelism the LayerNorm and the bias added after the reduce-scatter see only this
    rank's tokens, so each rank holds a partial gradient; the full gradient is the sum. The column and
    row shards already hold their full gradients and must not be touched.
    """
    for p in (block.norm.weight, block.norm.bias, block.down_bias):
        if p.grad is not None:
            dist.all_reduce(p.grad, group=group)


def sp_plan() -> dict:
    """Exercise 4: the ``parallelize_module`` plan for the block under sequence parallelism (sequence =
    dim 0): LayerNorm on sequence shards; the column-parallel layer all-gathers its input from sequence
    shards; the row-parallel layer reduce-scatters its output back into them."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    return {"norm": SequenceParallel(sequence_dim=0),
            "up": ColwiseParallel(input_layouts=Shard(0)),
            "down": RowwiseParallel(output_layouts=Shard(0))}
