"""Lab 04's model: a stack of pre-LayerNorm residual MLP blocks (a transformer without attention).

Every block keeps the activation's shape (rows, hidden), so any cut between blocks sends
rows x hidden values; block i is initialised from its own seed, so every rank builds the same
weights for the blocks it owns::

    from labutils.labs.lab04_pipeline import model
    blocks = model.make_blocks(8, 4096, device="cuda:0", dtype=torch.bfloat16)
    x, target = model.make_batch(8192, 4096, device="cuda:0", dtype=torch.bfloat16)
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    """x + W2 gelu(W1 LayerNorm(x)): the MLP half of a transformer layer (8 hidden^2 weights)."""

    def __init__(self, hidden: int, device=None, dtype=None):
        super().__init__()
        kw = {"device": device, "dtype": dtype}
        self.norm = nn.LayerNorm(hidden, **kw)
        self.fc1 = nn.Linear(hidden, 4 * hidden, **kw)
        self.fc2 = nn.Linear(4 * hidden, hidden, **kw)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


def make_blocks(n_layers: int, hidden: int, *, seed: int = 0, device="cpu", dtype=torch.float32,
                layers=None) -> list[Block]:
    """Blocks ``layers`` (default: all) of the model; block i is initialised from seed ``seed + i``
    on ``device``, so every rank builds the same weights for the blocks it owns."""
    out = []
    for i in (range(n_layers) if layers is None else layers):
        torch.manual_seed(seed + i)
        out.append(Block(hidden, device=device, dtype=dtype))
    return out


def make_batch(rows: int, hidden: int, *, seed: int = 1000, device="cpu", dtype=torch.float32):
    """(x, target), both ``rows x hidden``, drawn on ``device`` from a seeded generator."""
    g = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(rows, hidden, generator=g, device=device, dtype=dtype) for _ in range(2))
