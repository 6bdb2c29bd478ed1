"""Checkers for lab 08 (data parallelism). They run the learner's code on at least 3 gloo ranks -- a
``RankPool`` of >= 3 ranks when given (the notebook's ``CHECKS``), else 3 fresh ones: with 2 ranks a
mistake in the averaging or the sharding can pass by symmetry -- and print a tick, raise
``ExerciseError`` with a HINT, or say "not attempted". The communication is judged from what the ranks
issued, counted by ``instruments.ledger.Ledger``: ``size_bytes`` is what a call hands to the collective
(nccl-tests' S), ``wire_bytes`` what this rank sends (ring model: 2(n-1)/n S for an all-reduce, (n-1)/n S
for a reduce-scatter or an all-gather) -- the convention of labs 08 and 09."""
from __future__ import annotations

from ..labs.lab08_data_parallel import build, exercises
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


def averaged_then_sliced_hooks(params, shards) -> list:
    """The stand-in for an unwritten ``my_zero2_attach``: post-accumulate-grad hooks that average each full
    gradient with torch's ``average_parameters`` (an all-reduce) and keep this rank's slice -- ZeRO-2's
    result without its reduce-scatter."""
    import torch.distributed as dist
    from torch.distributed.algorithms.model_averaging.utils import average_parameters
    n, r = dist.get_world_size(), dist.get_rank()

    def hook(p, shard):
        average_parameters(iter([p.grad]), dist.group.WORLD)
        part = _rank_slice(p.grad, n, r).clone()
        shard.grad = part if shard.grad is None else shard.grad + part
        p.grad = None

    import functools
    return [p.register_post_accumulate_grad_hook(functools.partial(hook, shard=s)) for p, s in zip(params, shards)]


standin(torch_average_gradients, "torch's average_parameters on the gradients")
standin(averaged_then_sliced_hooks, "hooks that all-reduce each full gradient with torch's average_parameters "
                                    "and keep this rank's slice (ZeRO-2's result without its reduce-scatter)")
standin(averaged_then_sharded_step, "an averaged all-reduce, then this rank's shards stepped and all-gathered "
                                    "(ZeRO-1's result without its reduce-scatter)")


MIN_RANKS = 3


def _run(rank_fn, *args, pool=None, timeout: float, hang_hint: str) -> list:
    if pool is not None and pool.world_size < MIN_RANKS:
        raise ValueError(f"lab 08's checkers run on >= {MIN_RANKS} ranks, but this pool has {pool.world_size}. "
                         f"HINT: pass pool=labutils.RankPool(world_size={MIN_RANKS}, backend='gloo'), or leave "
                         "pool out (3 fresh gloo ranks).")
    return run_ranks(rank_fn, *args, pool=pool, world_size=pool.world_size if pool is not None else MIN_RANKS,
                     backend=None if pool is not None else "gloo", timeout_s=timeout, hang_hint=hang_hint,
                     hint="read the rank's error above; every rank must call the same collectives, in the same "
                          "order, with tensors of the same size")


_GRADIENT_HINTS = {
    "none": ("after your function some p.grad is None",
             "reduce every parameter's gradient in place: dist.all_reduce(p.grad), then divide it"),
    "sum": ("your gradients are world_size times DDP's (the whole batch's)",
            "dist.all_reduce sums; each rank's loss is already a mean over its own samples, so divide the sum "
            "by dist.get_world_size() to get the mean over the whole batch"),
    "local": ("your gradients are still each rank's own",
              "call dist.all_reduce(p.grad) for every parameter: it sums the ranks' tensors in place"),
    "wrong": ("your gradients differ from one device's on the whole batch",
              "sum the ranks' gradients with dist.all_reduce(p.grad), then divide by dist.get_world_size()"),
}


def average_gradients(fn, pool=None, timeout: float = 120.0):
    """Build your DDP (a), the naive step: ``fn(model)`` after a backward on this rank's share of the batch
    must leave, on every rank, the gradient of the whole batch's mean loss -- DDP's gradients on the same
    model and data -- with one all-reduce per parameter; and training with it must match one device.

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
    facts = _judge("naive", _run(build.run_reduction, "naive", fn, torch_average_gradients, pool=pool,
                                 timeout=timeout, hang_hint="every rank must all-reduce the same parameters in "
                                                            "the same order"))
    if not all(r["training"] for r in results):
        fail("one backward's gradients were right, but 3 SGD steps with your function do not match one device",
             "change p.grad in place (dist.all_reduce(p.grad); p.grad /= world_size) and touch nothing else")
    passed(f"your all-reduce averages the gradients: on {len(results)} ranks every rank's gradient == DDP's and "
           f"one device's on the whole batch, every gradient handed to an all-reduce once ({facts['after']} "
           f"all-reduces for {facts['n_params']} parameters, after backward), and 3 SGD steps match one device")
    return fn


class AveragedAfterBackward:
    """The stand-in for an unwritten ``MyOverlappedGradients`` / ``MyBucketedGradients``: nothing happens
    during backward; ``finish()`` averages the gradients with torch's ``average_parameters`` (no overlap)."""

    def __init__(self, model, *args):
        self.model = model

    def finish(self):
        torch_average_gradients(self.model)


standin(AveragedAfterBackward, "torch's average_parameters after backward (no overlap, no buckets)")

RESET_HINT = ("the first step was right: finish() must leave your object ready for the next backward -- clear "
              "the handles, reset what counts the gradients still missing")
_COMM_HINTS = {
    "nothing": lambda f: ("your step issued no all-reduce at all",
                          "every gradient must be all-reduced: start the all-reduces from the hooks"),
    "extra_ops": lambda f: (f"besides all-reduces your step issued {', '.join(f['others'])}",
                            "averaging gradients needs all-reduces only: dist.all_reduce on each gradient "
                            "(or bucket)"),
    "blocking": lambda f: (f"{f['blocking']} all-reduces during backward were called without async_op=True: "
                           "each one returned only when it had finished, so backward waited for it and nothing "
                           "overlapped",
                           "dist.all_reduce(t, async_op=True) returns a handle at once; keep the handles and wait() "
                           "for them in finish()"),
    "count": lambda f: (f"your step issued {len(f['issued'])} all-reduces of {sorted(f['issued'])} bytes for "
                        f"{f['n_params']} parameters of {sorted(f['sizes'])} bytes",
                        "all-reduce every parameter's gradient exactly once: dist.all_reduce(p.grad) for each "
                        "parameter"),
    "after_backward": lambda f: (f"{f['after']} of your all-reduces were issued after backward, in finish(), "
                                 f"and {f['during']} while backward ran: what starts after backward cannot "
                                 "overlap it",
                                 "start each all-reduce inside the hook, the moment its gradient (or its bucket's "
                                 "last gradient) is ready, with dist.all_reduce(t, async_op=True); keep the "
                                 "handle, and only wait() for the handles in finish()"),
    "early": lambda f: ("an all-reduce was issued before the last gradient it carries had been accumulated: "
                        "it reduced a gradient that did not exist yet",
                        "start a bucket only when all of its gradients have arrived: count, per bucket, the "
                        "gradients still missing, and launch when the count reaches 0 -- gradients do not "
                        "arrive exactly in reverse parameter order. Use p.register_post_accumulate_grad_hook "
                        "(it runs after p.grad holds this backward's gradient)"),
    "per_parameter": lambda f: (f"you issued one all-reduce per parameter ({len(f['issued'])}), not one per bucket "
                                f"({f['n_buckets']} buckets for this cap)",
                                "pack the gradients into buckets: walk the parameters in reverse order and close "
                                "a bucket once it holds >= bucket_cap_bytes; one all-reduce per bucket"),
    "layout": lambda f: (f"your all-reduces carried {f['issued']} bytes, in that order; DDP's buckets for this cap "
                         f"carry {f['want']}",
                         "walk list(model.parameters()) in reverse, add each parameter to the current bucket "
                         "(bytes = numel x element_size), close the bucket once it holds >= bucket_cap_bytes; the "
                         "last bucket may be smaller; one all-reduce per bucket, the buckets in that order"),
}


def _judge(design: str, results: list) -> dict:
    """Fail on the first rank and step whose gradients or communication are wrong; else the facts."""
    cap = build.BUCKET_CAP_BYTES
    for r in results:
        for step, s in enumerate(r["steps"]):
            problem, facts = build.diagnose_communication(design, s, r["sizes"], cap)
            facts["sizes"] = r["sizes"]
            if problem != "ok":
                what, hint = _COMM_HINTS[problem](facts)
                fail(f"step {step + 1}: {what}", RESET_HINT if step and problem == "nothing" else hint)
            if s["gradients"] != "ok":
                what, hint = _GRADIENT_HINTS[s["gradients"]]
                if step and design != "naive":
                    hint = RESET_HINT
                fail(f"step {step + 1}, after finish(): {what}", hint)
        if not r["weights_equal_ddp"]:
            fail(f"after {len(r['steps'])} SGD steps your weights differ from DDP's",
                 "leave the averaged gradients in p.grad (finish() must have waited for every all-reduce) and "
                 "touch nothing else")
    return facts


def _hooked(design: str, cls, pool, timeout: float, *args) -> list:
    return _run(build.run_reduction, design, cls, AveragedAfterBackward, *args, pool=pool, timeout=timeout,
                hang_hint="every rank must issue the same all-reduces in the same order; finish() must wait() "
                          "for every handle it started")


def overlapped_gradients(cls, pool=None, timeout: float = 120.0):
    """Build your DDP (b): ``cls(model)`` starts each gradient's all-reduce from a post-accumulate-grad hook;
    ``obj.finish()`` waits for them before the optimizer. Judged on >= 3 ranks, 2 steps, against DDP's
    gradients, and by the ledger: one all-reduce per parameter, every one issued during backward, none
    before its gradient existed, none called without ``async_op=True`` (backward would wait for it).

    Returns:
        ``cls``, or the stand-in ``AveragedAfterBackward`` when ``cls`` is still a stub.
    """
    results = _hooked("overlapped", cls, pool, timeout)
    if any(r["not_attempted"] for r in results):
        say_not_attempted("MyOverlappedGradients", AveragedAfterBackward.labutils_standin)
        return AveragedAfterBackward
    facts = _judge("overlapped", results)
    passed(f"your overlapped step == DDP's gradients on {len(results)} ranks for {build.STEPS} steps: "
           f"{facts['during']} all-reduces for {facts['n_params']} parameters, every one started during backward, "
           "none before its gradient was accumulated")
    return cls


def bucketed_gradients(cls, pool=None, timeout: float = 120.0):
    """Build your DDP (c): ``cls(model, bucket_cap_bytes)`` packs the gradients into DDP's buckets (reverse
    parameter order, a bucket full at >= the cap) and starts one async all-reduce per bucket when its last
    gradient has arrived; ``obj.finish()`` waits and leaves the averaged gradients in ``p.grad``. Judged
    on >= 3 ranks, 2 steps, against DDP's gradients, and by the ledger: the all-reduces' sizes are the
    buckets', in order, the full buckets start during backward, none before its last gradient.

    Returns:
        ``cls``, or the stand-in ``AveragedAfterBackward`` when ``cls`` is still a stub.
    """
    results = _hooked("bucketed", cls, pool, timeout, build.BUCKET_CAP_BYTES)
    if any(r["not_attempted"] for r in results):
        say_not_attempted("MyBucketedGradients", AveragedAfterBackward.labutils_standin)
        return AveragedAfterBackward
    facts = _judge("bucketed", results)
    passed(f"your bucketed step == DDP's gradients on {len(results)} ranks for {build.STEPS} steps: "
           f"{len(facts['issued'])} all-reduces of {facts['issued']} bytes -- the {facts['n_buckets']} buckets of "
           f"a {build.BUCKET_CAP_BYTES}-byte cap in reverse parameter order -- each started during backward once "
           "its last gradient was accumulated")
    return cls


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
    "not_sharded": ("your step gave the right weights, but not as ZeRO-1: it kept the full gradients, sent more "
                    "or less than (N-1)/N of them per rank in one reduce-scatter and one all-gather, or the "
                    "optimizer holds more than this rank's shards",
                    "reduce-scatter padded_flat(p.grad, world_size) into each shard's gradient (no all-reduce), set "
                    "p.grad = None, step the optimizer you were given, all-gather each shard back into its "
                    "parameter"),
    "wrong_update": ("after your step the weights differ from data parallelism with the same AdamW",
                     "the step is: reduce-scatter and average the gradients into the shards, drop p.grad, "
                     "optimizer.step(), optimizer.zero_grad(), all-gather the shards into the parameters"),
}


def _judge_zero(results: list, hints: dict) -> None:
    """Fail on the first rank whose ZeRO diagnosis is not "ok": an all-reduce with its own HINT, else the
    ``(what, hint)`` that ``hints`` gives for the diagnosis."""
    for r in results:
        if r["diagnosis"] == "all_reduce":
            fail(f"step {r['step']}: {_all_reduce_what(r)}", _ALL_REDUCE_HINT)
        if r["diagnosis"] != "ok":
            what, hint = hints[r["diagnosis"]]
            fail(f"step {r['step']}: {what}", hint)


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
    _judge_zero(results, _ZERO_HINTS)
    passed(f"your ZeRO-1 step == data parallelism with AdamW on {len(results)} ranks for 3 steps, "
           "with each rank's optimizer holding only its shards; on the wire, per rank: reduce-scatter "
           f"{results[0]['sharded_wire']} B + all-gather as much, no all-reduce")
    return fn


def _all_reduce_what(r) -> str:
    got = r["wire"].get("all_reduce", 0)
    return (f"your step all-reduced the full gradients: {got} bytes per rank on the wire for them, where a "
            f"reduce-scatter of the same gradients sends {r['sharded_wire']}, and every rank held every full "
            "gradient")


_ALL_REDUCE_HINT = ("an all-reduce sends 2(N-1)/N of the gradient from each rank and leaves all of it on every rank; "
                    "ZeRO needs each rank's piece only: compat.reduce_scatter_tensor(piece, padded_flat(p.grad, "
                    "world_size)) sends (N-1)/N -- half the bytes -- and each rank receives only its piece of the sum")

_ZERO2_HINTS = {
    "not_during_backward": ("no collective ran during backward: the gradients were not reduced by your hooks",
                            "register on every parameter a hook with p.register_post_accumulate_grad_hook(hook): it "
                            "runs during backward, after p.grad holds the gradient; reduce-scatter there"),
    "kept_full": ("the shards' gradients are right, but after backward some p.grad still holds a full gradient",
                  "ZeRO-2's point is that no rank keeps the full gradients: set p.grad = None in the hook, once its "
                  "piece is taken"),
    "count": ("the shards' gradients are right, but not one reduce-scatter per parameter sending (N-1)/N of it",
              "in each parameter's hook, one compat.reduce_scatter_tensor(piece, padded_flat(p.grad, world_size)); "
              "nothing else"),
    "none": ("after backward some shard has no .grad", "give every shard its piece: shard.grad = piece (or add it "
                                                      "to shard.grad when one is already there)"),
    "sum": ("the shards' gradients are world_size times the average",
            "reduce_scatter sums; divide the piece by dist.get_world_size()"),
    "local": ("the shards' gradients are this rank's own, not reduced",
              "reduce-scatter the padded gradient: rank r receives the sum over ranks of piece r"),
    "wrong": ("the shards' gradients differ from this rank's piece of DDP's averaged gradient",
              "rank r's piece is the r-th of world_size equal pieces of padded_flat(p.grad, world_size)"),
    "wrong_update": ("the shards' gradients were right, but the weights after the step differ from DDP's",
                     "keep shard.grad a plain tensor of the shard's shape and dtype, and change nothing else"),
}


def zero2_attach(fn, pool=None, timeout: float = 120.0):
    """``fn(params, shards)`` must register ZeRO-2's gradient hooks and return their handles. Judged on >= 3
    ranks for 3 AdamW steps against torch's DDP: each shard's gradient after backward is this rank's piece of
    DDP's average; no full gradient is left; during backward, one reduce-scatter per parameter, (N-1)/N of
    the padded gradients on the wire from each rank, and no all-reduce.

    Returns:
        ``fn``, or the stand-in ``averaged_then_sliced_hooks`` when ``fn`` is still a stub.
    """
    results = _run(exercises.run_zero2, fn, averaged_then_sliced_hooks, pool=pool, timeout=timeout,
                   hang_hint="every rank's hooks must issue the same collectives in the same order")
    if any(r["not_attempted"] for r in results):
        say_not_attempted("my_zero2_attach", averaged_then_sliced_hooks.labutils_standin)
        return averaged_then_sliced_hooks
    _judge_zero(results, _ZERO2_HINTS)
    r = results[0]
    passed(f"your ZeRO-2 hooks == DDP with AdamW on {len(results)} ranks for 3 steps: {r['calls']['reduce_scatter']} "
           f"reduce-scatters during backward for {r['n_params']} parameters, {r['wire']['reduce_scatter']} B per rank "
           "on the wire ((N-1)/N of the padded gradients), no all-reduce, no full gradient left after backward")
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
