"""Lab 02's correctness checks, run inside launched ranks: what works, and what equals the reference.

Every function has the rank-function signature ``fn(rank, world_size, ...)`` and returns text
verdicts (never timings), so its output is the same on gloo + CPU tensors and on NCCL + GPUs --
what a notebook's checked cell prints::

    import labutils
    from labutils.labs.lab02_tensor_parallel import verify
    labutils.launch(verify.verify_mlp, backend="gloo")[0]   # {quantity: "assert_close OK"}
    labutils.launch(verify.uneven_list_gather, backend="gloo", world_size=2)[0]["gloo"]

``verify_mlp``: TensorParallelMLP against the one-device MLP it was sharded from (forward output
and every gradient). ``uneven_list_gather``: ``dist.all_gather`` into tensors of different sizes.
``DTYPES`` is shared with the measurements in ``measure``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ...config import rank_device
from .layers import TensorParallelMLP, reference_mlp, shard

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def _close(got: torch.Tensor, expected: torch.Tensor) -> str:
    try:
        torch.testing.assert_close(got.detach(), expected.detach())
        return "assert_close OK"
    except AssertionError as exc:
        return " ".join(str(exc).split("\n")[:3])


def verify_mlp(rank: int, world_size: int, hidden: int = 64, ffn_hidden: int | None = None,
               tokens: int = 8, dtype: str = "float64", seed: int = 0) -> dict[str, str]:
    """Compare TensorParallelMLP with the one-device ``nn.Sequential`` it was sharded from:
    forward output and every gradient (input, both weights, both biases), with
    ``torch.testing.assert_close`` (float64 by default, so rounding noise cannot hide a bug).

    Returns:
        ``{quantity: "assert_close OK" | mismatch message}`` for this rank.
    """
    dev, dt = rank_device(), DTYPES[dtype]
    ref = reference_mlp(hidden, ffn_hidden, seed=seed, device=dev, dtype=dt)
    tp = TensorParallelMLP.from_sequential(ref)
    gen = torch.Generator().manual_seed(seed + 1)  # same x and dL/dZ on every rank and machine
    x = torch.randn(tokens, hidden, generator=gen).to(dev, dt)
    dz = torch.randn(tokens, hidden, generator=gen).to(dev, dt)
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    z_ref, z_tp = ref(x_ref), tp(x_tp)
    z_ref.backward(dz)
    z_tp.backward(dz)
    pairs = {"forward output Z": (z_tp, z_ref), "grad of input X": (x_tp.grad, x_ref.grad),
             "grad of A (column shard)": (tp.up.weight.grad, shard(ref[0].weight.grad, 0)),
             "grad of bias of A": (tp.up.bias.grad, shard(ref[0].bias.grad, 0)),
             "grad of B (row shard)": (tp.down.weight.grad, shard(ref[2].weight.grad, 1)),
             "grad of bias of B": (tp.down.bias.grad, ref[2].bias.grad)}
    return {name: _close(got, exp) for name, (got, exp) in pairs.items()}


def uneven_list_gather(rank: int, world_size: int, rows: int = 999, cols: int = 1000) -> dict:
    """``dist.all_gather`` into a list whose tensors have *different* sizes (torch.tensor_split
    of ``rows``), on the default backend and on a gloo group. Returns per backend "works" or the
    error, e.g. gloo's ``invalid tensor size``; NCCL turns it into one broadcast per rank."""
    result = {}
    groups = [(dist.get_backend(), None, rank_device())]
    if dist.get_backend() != "gloo":
        groups.append(("gloo", dist.new_group(backend="gloo"), torch.device("cpu")))
    for name, group, dev in groups:
        full = torch.arange(rows * cols, dtype=torch.float32, device=dev).reshape(rows, cols)
        parts = torch.tensor_split(full, world_size)
        outs = [torch.empty_like(p) for p in parts]
        try:
            dist.all_gather(outs, parts[rank].clone(), group=group)
            result[name] = f"works, gathered == original: {torch.equal(torch.cat(outs), full)}"
        except RuntimeError as exc:
            result[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    return result
