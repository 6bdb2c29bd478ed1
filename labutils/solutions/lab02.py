"""Reference solutions for lab 02's exercises. Peek only after trying!"""
from __future__ import annotations

import torch

from ..labs.lab02_tensor_parallel import comm


def gather_rows_uneven(x: torch.Tensor, group=None) -> torch.Tensor:
    """Exercise 1: all-gather row blocks of different lengths, in rank order.

    The four steps live in ``labutils.labs.lab02_tensor_parallel.comm.all_gather_uneven`` (read
    it there): all-gather the row counts, pad every block to the longest, one
    ``all_gather_into_tensor``, drop the padding.
    """
    return comm.all_gather_uneven(x, group)


def row_parallel_forward(x_shard: torch.Tensor, weight_shard: torch.Tensor, bias: torch.Tensor,
                         group=None) -> torch.Tensor:
    """Exercise 2: ``Z = sum_i X_i B_i^T + b``, differentiable.

    ``x_shard`` is this rank's slice ``X_i`` of the input features, ``weight_shard`` the matching
    columns ``B_i`` of the ``nn.Linear`` weight; the bias is added once, after the sum.
    """
    partial = x_shard @ weight_shard.T  # X_i B_i^T: this rank's term
    return comm.reduce_from_tp_region(partial, group) + bias  # g: all-reduce fwd, identity bwd


def predict_allreduce_ms(tokens: int, hidden: int, bytes_per_element: int, fit) -> float:
    """Exercise 3: the MLP's all-reduce moves Z, ``tokens x hidden`` elements; the fitted
    alpha-beta model gives its time: ``t = alpha + S / beta``."""
    size_bytes = tokens * hidden * bytes_per_element
    return fit.alpha_us * 1e-3 + size_bytes / (fit.beta_gbps * 1e9) * 1e3
