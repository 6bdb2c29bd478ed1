"""Reference solutions of lab 01's exercises (torch.cuda.comm). Peek only after trying!"""
from __future__ import annotations

import torch


def predict_time_ms(alpha_us: float, beta_gbps: float, size_bytes: float) -> float:
    """Exercise 1: the alpha-beta model t = alpha + S / beta, in ms.

    alpha is in microseconds (1 us = 1e-3 ms); beta in GB/s = 1e9 bytes/s, so S / beta seconds
    = S / (beta * 1e9) s = S / (beta * 1e6) ms. Source: Hockney's model, see labutils.bandwidth.
    """
    return alpha_us * 1e-3 + size_bytes / (beta_gbps * 1e6)


def all_reduce_from_reduce_add(tensors, comm):
    """Exercise 2: all-reduce = reduce_add onto one GPU, then broadcast back to every GPU.

    Returns one tensor per input, on the input's device, each holding the sum of all inputs.
    """
    total = comm.reduce_add(tensors, destination=tensors[0].device)  # the sum, on the first GPU
    return list(comm.broadcast(total, [t.device for t in tensors]))  # [0] is total itself


def broadcast_many(tensors, devices, comm):
    """Exercise 3: broadcast many tensors with ONE broadcast: flatten, broadcast, split.

    Returns ``out[k][j]``: tensor ``j`` on ``devices[k]`` (same shape as ``tensors[j]``).
    """
    flat = torch.cat([t.reshape(-1) for t in tensors])  # one contiguous buffer (one dtype)
    copies = comm.broadcast(flat, devices)
    sizes = [t.numel() for t in tensors]
    return [[piece.view_as(t) for piece, t in zip(copy.split(sizes), tensors)] for copy in copies]
