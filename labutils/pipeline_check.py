"""Lab 04's correctness harness: torch.distributed.pipelining's schedules, and pipelined == one device.

    from labutils import pipeline, pipeline_check as pc      # the same names are in pipeline_bench
    pc.summarize_check(labutils.launch(pc.check_rank, pipeline.gpipe_step), "gpipe_step")
    pc.summarize_check(labutils.launch(pc.check_rank, pc.torch_schedule_step), "torch ScheduleGPipe")

``check_rank`` runs a step function with the ``gpipe_step`` contract on the small float64 model
(``SMALL``, built by ``pipeline_bench.make_blocks``) and compares the last stage's output and every
stage's gradients with the one-device model, which each rank also computes; ``summarize_check``
prints one line per number of micro-batches, or raises. ``make_schedule`` / ``run_schedule`` wrap
``torch.distributed.pipelining`` (``ScheduleGPipe``, ``Schedule1F1B``) for this and for
``pipeline_bench.measure_rank``. Rank functions run on ``cuda:<rank>`` under NCCL and on the CPU
under gloo.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from .pipeline import partition

# Correctness: small and float64, so that "equal" means equal to ~1e-15, whatever the device.
SMALL = {"n_layers": 8, "hidden": 16, "rows": 48, "dtype": "float64"}
_SCHEDULE_CLASSES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B"}


def available_schedules() -> list[str]:
    """The schedules of ``_SCHEDULE_CLASSES`` that this torch's ``torch.distributed.pipelining`` has."""
    from torch.distributed import pipelining
    return [k for k, v in _SCHEDULE_CLASSES.items() if hasattr(pipelining, v)]


def make_schedule(stage, n_microbatches: int, loss_fn, schedule: str = "gpipe"):
    """Wrap this rank's ``stage`` (stage index = rank, p = world_size) in a ``PipelineStage`` and
    a ``ScheduleGPipe`` / ``Schedule1F1B``; shapes are inferred at the first step.

    Raises:
        ValueError: a schedule this torch does not have.
    """
    from torch.distributed import pipelining
    if schedule not in available_schedules():
        raise ValueError(f"schedule {schedule!r} is not in torch {torch.__version__}'s pipelining. "
                         f"HINT: one of {available_schedules()}.")
    device = next(stage.parameters()).device
    pstage = pipelining.PipelineStage(stage, dist.get_rank(), dist.get_world_size(), device)
    return getattr(pipelining, _SCHEDULE_CLASSES[schedule])(pstage, n_microbatches, loss_fn=loss_fn)


def run_schedule(sched, x, target):
    """One training step: the first rank feeds ``x``, the last ``target`` (torch splits both into
    micro-batches). Returns the last rank's output (detached), None elsewhere."""
    rank, p = dist.get_rank(), dist.get_world_size()
    first, last = rank == 0, rank == p - 1
    if first and last:
        out = sched.step(x, target=target)
    elif first:
        out = sched.step(x)
    elif last:
        out = sched.step(target=target)
    else:
        out = sched.step()
    return out.detach() if last else None


def torch_schedule_step(stage, x, target, loss_fn, n_microbatches, act_shape, *, schedule="gpipe"):
    """The ``gpipe_step`` contract, run by ``torch.distributed.pipelining`` (``act_shape`` unused:
    torch infers shapes)."""
    return run_schedule(make_schedule(stage, n_microbatches, loss_fn, schedule), x, target)


def _compare(got, want, what: str) -> str:
    try:
        torch.testing.assert_close(got, want)
        return "ok"
    except AssertionError as exc:
        return f"{what}: {str(exc).splitlines()[0]} {' '.join(str(exc).split()[1:12])}"


def check_rank(rank, world_size, step, ms=(1, 4), cfg=None, fallback=None) -> dict:
    """In a rank: run ``step(stage, x, target, loss_fn, m, act_shape)`` (the ``gpipe_step``
    contract) on the small model, and compare with the one-device model computed on this rank.

    Returns:
        ``{m: {"output": "ok" | message | None (not the last rank), "grads": "ok" | message,
        "n_grads": int}}`` plus ``"not_attempted": bool`` (``step`` raised NotImplementedError and
        ``fallback`` ran instead).
    """
    from .pipeline_bench import make_batch, make_blocks, rank_device  # here: pipeline_bench imports this module
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
        if last:
            res["output"] = ("the last rank returned None instead of the output" if got is None
                             else _compare(got, ref_out.detach(), "output"))
        out[m] = res
    return out


def summarize_check(results: list, label: str) -> None:
    """Print one line per m for the ranks' ``check_rank`` results; raise on any mismatch.

    Raises:
        AssertionError: a rank's output or gradients differ from the one-device model.
    """
    p = len(results)
    ms = [k for k in results[0] if k != "not_attempted"]
    for m in ms:
        bad = [f"rank {r}: {res[m][k]}" for r, res in enumerate(results) for k in ("output", "grads")
               if res[m][k] not in ("ok", None)]
        if bad:
            raise AssertionError(f"{label}, {p} stages, m = {m}: " + "; ".join(bad))
        n = sum(res[m]["n_grads"] for res in results)
        print(f"{label}, {p} stages, m = {m}: output == one device: True, "
              f"gradients == one device: True ({n} tensors on {p} ranks)")
