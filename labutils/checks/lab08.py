"""Checkers for lab 08 (data parallelism). They run the learner's function on ranks -- the notebook's
``RankPool`` when given (gloo on CPU, NCCL on GPUs: the printed lines are the same), else two fresh
gloo ranks -- and print a tick or raise ``ExerciseError`` with a HINT."""
from __future__ import annotations

from ..labs.lab08_data_parallel import exercises
from ..labs.lab08_data_parallel.memory import bytes_per_param, formula
from . import check_close, fail, not_attempted, passed, run_ranks, say_not_attempted, standin


def torch_average_gradients(model) -> None:
    """The stand-in for an unwritten ``my_average_gradients``: torch's own
    ``torch.distributed.algorithms.model_averaging.utils.average_parameters`` applied to the gradients."""
    from torch.distributed.algorithms.model_averaging.utils import average_parameters
    import torch.distributed as dist
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    average_parameters(iter(grads), dist.group.WORLD)


def _rank_slice(t, world_size: int, rank: int):
    """This rank's piece of ``t`` flattened and zero-padded to a multiple of ``world_size`` (a copy)."""
    import torch
    flat = t.detach().reshape(-1)
    per = -(-flat.numel() // world_size)
    return torch.nn.functional.pad(flat, (0, per * world_size - flat.numel()))[rank * per:(rank + 1) * per]


def averaged_then_sharded_step(params, shards, optimizer) -> None:
    """The stand-in for an unwritten ``my_zero1_step``: ZeRO-1's result without its reduce-scatter --
    torch's ``average_parameters`` on the full gradients, this rank's slices stepped, the stepped slices
    all-gathered back into the parameters."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.model_averaging.utils import average_parameters
    from ..compat import all_gather_into_tensor
    n, r = dist.get_world_size(), dist.get_rank()
    average_parameters(iter([p.grad for p in params]), dist.group.WORLD)
    for p, s in zip(params, shards):
        s.grad = _rank_slice(p.grad, n, r).clone()
        p.grad = None
    optimizer.step()
    optimizer.zero_grad()
    for p, s in zip(params, shards):
        whole = torch.empty(n * s.numel(), dtype=s.dtype, device=s.device)
        all_gather_into_tensor(whole, s.detach().reshape(-1).contiguous())
        with torch.no_grad():
            p.copy_(whole[: p.numel()].view_as(p))


standin(torch_average_gradients, "torch's average_parameters on the gradients")
standin(averaged_then_sharded_step, "an averaged all-reduce, then this rank's shards stepped and all-gathered "
                                    "(ZeRO-1's result without its reduce-scatter)")


def _run(rank_fn, *args, pool=None, timeout: float, hang_hint: str) -> list:
    return run_ranks(rank_fn, *args, pool=pool, world_size=pool.world_size if pool is not None else 2,
                     backend=None if pool is not None else "gloo", timeout_s=timeout, hang_hint=hang_hint,
                     hint="read the rank's error above; every rank must call the same collectives, in the same "
                          "order, with tensors of the same size")


_GRADIENT_HINTS = {
    "none": ("after your function some p.grad is None",
             "reduce every parameter's gradient in place: dist.all_reduce(p.grad), then divide it"),
    "sum": ("your gradients are world_size times the whole batch's",
            "dist.all_reduce sums; each rank's loss is already a mean over its own samples, so divide the sum "
            "by dist.get_world_size() to get the mean over the whole batch"),
    "local": ("your gradients are still each rank's own",
              "call dist.all_reduce(p.grad) for every parameter: it sums the ranks' tensors in place"),
    "wrong": ("your gradients differ from one device's on the whole batch",
              "sum the ranks' gradients with dist.all_reduce(p.grad), then divide by dist.get_world_size()"),
}


def average_gradients(fn, pool=None, timeout: float = 120.0):
    """``fn(model)`` after a backward on this rank's share of the batch must leave, on every rank,
    the gradient of the whole batch's mean loss; and training with it must match one device.

    Returns:
        the function to use from here on: ``fn``, or the stand-in ``torch_average_gradients`` when ``fn``
        is still a stub.
    """
    results = _run(exercises.run_average, fn, torch_average_gradients, pool=pool, timeout=timeout,
                   hang_hint="every rank must all-reduce the same parameters in the same order")
    if any(r["not_attempted"] for r in results):
        say_not_attempted("my_average_gradients", torch_average_gradients.labutils_standin)
        return torch_average_gradients
    for r in results:
        if r["gradients"] != "ok":
            fail(*_GRADIENT_HINTS[r["gradients"]])
    if not all(r["training"] for r in results):
        fail("one backward's gradients were right, but 3 SGD steps with your function do not match one device",
             "change p.grad in place (dist.all_reduce(p.grad); p.grad /= world_size) and touch nothing else")
    passed(f"your all-reduce averages the gradients: on {len(results)} ranks every rank's gradient == one "
           "device's on the whole batch, and 3 SGD steps match one device")
    return fn


_ZERO_HINTS = {
    "step_count": ("your step did not call optimizer.step() exactly once",
                   "the optimizer holds only this rank's shards: call optimizer.step() once per ZeRO step"),
    "none": ("when optimizer.step() ran, some shard had no .grad",
             "give every shard a gradient first: shard.grad = torch.empty_like(shard), then reduce_scatter "
             "padded_flat(p.grad, world_size) into it"),
    "sum": ("the shard gradients were world_size times the average",
            "reduce_scatter_tensor sums; divide shard.grad by dist.get_world_size()"),
    "local": ("the shard gradients were this rank's own, not reduced",
              "compat.reduce_scatter_tensor(shard.grad, padded_flat(p.grad, world_size)) gives this rank its "
              "shard of the SUM over the ranks"),
    "wrong": ("the shard gradients differ from this rank's shard of the averaged gradient",
              "rank r's shard is the r-th of world_size equal pieces of padded_flat(p.grad, world_size): "
              "reduce-scatter the whole padded gradient, output = shard.grad"),
    "not_gathered": ("each rank updated its own shard, but the full weights are not the same as DDP's",
                     "after optimizer.step(), all-gather the shards into every parameter: "
                     "compat.all_gather_into_tensor(padded_flat(p.detach(), world_size), shard.detach().clone()), "
                     "and copy back when padding made padded_flat a copy"),
    "not_sharded": ("your step gave the right weights, but not as ZeRO-1: it all-reduced or kept the full "
                    "gradients, or the optimizer holds more than this rank's shards",
                    "reduce-scatter padded_flat(p.grad, world_size) into shard.grad (no all-reduce), set p.grad = "
                    "None, step the optimizer you were given, all-gather each shard back into its parameter"),
    "wrong_update": ("after your step the weights differ from data parallelism with the same AdamW",
                     "the step is: reduce-scatter and average the gradients into the shards, drop p.grad, "
                     "optimizer.step(), optimizer.zero_grad(), all-gather the shards into the parameters"),
}


def zero_step(fn, pool=None, timeout: float = 120.0):
    """``fn(params, shards, optimizer)`` must be one ZeRO-1 step: compared step by step (3 steps) with
    data parallelism by hand and the same AdamW on full parameters.

    Returns:
        the function to use from here on: ``fn``, or the stand-in ``averaged_then_sharded_step`` when
        ``fn`` is still a stub.
    """
    results = _run(exercises.run_zero_step, fn, averaged_then_sharded_step, torch_average_gradients, pool=pool,
                   timeout=timeout, hang_hint="each rank must reduce-scatter and all-gather every parameter, "
                                              "in the same order on every rank")
    if any(r["not_attempted"] for r in results):
        say_not_attempted("my_zero1_step", averaged_then_sharded_step.labutils_standin)
        return averaged_then_sharded_step
    for r in results:
        if r["diagnosis"] != "ok":
            what, hint = _ZERO_HINTS[r["diagnosis"]]
            fail(f"step {r['step']}: {what}", hint)
    passed(f"your ZeRO-1 step == data parallelism with AdamW on {len(results)} ranks for 3 steps, "
           "with each rank's optimizer holding only its shards")
    return fn


def prediction_lr_factor(answer, world_size: int) -> None:
    """Summing instead of averaging multiplies the gradient, so SGD's learning rate, by world_size."""
    if not_attempted(answer):
        print(f"… no prediction written: summed gradients are N times the mean, so SGD moves like one "
              f"device with N x lr (N = {world_size} here).")
        return
    check_close(answer, world_size, rel_tol=0.01, what="the learning-rate factor of summed gradients",
                hint="each rank's gradient is already a mean over its samples; the sum of N of them is N times "
                     "the mean over the whole batch")


def prediction_bytes_per_param(answer, scheme: str, world_size: int) -> None:
    """Model-state bytes per parameter on one rank for ``scheme`` (this lab's fp32 Adam)."""
    want = bytes_per_param(scheme, world_size)
    if not_attempted(answer):
        print(f"… no prediction written: {scheme} on {world_size} ranks keeps {formula(scheme)} = "
              f"{want:g} bytes per parameter on each rank.")
        return
    check_close(answer, want, rel_tol=0.01, what=f"bytes per parameter per rank, {scheme}, N = {world_size}",
                hint=f"fp32 weights 4 + fp32 gradients 4 + Adam's two fp32 moments 8; {scheme} divides by N "
                     "what it shards")
