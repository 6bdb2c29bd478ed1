"""Lab 02's cost model of the tensor-parallel MLP, pure functions (Narayanan et al. 2021, section 3).

A TP step on p GPUs takes ``t_p = t_1 / p + k * t_allreduce(S)``, ``S = tokens * hidden * bytes``,
with k all-reduces per step (1 forward, 2 forward + backward) and ``t_allreduce`` from an alpha-beta
fit of a measured all_reduce sweep (``bandwidth.fit_alpha_beta``)::

    from labutils.labs.lab02_tensor_parallel import cost_model
    cost_model.speedup_model(hidden=8192, tokens=4096, world_size=2, tflops=700, alpha_us=20, beta_gbps=350)
"""
from __future__ import annotations

from ... import bandwidth


def mlp_flops(tokens: int, hidden: int, ffn_hidden: int, train: bool = False) -> float:
    """FLOPs of ``Linear(h, f) -> GeLU -> Linear(f, h)`` on ``tokens`` rows: 2 matmuls x 2 x T h f;
    backward costs twice the forward (gradients of inputs and of weights)."""
    return 4.0 * tokens * hidden * ffn_hidden * (3 if train else 1)


def allreduce_ms(size_bytes: float, world_size: int, alpha_us: float, beta_gbps: float) -> float:
    """All-reduce time from a fit ``t = alpha + S / beta`` made on **2** ranks, extrapolated to
    ``world_size`` with the ring model (``bandwidth.ring_time_ms``): at n = 2 a ring all-reduce
    has 2 steps, so alpha per step = alpha / 2, and the fit's beta is the bus bandwidth. Assumes
    every rank keeps the same link bandwidth (true on an NVSwitch node, optimistic elsewhere)."""
    return bandwidth.ring_time_ms("all_reduce", size_bytes, world_size, alpha_us / 2, beta_gbps)


def tp_step_ms(one_gpu_ms: float, world_size: int, allreduce_ms_each: float, count: int = 1) -> float:
    """Predicted TP step: compute divided by p, plus ``count`` all-reduces (no overlap)."""
    return one_gpu_ms / world_size + count * allreduce_ms_each


def speedup_model(hidden: int, tokens: int, world_size: int, tflops: float, alpha_us: float,
                  beta_gbps: float, *, ffn_mult: int = 4, bytes_per_element: int = 2,
                  overhead_us: float = 20.0, train: bool = False) -> float:
    """Predicted speedup of the TP MLP over one GPU: compute at ``tflops`` (split p ways), a fixed
    ``overhead_us`` per step (kernel launches; not split), communication from the alpha-beta fit."""
    compute_ms = mlp_flops(tokens, hidden, ffn_mult * hidden, train) / (tflops * 1e12) * 1e3
    size = tokens * hidden * bytes_per_element
    tp = tp_step_ms(compute_ms, world_size, allreduce_ms(size, world_size, alpha_us, beta_gbps), 2 if train else 1)
    return (compute_ms + overhead_us * 1e-3) / (tp + overhead_us * 1e-3)


COMM_SUMMARY_FIELDS = {
    "what": "the collective and where it runs",
    "op": "the collective (bandwidth.canonical_op name)",
    "size_bytes": "S as nccl-tests counts it (all_reduce: the reduced tensor)",
    "world_size": "ranks taking part",
    "count_per_step": "calls per measured step",
    "measured_ms": "one call inside the step: the NCCL kernel's device time on the rank that waited "
                   "longest (median over profiled calls of the max over ranks) -- the transfer plus the "
                   "wait for the slower rank; host time before the kernel is not included",
    "kernel_ms": "one call's transfer: median over calls of the min over ranks of the kernel time (the last "
                 "rank to arrive hardly waits) -- comparable with a standalone benchmark of the same call; "
                 "None in recordings made before it was measured",
    "wait_ms": "median over calls of max - min over ranks: the time the first rank waited for the last",
    "step_ms": "the whole TP forward step (slowest rank, median)",
}


def comm_summary(rows: list[dict], world_size: int) -> dict:
    """Lab 06's input: one entry per hidden size, the forward all-reduce inside the TP step.

    Returns ``{"fields": COMM_SUMMARY_FIELDS, "ops": [{...}]}`` (each op has the fields described
    there; ``kernel_ms``/``wait_ms`` are None for rows measured without them)."""
    return {"fields": COMM_SUMMARY_FIELDS,
            "ops": [{"what": f"TP MLP forward all_reduce, hidden={r['hidden']}, tokens={r['tokens']}, "
                             f"{r['dtype']}", "op": "all_reduce", "size_bytes": int(r["allreduce_bytes"]),
                     "world_size": world_size, "count_per_step": 1,
                     "measured_ms": r["allreduce_fwd_ms"], "kernel_ms": r.get("allreduce_fwd_kernel_ms"),
                     "wait_ms": r.get("allreduce_fwd_wait_ms"), "step_ms": r["tp_fwd_ms"]} for r in rows]}
