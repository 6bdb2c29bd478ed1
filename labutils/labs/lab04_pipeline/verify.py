"""Lab 04's correctness harness: a pipelined step == the same step on one device.

    from labutils.labs.lab04_pipeline import pipelining, verify
    verify.report(pool.run(verify.against_one_device, gpipe_step), "gpipe_step")   # the notebook's loop
    verify.report(pool.run(verify.against_one_device, pipelining.torch_schedule_step),
                  "torch ScheduleGPipe")

``against_one_device`` runs a step function with the contract of the notebook's ``gpipe_step``
(``step(stage, x, target, loss_fn, n_microbatches, act_shape)``, stage s = rank s, the full output
returned on the last rank) on the small float64 model (``SMALL``, built by ``model.make_blocks``)
and compares the last stage's output and every stage's gradients with the one-device model, which
each rank also computes; with ``record_order`` it also notes the order in which the stage ran the
forward and backward of each micro-batch. ``report`` prints one block per number of micro-batches (``compare.report``),
or raises. Rank functions run on ``cuda:<rank>`` under NCCL and on the CPU under gloo.
"""
from __future__ import annotations

import copy

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...config import rank_device
from ...instruments import compare
from .model import make_batch, make_blocks
from .schedule import partition

# Correctness: small and float64, so that "equal" means equal to ~1e-15, whatever the device.
SMALL = {"n_layers": 8, "hidden": 16, "rows": 48, "dtype": "float64"}


def _compare(got, want, what: str) -> str:
    try:
        torch.testing.assert_close(got, want)
        return "ok"
    except AssertionError as exc:
        return f"{what}: {str(exc).splitlines()[0]} {' '.join(str(exc).split()[1:12])}"


def order_recorder(stage) -> list:
    """Note, in the returned list, each forward of ``stage`` as ``("F", i)`` (i counts the calls) and,
    when the gradient of that forward's output arrives in backward, ``("B", i)``."""
    order: list = []

    def on_forward(module, inputs, output):
        i = sum(1 for kind, _ in order if kind == "F")
        order.append(("F", i))
        if isinstance(output, torch.Tensor) and output.requires_grad:
            output.register_hook(lambda grad: order.append(("B", i)))
    stage.register_forward_hook(on_forward)
    return order


def against_one_device(rank, world_size, step, ms=(1, 4), cfg=None, fallback=None,
                       record_order: bool = False) -> dict:
    """In a rank: run ``step(stage, x, target, loss_fn, m, act_shape)`` on the small model, and
    compare with the one-device model computed on this rank.

    Returns:
        ``{m: {"output": "ok" | message | None (not the last rank), "grads": "ok" | message,
        "n_grads": int, "order": [("F", i) / ("B", i), ...] (with ``record_order``)}}`` plus
        ``"not_attempted": bool`` (``step`` raised NotImplementedError and ``fallback`` ran instead).
    """
    cfg = {**SMALL, **(cfg or {})}
    dev, dtype = rank_device(), getattr(torch, cfg["dtype"])
    L, H, N = cfg["n_layers"], cfg["hidden"], cfg["rows"]
    lo, hi = partition(L, world_size)[rank]
    first, last = rank == 0, rank == world_size - 1
    out = {"not_attempted": False}
    for m in ms:
        blocks = make_blocks(L, H, device=dev, dtype=dtype)
        x, y = make_batch(N, H, device=dev, dtype=dtype)
        ref = nn.Sequential(*copy.deepcopy(blocks))
        ref_out = ref(x)
        F.mse_loss(ref_out, y).backward()
        stage = nn.Sequential(*blocks[lo:hi])
        order = order_recorder(stage) if record_order else None
        args = (stage, x if first else None, y if last else None, F.mse_loss, m, (N // m, H))
        try:
            got = step(*args)
        except NotImplementedError:
            if fallback is None:
                raise
            out["not_attempted"] = True
            got = fallback(*args)
        ref_grads = [q.grad for q in ref[lo:hi].parameters()]
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in stage.parameters()]
        res = {"output": None, "n_grads": len(grads),
               "grads": _compare(grads, ref_grads, f"stage {rank} gradients")}
        if order is not None:
            res["order"] = list(order)
        if last:
            res["output"] = ("the last rank returned None instead of the output" if got is None
                             else _compare(got, ref_out.detach(), "output"))
        out[m] = res
    return out


def report(results: list, label: str) -> None:
    """Print, through ``compare.report``, one block per m for the ranks' ``against_one_device`` results: the
    last stage's output and every stage's gradients against the one-device model; raise on any mismatch.

    Raises:
        AssertionError: a rank's output or gradients differ from the one-device model.
    """
    def holds(value):
        return True if value == "ok" else compare.Mismatch(value)

    p = len(results)
    statements = {}
    for m in (k for k in results[0] if k != "not_attempted"):
        bad = [f"rank {r}: {res[m]['grads']}" for r, res in enumerate(results) if res[m]["grads"] != "ok"]
        statements[f"m = {m}"] = {
            "output == one device": holds(results[-1][m]["output"] if results[-1][m]["output"] == "ok"
                                          else f"rank {p - 1}: {results[-1][m]['output']}"),
            "gradients == one device": holds("; ".join(bad) or "ok"),
            f"gradient tensors on {p} ranks": sum(res[m]["n_grads"] for res in results)}
    compare.report([statements], f"{label}, {p} stages", strict=True)