"""Reference solutions for lab 03 (async point-to-point). Peek only after trying!

Both rings post each step's send and receive *together* with ``dist.batch_isend_irecv``: under NCCL
an ``isend`` followed by an ``irecv`` on every rank can deadlock (lab 03, section 1), and under gloo
a blocking ``dist.send`` on every rank does. The lab times them against NCCL
(``labutils.labs.lab03_async_p2p.measure.ring_vs_collective``).

* ``ring_all_gather(output, input, group=None)``: like ``dist.all_gather_into_tensor``.
* ``ring_all_reduce(tensor, group=None)``: like ``dist.all_reduce`` (sum), in place.
* ``pipelined_all_reduce(chunks, produce)``: each chunk all-reduced while the next one is produced.
"""
from __future__ import annotations

import torch
import torch.distributed as dist


def _neighbours(group) -> tuple[int, int, int, int]:
    """(rank in group, group size, right neighbour, left neighbour) with global ranks for peers."""
    n, r = dist.get_world_size(group), dist.get_rank(group)
    peer = (lambda k: k) if group is None else (lambda k: dist.get_global_rank(group, k))
    return r, n, peer((r + 1) % n), peer((r - 1) % n)


def _step(send: torch.Tensor, recv: torch.Tensor, right: int, left: int, group) -> None:
    """One ring step: send to the right and receive from the left *together* (one batch), so that
    no rank's send waits for a receive that is queued behind it."""
    ops = []
    if send.numel():
        ops.append(dist.P2POp(dist.isend, send, right, group))
    if recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, left, group))
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()


def ring_all_gather(output: torch.Tensor, input: torch.Tensor, group=None) -> None:
    """Ring all-gather with point-to-point ops; same contract as ``all_gather_into_tensor``.

    ``output`` (contiguous, ``n`` times ``input``'s elements) gets rank k's ``input`` in chunk k.
    Step s = 0 .. n-2: rank r sends chunk (r - s) mod n to r + 1 and receives chunk (r - s - 1) mod n
    from r - 1, so after n - 1 steps every chunk has travelled around the ring (each rank sends
    (n-1)/n of the output: nccl-tests' all_gather bus factor).

    Raises:
        ValueError: ``output`` not contiguous or not ``world_size`` times the size of ``input``.
    """
    r, n, right, left = _neighbours(group)
    if not output.is_contiguous() or output.numel() != n * input.numel():
        raise ValueError(f"output must be contiguous with {n} x {input.numel()} elements, got "
                         f"{output.numel()} (contiguous: {output.is_contiguous()}).")
    chunks = output.view(n, -1)
    chunks[r].copy_(input.reshape(-1))
    for s in range(n - 1):
        _step(chunks[(r - s) % n], chunks[(r - s - 1) % n], right, left, group)


def ring_all_reduce(tensor: torch.Tensor, group=None) -> None:
    """Ring all-reduce (sum, in place) = ring reduce-scatter + ring all-gather, with P2P ops.

    The flat tensor is split with ``tensor_split(n)`` (every rank gets the same chunk sizes).
    Reduce-scatter, step s: send chunk (r - s) mod n, receive chunk (r - s - 1) mod n and add it;
    afterwards rank r holds the full sum of chunk (r + 1) mod n. All-gather, step s: send chunk
    (r + 1 - s) mod n, receive chunk (r - s) mod n. Source: Patarasuk & Yuan, "Bandwidth optimal
    all-reduce algorithms for clusters of workstations", JPDC 2009.

    Raises:
        ValueError: ``tensor`` not contiguous.
    """
    r, n, right, left = _neighbours(group)
    if not tensor.is_contiguous():
        raise ValueError("ring_all_reduce needs a contiguous tensor. HINT: pass tensor.contiguous().")
    chunks = tensor.view(-1).tensor_split(n)
    scratch = torch.empty_like(chunks[0])  # tensor_split puts the larger chunks first
    for s in range(n - 1):
        into = scratch[: chunks[(r - s - 1) % n].numel()]
        _step(chunks[(r - s) % n], into, right, left, group)
        chunks[(r - s - 1) % n].add_(into)  # stream-ordered after the receive by wait()
    for s in range(n - 1):
        _step(chunks[(r + 1 - s) % n], chunks[(r - s) % n], right, left, group)


def pipelined_all_reduce(chunks: list, produce) -> None:
    """Sum every chunk over the ranks, each chunk's all-reduce in flight while the next one is produced.

    ``produce(i)`` writes chunk i; its all-reduce starts right after (``async_op=True``: the call returns at
    once), so the transfer of chunk i overlaps the production of chunk i + 1. Every work is waited for at the
    end, once nothing is left to overlap -- the pattern of DDP's gradient buckets during backward.
    """
    works = []
    for i, chunk in enumerate(chunks):
        produce(i)
        works.append(dist.all_reduce(chunk, async_op=True))
    for work in works:
        work.wait()
