"""Lab 02's correctness harness: the notebook's tensor-parallel code against one-device PyTorch.

Every check runs inside launched ranks (``fn(rank, world_size, ...)``), takes the notebook's own
classes as arguments (they travel to the ranks by value), and returns ``{quantity: "assert_close OK" |
the mismatch}`` -- text, never timings, so that a notebook cell prints the same on gloo + CPU tensors
and on NCCL + GPUs::

    reports = POOL.run(verify.column_parallel, ColumnParallelLinear)
    compare.report(reports)        # one line per quantity: OK on every rank, or where it differs

``operators``: Megatron's f and g (forward and backward). ``column_parallel``, ``row_parallel``: a
layer built from an ``nn.Linear`` against that ``nn.Linear`` (output and every gradient). ``mlp``: the
tensor-parallel MLP against the ``nn.Sequential`` it was built from. The one-device reference is
float64 and seeded on the CPU, so every rank and every machine builds the same numbers.
``uneven_list_gather``: ``dist.all_gather`` into tensors of different sizes, per backend.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ...bandwidth import format_size
from ...config import rank_device
from ...instruments import compare
from ...instruments.ledger import Ledger

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}
OK = "assert_close OK"


def outcome(got, expected) -> str:
    """``OK`` if ``compare.close(got, expected)``, else what differs (``compare.mismatch``)."""
    return compare.mismatch(got, expected) or OK


def shard(t: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """This rank's equal slice of ``t`` along ``dim``."""
    return t.chunk(dist.get_world_size(group), dim=dim)[dist.get_rank(group)]


def _seeded(*shapes, seed: int, dev, dt) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)      # the same tensors on every rank and machine
    return [torch.randn(*s, generator=gen, dtype=torch.float64).to(dev, dt) for s in shapes]


def reference_linear(in_features: int, out_features: int, *, seed: int = 0, device=None,
                     dtype=torch.float64) -> nn.Linear:
    """``nn.Linear`` initialised from ``seed`` on the CPU, then moved."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = nn.Linear(in_features, out_features, dtype=torch.float64)
    return layer.to(device=device, dtype=dtype)


def reference_mlp(hidden: int, ffn_hidden: int, *, seed: int = 0, device=None, dtype=torch.float64) -> nn.Sequential:
    """``Linear(h, f) -> GELU -> Linear(f, h)`` initialised from ``seed`` on the CPU, then moved."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        seq = nn.Sequential(nn.Linear(hidden, ffn_hidden, dtype=torch.float64), nn.GELU(),
                            nn.Linear(ffn_hidden, hidden, dtype=torch.float64))
    return seq.to(device=device, dtype=dtype)


def operators(rank: int, world_size: int, CopyToTP, ReduceFromTP, size: int = 6) -> dict[str, str]:
    """f (``CopyToTP``) and g (``ReduceFromTP``), forward and backward, against their definitions:
    f(x) = x and dL/dx = sum over ranks of each rank's gradient; g(x_r) = sum over ranks of x_r and
    dL/dx_r = dL/dz. Every rank feeds different numbers where the operator must combine ranks."""
    dev = rank_device()
    x, w_same = _seeded((size,), (size,), seed=1, dev=dev, dt=torch.float64)
    w_rank = [_seeded((size,), seed=10 + r, dev=dev, dt=torch.float64)[0] for r in range(world_size)]
    xf = x.clone().requires_grad_()
    y = CopyToTP.apply(xf, None)
    (y * w_rank[rank]).sum().backward()                         # each rank's loss weights y differently
    xg = (x * (rank + 1)).requires_grad_()
    z = ReduceFromTP.apply(xg, None)
    (z * w_same).sum().backward()
    return {"f forward: y = x": outcome(y, x),
            "f backward: dL/dx = sum of every rank's dL/dy": outcome(xf.grad, sum(w_rank)),
            "g forward: z = sum of every rank's x": outcome(z, x * sum(range(1, world_size + 1))),
            "g backward: dL/dx = dL/dz": outcome(xg.grad, w_same)}


def _forward_backward(ref, model, x, dz, *, slice_input=False, slice_output=False):
    """The one-device ``ref`` on the whole ``x``, the parallel ``model`` on ``x`` (or this rank's slice of its
    features); each back-propagates ``dz`` (the model: this rank's columns of it, if its output is a slice).
    Returns ``(out_ref, out, x_ref, x_model, issued)``, the inputs holding their gradients; ``issued`` is what
    the model communicated, ``[(op, size_bytes), ...]`` for forward and for backward (``Ledger``)."""
    x_ref = x.clone().requires_grad_()
    x_model = (shard(x, -1) if slice_input else x).clone().requires_grad_()
    out_ref = ref(x_ref)
    with Ledger("forward") as fwd:
        out = model(x_model)
    out_ref.backward(dz)
    with Ledger("backward") as bwd:
        out.backward(shard(dz, -1) if slice_output else dz)
    issued = {phase: [(r.op, r.size_bytes) for r in book.records] for phase, book in (("forward", fwd),
                                                                                     ("backward", bwd))}
    return out_ref, out, x_ref, x_model, issued


def traffic(issued: dict, expected: dict) -> dict[str, str | bool]:
    """Two statements on what a layer communicated: what it issued, forward and backward (the same text on
    every machine: ops and sizes), and whether that is what Megatron's design needs (``expected``, in the
    same form as ``issued``)."""
    said = lambda calls: ", ".join(f"{op} of {format_size(size)}" for op, size in calls) or "nothing"  # noqa: E731
    return {"communication: forward": said(issued["forward"]), "communication: backward": said(issued["backward"]),
            "communication is what Megatron's design needs": issued == expected}


def column_parallel(rank: int, world_size: int, ColumnParallelLinear, tokens: int = 5,
                    in_features: int = 8, out_features: int = 12) -> dict[str, str]:
    """``ColumnParallelLinear(linear)`` against ``linear``: this rank's columns of the output, the full
    gradient of the input (every rank's), and this rank's shards of the weight and bias gradients; the
    communication: none forward, f's all-reduce of dL/dX backward."""
    dev = rank_device()
    ref = reference_linear(in_features, out_features, seed=2, device=dev)
    layer = ColumnParallelLinear(ref)
    x, dy = _seeded((tokens, in_features), (tokens, out_features), seed=3, dev=dev, dt=torch.float64)
    y_ref, y, x_ref, x_tp, issued = _forward_backward(ref, layer, x, dy, slice_output=True)
    return {"output: this rank's columns of Y": outcome(y, shard(y_ref, -1)),
            "grad of X (whole, on every rank)": outcome(x_tp.grad, x_ref.grad),
            "grad of the weight shard": outcome(layer.weight.grad, shard(ref.weight.grad, 0)),
            "grad of the bias shard": outcome(layer.bias.grad, shard(ref.bias.grad, 0)),
            **traffic(issued, {"forward": [], "backward": [("all_reduce", x.numel() * 8)]})}


def row_parallel(rank: int, world_size: int, RowParallelLinear, tokens: int = 5, in_features: int = 12,
                 out_features: int = 8) -> dict[str, str]:
    """``RowParallelLinear(linear)`` fed this rank's slice of the input features, against ``linear``:
    the whole output on every rank, this rank's slice of the input gradient, its weight shard's
    gradient and the (replicated) bias gradient; the communication: g's all-reduce of Z forward, none
    backward."""
    dev = rank_device()
    ref = reference_linear(in_features, out_features, seed=4, device=dev)
    layer = RowParallelLinear(ref)
    x, dz = _seeded((tokens, in_features), (tokens, out_features), seed=5, dev=dev, dt=torch.float64)
    z_ref, z, x_ref, x_i, issued = _forward_backward(ref, layer, x, dz, slice_input=True)
    return {"output Z (whole, on every rank)": outcome(z, z_ref),
            "grad of X_i (this rank's slice)": outcome(x_i.grad, shard(x_ref.grad, -1)),
            "grad of the weight shard": outcome(layer.weight.grad, shard(ref.weight.grad, 1)),
            "grad of the bias": outcome(layer.bias.grad, ref.bias.grad),
            **traffic(issued, {"forward": [("all_reduce", dz.numel() * 8)], "backward": []})}


def mlp(rank: int, world_size: int, TensorParallelMLP, hidden: int = 16, ffn_hidden: int = 48,
        tokens: int = 8) -> dict[str, str]:
    """``TensorParallelMLP(seq)`` against the one-device ``seq = Linear -> GELU -> Linear``: output and
    every gradient (input, both weights, both biases), in float64; the communication: one all-reduce of
    tokens x hidden each way, nothing between the layers."""
    dev = rank_device()
    ref = reference_mlp(hidden, ffn_hidden, seed=6, device=dev)
    tp = TensorParallelMLP(ref)
    x, dz = _seeded((tokens, hidden), (tokens, hidden), seed=7, dev=dev, dt=torch.float64)
    z_ref, z, x_ref, x_tp, issued = _forward_backward(ref, tp, x, dz)
    one = [("all_reduce", tokens * hidden * 8)]
    return {"output Z": outcome(z, z_ref), "grad of X": outcome(x_tp.grad, x_ref.grad),
            "grad of A (column shard)": outcome(tp.up.weight.grad, shard(ref[0].weight.grad, 0)),
            "grad of A's bias": outcome(tp.up.bias.grad, shard(ref[0].bias.grad, 0)),
            "grad of B (row shard)": outcome(tp.down.weight.grad, shard(ref[2].weight.grad, 1)),
            "grad of B's bias": outcome(tp.down.bias.grad, ref[2].bias.grad),
            **traffic(issued, {"forward": one, "backward": one})}


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
        if group is not None:
            dist.destroy_process_group(group)
    return result
