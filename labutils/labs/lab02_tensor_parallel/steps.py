"""The tensor-parallel MLP against one GPU, and what its all-reduces cost *inside* a step.

Run inside launched ranks with the notebook's own ``TensorParallelMLP`` (any class built as
``cls(nn.Sequential(Linear, GELU, Linear), group)``)::

    rows = POOL.run(steps.tp_mlp_sweep, TensorParallelMLP, [1024, 4096], tokens=4096)[0]

Per hidden size: the one-device ``nn.Sequential`` on each rank's own GPU (forward, and forward +
backward), the TP MLP over the ranks (slowest rank, ``timing.benchmark_collective``), and the NCCL
all-reduce kernels of a few profiled TP steps (``torch.profiler``, each rank its own GPU). A step's
all-reduce kernel starts when *its* rank gets there and ends when the data of *every* rank has
arrived, so per call:

* ``max`` over ranks of the kernel time = what the collective cost inside the step, the wait for the
  slower rank included (the first rank's kernel spins until the last one arrives);
* ``min`` over ranks = the transfer itself (the last rank's kernel hardly waits) -- what a standalone
  benchmark of the same all-reduce measures on the device.

The profiler records the GPU's activity only (``ProfilerActivity.CUDA``): recording every operator on
the host too adds host work to each step, and in a short step whose pace the hosts set that lets the
ranks drift apart, lengthening the very waits measured. Its first step is a warm-up whose kernels are
not kept (``torch.profiler.schedule(warmup=1)``): starting the profiler (above all the first time in a
process) takes each rank its own time, and a rank that starts sooner spends the difference waiting
inside its first all-reduce kernel. The verdict built on these times (``claims.wait_verdict``) also
uses only the sizes whose in-step time fits inside their step timed without the profiler.

On gloo (CPU) nothing is profiled on a device: the kernel fields are ``None`` and the lists empty.
"""
from __future__ import annotations

import math
import statistics

import torch
import torch.distributed as dist
from torch import nn

from ... import timing
from ...instruments import profiler
from ...config import rank_device
from .verify import DTYPES

def nccl_kernel_ms(step, calls: int, device) -> list[float]:
    """Run ``step()`` once (warm-up) and then ``calls`` times under ``torch.profiler`` (GPU activity only)
    and return the device time (ms) of each NCCL kernel of those calls that ran on ``device``, in the
    order they started; [] on the CPU."""
    if torch.device(device).type != "cuda":
        return []
    torch.cuda.synchronize(device)
    # the kernels themselves: not the "nccl:all_reduce" ranges PyTorch may also draw on the GPU timeline
    doc = profiler.profile(step, calls=calls, warmup=1, cpu=False)
    return [k["dur"] / 1e3 for k in profiler.nccl_kernels(doc, device=torch.device(device).index)]


def split_calls(calls_ms: list[list[float]]) -> dict:
    """Per call, from every rank's kernel times (``calls_ms[rank][i]``, call i being the same all-reduce
    on every rank): ``{"in_step_ms": median of max over ranks, "transfer_ms": median of min over ranks,
    "wait_ms": median of max - min, "calls": n}``; ``None`` values when there are no calls."""
    per_call = list(zip(*calls_ms))
    if not per_call:
        return {"in_step_ms": None, "transfer_ms": None, "wait_ms": None, "calls": 0}
    return {"in_step_ms": statistics.median(max(c) for c in per_call),
            "transfer_ms": statistics.median(min(c) for c in per_call),
            "wait_ms": statistics.median(max(c) - min(c) for c in per_call), "calls": len(per_call)}


def _steps(model: nn.Module, x: torch.Tensor, dz: torch.Tensor):
    """(forward-only step, forward + backward step) of ``model`` on ``x`` with upstream grad ``dz``."""
    def forward():
        with torch.no_grad():
            model(x)

    def train():
        model.zero_grad(set_to_none=True)
        x.grad = None
        model(x).backward(dz)
    return forward, train


def _calls_for(step, target_ms: float, dev, group) -> int:
    """Calls per timed sample so that one sample lasts about ``target_ms`` (same on all ranks)."""
    est = timing.benchmark(step, warmup=2, repeat=3, device=dev).median_ms
    return int(timing.slowest_rank([min(50, max(1, math.ceil(target_ms / max(est, 1e-3))))], group)[0])


def tp_mlp_sweep(rank: int, world_size: int, mlp_cls, hiddens: list[int], tokens: int = 4096,
                 dtype: str = "bfloat16", ffn_mult: int = 4, target_ms: float = 10.0, repeat: int = 5,
                 profiled_steps: int = 6, tp_size: int | None = None) -> list[dict]:
    """TP MLP vs one GPU, per hidden size h (ffn = ``ffn_mult`` h, ``tokens`` rows).

    ``tp_size`` ranks (default all) form the tensor-parallel group; the others only help create it and
    return ``[]``. Forward steps run under ``no_grad`` (1 all-reduce), training steps are forward +
    backward with ``x.requires_grad`` (2 all-reduces).

    Returns (on the group's ranks):
        One dict per h: ``hidden, ffn_hidden, tokens, dtype, allreduce_bytes``; ``one_gpu_fwd_ms,
        one_gpu_train_ms`` (this rank's own GPU; the notebook reports rank 0's), ``tp_fwd_ms, tp_train_ms``
        (slowest rank, medians); for m in fwd, train: ``allreduce_{m}_ms`` (in-step: median over calls of
        the max over ranks of the NCCL kernel time), ``allreduce_{m}_kernel_ms`` (transfer: the min),
        ``allreduce_{m}_wait_ms`` (max - min) and ``allreduce_{m}_calls_ms`` (``[rank][call]`` kernel ms).
    """
    tp_size = world_size if tp_size is None else tp_size
    group = None if tp_size == world_size else dist.new_group(list(range(tp_size)))
    if rank >= tp_size:
        return []
    dev, dt = rank_device(), DTYPES[dtype]
    rows = []
    for h in hiddens:
        f = ffn_mult * h
        x = torch.randn(tokens, h, device=dev, dtype=dt, requires_grad=True)
        dz = torch.randn(tokens, h, device=dev, dtype=dt)
        row = {"hidden": h, "ffn_hidden": f, "tokens": tokens, "dtype": dtype,
               "allreduce_bytes": tokens * h * x.element_size()}
        seq = nn.Sequential(nn.Linear(h, f, device=dev, dtype=dt), nn.GELU(), nn.Linear(f, h, device=dev, dtype=dt))
        for name, step in zip(("one_gpu_fwd_ms", "one_gpu_train_ms"), _steps(seq, x, dz)):
            inner = _calls_for(step, target_ms, dev, group)
            row[name] = timing.benchmark(step, warmup=1, repeat=repeat, inner=inner, device=dev).median_ms
        mlp = mlp_cls(seq, group)
        del seq
        for name, step in zip(("fwd", "train"), _steps(mlp, x, dz)):
            iters = _calls_for(step, target_ms, dev, group)
            row[f"tp_{name}_ms"] = timing.benchmark_collective(step, warmup=1, iters=iters, repeat=repeat,
                                                               group=group).median_ms
            timing.Clock(dev).synchronize()
            dist.barrier(group=group)                      # the profiled steps start together
            mine = nccl_kernel_ms(step, profiled_steps, dev)
            every: list = [None] * tp_size
            dist.all_gather_object(every, mine, group=group)
            split = split_calls(every)
            row.update({f"allreduce_{name}_ms": split["in_step_ms"],
                        f"allreduce_{name}_kernel_ms": split["transfer_ms"],
                        f"allreduce_{name}_wait_ms": split["wait_ms"], f"allreduce_{name}_calls_ms": every})
        del mlp
        rows.append(row)
    if group is not None:
        dist.destroy_process_group(group)
    return rows
