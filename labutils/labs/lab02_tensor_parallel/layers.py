"""Megatron-style tensor-parallel layers: ColumnParallelLinear, RowParallelLinear, and the MLP
that chains them with a single all-reduce in the forward pass.

Paper: Shoeybi et al. 2019, "Megatron-LM", section 3. The MLP is ``Z = GeLU(X A) B``:

* ``A`` is split by columns, ``A = [A_1, ..., A_p]``: rank i computes ``Y_i = GeLU(X A_i)`` with
  no communication (GeLU is elementwise, so splitting *before* it is exact);
* ``B`` is split by rows, ``B = [B_1; ...; B_p]``: rank i computes the partial product
  ``Y_i B_i`` and one all-reduce (Megatron's ``g``) sums them: ``Z = sum_i Y_i B_i``.

In backward the conjugate operator ``f`` all-reduces ``dL/dX``. ``nn.Linear`` stores ``A^T``
(``weight`` is ``[out_features, in_features]``), so "split A by columns" is ``weight.chunk(p, 0)``
and "split B by rows" is ``weight.chunk(p, 1)``. Communication lives in ``comm``, the cost model
in ``cost_model``.

Example (inside a launched rank; run the tests with ``pytest tests/test_tensor_parallel.py``)::

    ref = reference_mlp(hidden=64, seed=0)               # one-device nn.Sequential
    tp = TensorParallelMLP.from_sequential(ref)          # this rank's shards of the same weights
    torch.testing.assert_close(tp(x), ref(x))
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from . import comm


def shard(t: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """This rank's equal slice of ``t`` along ``dim`` (a contiguous copy).

    Raises:
        ValueError: ``t.shape[dim]`` is not divisible by the group size.
    """
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    comm.check_divisible(t.shape[dim], n, f"size of dim {dim}")
    return t.chunk(n, dim=dim)[rank].contiguous()


def _uniform_(t: torch.Tensor, fan_in: int) -> None:
    """nn.Linear's default init, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), with the *full* fan-in."""
    bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
    nn.init.uniform_(t, -bound, bound)


def _sharded_copy(cls, linear: nn.Linear, dim: int, group, **kw) -> nn.Module:
    """A ``cls`` layer holding this rank's slice (along weight dim ``dim``) of ``linear``'s values.
    The bias follows the output features: sharded with them (dim 0), replicated otherwise."""
    layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group=group,
                device=linear.weight.device, dtype=linear.weight.dtype, **kw)
    with torch.no_grad():
        layer.weight.copy_(shard(linear.weight, dim, group))
        if linear.bias is not None:
            layer.bias.copy_(shard(linear.bias, 0, group) if dim == 0 else linear.bias)
    return layer


class ColumnParallelLinear(nn.Module):
    """``Y = X A + b`` with ``A`` split by columns: this rank holds ``A_i`` and ``b_i``.

    Args:
        in_features, out_features: sizes of the *full* layer; ``out_features`` must be divisible
            by the group size.
        gather_output: all-gather ``Y_i`` along the last dim so every rank returns the full ``Y``
            (set False when a RowParallelLinear consumes ``Y_i`` directly, as in the MLP).
        group: process group (None = default); timer: optional ``comm.CommTimer``.

    Shapes: input ``(..., in_features)``; output ``(..., out_features)`` if ``gather_output``
    else ``(..., out_features / p)``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 gather_output: bool = True, group=None, timer=None, device=None, dtype=None):
        super().__init__()
        n = dist.get_world_size(group)
        comm.check_divisible(out_features, n, "out_features")
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.group, self.timer = gather_output, group, timer
        kw = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.empty(out_features // n, in_features, **kw))
        self.bias = nn.Parameter(torch.empty(out_features // n, **kw)) if bias else None
        _uniform_(self.weight, in_features)
        if self.bias is not None:
            _uniform_(self.bias, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = comm.copy_to_tp_region(x, self.group, self.timer)  # f: all-reduce dL/dX in backward
        y = F.linear(x, self.weight, self.bias)  # X A_i + b_i: no communication
        return comm.gather_from_tp_region(y, self.group, self.timer) if self.gather_output else y

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, gather_output: bool = True, group=None,
                    timer=None) -> "ColumnParallelLinear":
        """This rank's column shard of an existing ``nn.Linear`` (same values, for testing)."""
        return _sharded_copy(cls, linear, 0, group, gather_output=gather_output, timer=timer)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features} "
                f"(this rank: {self.weight.shape[0]}), gather_output={self.gather_output}")


class RowParallelLinear(nn.Module):
    """``Z = X B + b = sum_i X_i B_i + b`` with ``B`` split by rows: this rank holds ``B_i``.

    The bias is replicated and added once, *after* the all-reduce (adding it before would count
    it p times).

    Args:
        in_features, out_features: sizes of the *full* layer; ``in_features`` must be divisible
            by the group size.
        input_is_parallel: the input is already this rank's slice ``X_i`` (the output of a
            ColumnParallelLinear with ``gather_output=False``); otherwise it is split here.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 input_is_parallel: bool = False, group=None, timer=None, device=None, dtype=None):
        super().__init__()
        n = dist.get_world_size(group)
        comm.check_divisible(in_features, n, "in_features")
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel, self.group, self.timer = input_is_parallel, group, timer
        kw = dict(device=device, dtype=dtype)
        self.weight = nn.Parameter(torch.empty(out_features, in_features // n, **kw))
        self.bias = nn.Parameter(torch.empty(out_features, **kw)) if bias else None
        _uniform_(self.weight, in_features)
        if self.bias is not None:
            _uniform_(self.bias, in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = comm.split_to_tp_region(x, self.group, self.timer)
        partial = F.linear(x, self.weight)  # X_i B_i: this rank's term of the sum
        z = comm.reduce_from_tp_region(partial, self.group, self.timer)  # g: one all-reduce
        return z + self.bias if self.bias is not None else z

    @classmethod
    def from_linear(cls, linear: nn.Linear, *, input_is_parallel: bool = False, group=None,
                    timer=None) -> "RowParallelLinear":
        """This rank's row shard of an existing ``nn.Linear`` (same values, for testing)."""
        return _sharded_copy(cls, linear, 1, group, input_is_parallel=input_is_parallel, timer=timer)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features} (this rank: {self.weight.shape[1]}), "
                f"out_features={self.out_features}, input_is_parallel={self.input_is_parallel}")


class TensorParallelMLP(nn.Module):
    """Megatron's MLP ``Z = GeLU(X A) B``: column-parallel ``A``, row-parallel ``B``.

    Communication per step: one all-reduce of ``Z`` (tokens x hidden) in forward, one of
    ``dL/dX`` (same size) in backward; none between the two layers.

    Args:
        hidden: model width h; ffn_hidden: inner width (default 4h), divisible by the group size.
        approximate: GeLU variant, as ``nn.GELU``.
    """

    def __init__(self, hidden: int, ffn_hidden: int | None = None, bias: bool = True, *,
                 group=None, timer=None, device=None, dtype=None, approximate: str = "none"):
        super().__init__()
        ffn_hidden = ffn_hidden or 4 * hidden
        kw = dict(group=group, timer=timer, device=device, dtype=dtype)
        self.up = ColumnParallelLinear(hidden, ffn_hidden, bias, gather_output=False, **kw)
        self.act = nn.GELU(approximate=approximate)
        self.down = RowParallelLinear(ffn_hidden, hidden, bias, input_is_parallel=True, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))

    @classmethod
    def from_sequential(cls, seq: nn.Sequential, group=None, timer=None) -> "TensorParallelMLP":
        """Shard a one-device ``nn.Sequential(nn.Linear, nn.GELU, nn.Linear)`` onto this rank.

        Raises:
            TypeError: ``seq`` is not Linear -> GELU -> Linear.
        """
        parts = list(seq)
        if len(parts) != 3 or not (isinstance(parts[0], nn.Linear) and isinstance(parts[1], nn.GELU)
                                   and isinstance(parts[2], nn.Linear)):
            raise TypeError(f"expected nn.Sequential(nn.Linear, nn.GELU, nn.Linear), got "
                            f"{[type(p).__name__ for p in parts]}. HINT: build it with "
                            "layers.reference_mlp(hidden).")
        mlp = cls.__new__(cls)
        nn.Module.__init__(mlp)
        mlp.up = ColumnParallelLinear.from_linear(parts[0], gather_output=False, group=group, timer=timer)
        mlp.act = nn.GELU(approximate=parts[1].approximate)
        mlp.down = RowParallelLinear.from_linear(parts[2], input_is_parallel=True, group=group, timer=timer)
        return mlp


def reference_mlp(hidden: int, ffn_hidden: int | None = None, bias: bool = True, *, seed: int = 0,
                  device=None, dtype=None) -> nn.Sequential:
    """The one-device MLP ``Linear(h, 4h) -> GELU -> Linear(4h, h)``, initialised from ``seed``
    on the CPU (so every rank and every machine builds the same weights), then moved."""
    ffn_hidden = ffn_hidden or 4 * hidden
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        seq = nn.Sequential(nn.Linear(hidden, ffn_hidden, bias), nn.GELU(), nn.Linear(ffn_hidden, hidden, bias))
    return seq.to(device=device, dtype=dtype)
