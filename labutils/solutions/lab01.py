"""Reference solutions of lab 01's exercises (torch.cuda.comm). Peek only after trying!"""
from __future__ import annotations

import torch


def all_reduce_from_reduce_add(tensors, comm):
    """Exercise 3: all-reduce = reduce_add onto one GPU, then broadcast back to every GPU.

    Returns one tensor per input, on the input's device, each holding the sum of all inputs.
    """
    total = comm.reduce_add(tensors, destination=tensors[0].device)  # the sum, on the first GPU
    return list(comm.broadcast(total, [t.device for t in tensors]))  # [0] is total itself


def broadcast_many(tensors, devices, comm):
    """Exercise 1: broadcast many tensors with ONE broadcast: flatten, broadcast, split.

    Returns ``out[k][j]``: tensor ``j`` on ``devices[k]`` (same shape as ``tensors[j]``).
    """
    flat = torch.cat([t.reshape(-1) for t in tensors])  # one contiguous buffer (one dtype)
    copies = comm.broadcast(flat, devices)
    sizes = [t.numel() for t in tensors]
    return [[piece.view_as(t) for piece, t in zip(copy.split(sizes), tensors)] for copy in copies]


def flat_views(tensors):
    """Exercise 2: one flat buffer and a view of it per tensor (made once, reused by every transfer).

    Returns ``(flat, views)``: ``flat`` holds the tensors' elements in order; ``views[j]`` has the shape
    of ``tensors[j]`` and shares ``flat``'s memory, so filling ``flat`` (one broadcast) fills every view.
    """
    flat = torch.cat([t.reshape(-1) for t in tensors])            # the one copy, made once
    pieces = flat.split([t.numel() for t in tensors])              # views of flat
    return flat, [piece.view(t.shape) for piece, t in zip(pieces, tensors)]
