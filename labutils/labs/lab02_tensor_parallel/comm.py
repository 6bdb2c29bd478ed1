"""Autograd-aware communication for tensor parallelism (Megatron-LM's f/g operators), kept apart
from the layers that use them, as picotron keeps ``tp_communications.py`` apart from its model.

Megatron-LM (Shoeybi et al. 2019, "Megatron-LM: Training Multi-Billion Parameter Language Models
Using Model Parallelism", section 3, figure 3) splits an MLP ``Y = GeLU(X A) B`` over ``p`` ranks
and needs exactly two conjugate operators:

=======================  ==========================  ==========================  =========
function                 forward                     backward                    Megatron
=======================  ==========================  ==========================  =========
copy_to_tp_region        identity                    all_reduce(grad)            f
reduce_from_tp_region    all_reduce(x)               identity                    g
gather_from_tp_region    all_gather on the last dim  keep this rank's slice      --
split_to_tp_region       keep this rank's slice      all_gather on the last dim  --
=======================  ==========================  ==========================  =========

Every function takes ``group`` (None = the default group) and an optional ``timer``
(:class:`CommTimer`) that brackets the collective with ``timing.Clock`` marks (CUDA events on a
GPU) *inside* a real step, so the lab can say how long the communication of a step took. With one
rank every function is the identity. Run the CPU tests with ``pytest tests/test_tensor_parallel.py``.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

from ... import timing
from ...compat import all_gather_into_tensor


class CommTimer:
    """Times the collectives that these operators issue inside a step, per name, in ms.

    Each collective is bracketed by two ``timing.Clock`` marks on the tensor's device: on CUDA,
    events on the *current* stream -- a blocking NCCL call makes that stream wait for NCCL's, so
    the pair measures what the step really waited for (the transfer plus any wait for a slower
    rank); on CPU, perf_counter.

    Usage::

        timer = CommTimer()
        mlp = TensorParallelMLP(..., timer=timer)
        timer.enabled = True; step(); step(); timer.enabled = False
        timer.times_ms()   # {"all_reduce fwd": [..], "all_reduce bwd": [..]}

    It is off by default so that the step timings themselves carry no event overhead.
    """

    def __init__(self, enabled: bool = False):
        self.enabled = enabled
        self._records: list = []

    @contextlib.contextmanager
    def region(self, name: str, tensor: torch.Tensor):
        """Time the body as collective ``name`` (a no-op while disabled)."""
        if not self.enabled:
            yield
            return
        clock = timing.Clock(tensor.device)
        start = clock.mark()
        yield
        self._records.append((name, clock, start, clock.mark()))

    def times_ms(self) -> dict[str, list[float]]:
        """Elapsed ms of every timed collective, grouped by name (synchronises the GPU)."""
        out: dict[str, list[float]] = {}
        for clock in {c.device: c for _, c, _, _ in self._records}.values():
            clock.synchronize()
        for name, clock, start, stop in self._records:
            out.setdefault(name, []).append(clock.elapsed_ms(start, stop))
        return out

    def reset(self) -> None:
        self._records.clear()


def _timed(timer: CommTimer | None, name: str, tensor: torch.Tensor):
    return timer.region(name, tensor) if timer is not None else contextlib.nullcontext()


def _world(group) -> tuple[int, int]:
    return dist.get_rank(group), dist.get_world_size(group)


def check_divisible(size: int, world_size: int, what: str) -> None:
    """Raise ValueError (with a HINT) unless ``size`` splits into ``world_size`` equal shards."""
    if size % world_size:
        raise ValueError(f"{what} = {size} is not divisible by the tensor-parallel world size "
                         f"{world_size}. HINT: Megatron-style layers need equal shards; choose a "
                         f"size that is a multiple of {world_size}, or pad it.")


def _all_reduce_(x: torch.Tensor, group, timer, name: str) -> torch.Tensor:
    with _timed(timer, name, x):
        dist.all_reduce(x, group=group)
    return x


def _gather_last_dim(x: torch.Tensor, group, timer, name: str) -> torch.Tensor:
    rank, n = _world(group)
    x = x.contiguous()
    out = torch.empty((n * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    with _timed(timer, name, x):
        all_gather_into_tensor(out, x, group=group)  # blocks concatenated along dim 0, rank order
    return torch.cat(out.chunk(n, dim=0), dim=-1)


def _split_last_dim(x: torch.Tensor, group) -> torch.Tensor:
    rank, n = _world(group)
    check_divisible(x.shape[-1], n, "the last dimension")
    return x.chunk(n, dim=-1)[rank].contiguous()


class _CopyToTP(torch.autograd.Function):
    """f: identity forward, all_reduce of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, timer):
        ctx.group, ctx.timer = group, timer
        return x

    @staticmethod
    def backward(ctx, grad):
        # in place, as Megatron-LM's _reduce: the incoming gradient is a fresh matmul output.
        return _all_reduce_(grad.contiguous(), ctx.group, ctx.timer, "all_reduce bwd"), None, None


class _ReduceFromTP(torch.autograd.Function):
    """g: all_reduce forward, identity backward (d(sum_i y_i)/dy_i = 1)."""

    @staticmethod
    def forward(ctx, x, group, timer):
        if x.is_contiguous() and not (x.is_leaf and x.requires_grad):
            ctx.mark_dirty(x)  # reduce in place and tell autograd that the input changed
        else:  # a leaf that requires grad cannot change in place; a strided view cannot be reduced
            x = x.contiguous().clone()
        return _all_reduce_(x, group, timer, "all_reduce fwd")

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


class _GatherFromTP(torch.autograd.Function):
    """all_gather on the last dim forward; backward keeps this rank's slice of the gradient."""

    @staticmethod
    def forward(ctx, x, group, timer):
        ctx.group = group
        return _gather_last_dim(x, group, timer, "all_gather fwd")

    @staticmethod
    def backward(ctx, grad):
        return _split_last_dim(grad, ctx.group), None, None


class _SplitToTP(torch.autograd.Function):
    """keep this rank's slice of the last dim forward; all_gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group, timer):
        ctx.group, ctx.timer = group, timer
        return _split_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last_dim(grad, ctx.group, ctx.timer, "all_gather bwd"), None, None


def copy_to_tp_region(x: torch.Tensor, group=None, timer: CommTimer | None = None) -> torch.Tensor:
    """Megatron's f: returns ``x``; in backward, all-reduces (sums) the gradient over ``group``."""
    return x if dist.get_world_size(group) == 1 else _CopyToTP.apply(x, group, timer)


def reduce_from_tp_region(x: torch.Tensor, group=None, timer: CommTimer | None = None) -> torch.Tensor:
    """Megatron's g: all-reduces (sums) ``x`` over ``group``; identity in backward.

    Reduces in place (as Megatron-LM does) unless ``x`` is a leaf that requires grad or is not
    contiguous, so pass a tensor nothing else needs, e.g. a fresh matmul output.
    """
    return x if dist.get_world_size(group) == 1 else _ReduceFromTP.apply(x, group, timer)


def gather_from_tp_region(x: torch.Tensor, group=None, timer: CommTimer | None = None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along the last dim (rank order); backward keeps our slice."""
    return x if dist.get_world_size(group) == 1 else _GatherFromTP.apply(x, group, timer)


def split_to_tp_region(x: torch.Tensor, group=None, timer: CommTimer | None = None) -> torch.Tensor:
    """Keep this rank's slice of the last dim of ``x``; backward all-gathers the gradient.

    Raises:
        ValueError: the last dim is not divisible by the group size.
    """
    return x if dist.get_world_size(group) == 1 else _SplitToTP.apply(x, group, timer)


def all_gather_uneven(x: torch.Tensor, group=None) -> torch.Tensor:
    """All-gather row blocks whose lengths differ between ranks; returns them concatenated.

    NCCL's ``ncclAllGather`` (and so ``all_gather_into_tensor``) moves the same count from every
    rank. So: (1) all-gather the row counts, (2) pad every block to the longest, (3) one
    ``all_gather_into_tensor`` of the padded blocks, (4) drop the padding. This is what
    ``dist.all_gather_object`` does internally with its pickled byte strings. Costs: one tiny
    extra collective and ``(max_rows - rows)`` rows of padding on each rank.

    Args:
        x: this rank's block, shape ``(rows_r, *rest)``; ``rest`` and dtype equal on all ranks.

    Returns:
        ``(sum_r rows_r, *rest)`` on every rank, blocks in rank order.
    """
    rank, n = _world(group)
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
