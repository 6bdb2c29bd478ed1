"""Lab 04's measurements: one GPU vs naive model parallelism in one process, and on ranks the
GPipe sweep over m, one-way P2P of the activation messages, peak memory and
``torch.distributed.pipelining``'s schedules::

    from labutils.labs.lab04_pipeline import measure
    data = measure.merge(labutils.launch(measure.measure_rank, measure.BENCH))   # on >= 2 GPUs
    data = measure.measure_one_process(measure.BENCH)                            # cuda:0 + cuda:1

Spans come from a ``timing.SpanTimer`` (CUDA events on GPUs); a step is the slowest rank's end,
its bubble ``schedule.bubble_from_spans``'s. Rank functions run on ``cuda:<rank>`` under NCCL and
on the CPU under gloo (where the tests run them with a tiny configuration).
"""
from __future__ import annotations

import contextlib
import functools
import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ... import timing
from ...config import rank_device
from .model import make_batch, make_blocks
from .pipelining import available_schedules, make_schedule, run_schedule
from .schedule import bubble_fraction, bubble_from_spans, gpipe_step, partition

# Measurements on 2xH200: ~1.1 G parameters in bf16, 8192 rows per step (a ~80 ms step on one GPU).
BENCH = {"n_layers": 8, "hidden": 4096, "rows": 8192, "dtype": "bfloat16", "ms": [1, 2, 4, 8, 16],
         "schedule_m": 8, "warmup": 3, "repeat": 8}


def naive_step(stages, devices, x, target, loss_fn, timer: timing.SpanTimer | None = None):
    """Naive model parallelism in one process: stage s on ``devices[s]``, the activation moved with
    ``.to()``; backward stage by stage, the gradient moved back with ``.to()``. Returns the loss."""
    span = timer.span if timer is not None else (lambda *_: contextlib.nullcontext())
    inputs, outs, h = [], [], x
    for s, (stage, dev) in enumerate(zip(stages, devices)):
        h_in = h.detach().to(dev)  # the activation crosses the link here
        if s > 0:
            h_in.requires_grad_()
        with span(dev, f"stage {s} ({dev})", "forward", f"F{s}"):
            h = stage(h_in)
            if s == len(stages) - 1:
                h = loss_fn(h, target.to(dev))
        inputs.append(h_in)
        outs.append(h)
    grad = None
    for s in reversed(range(len(stages))):
        with span(devices[s], f"stage {s} ({devices[s]})", "backward", f"B{s}"):
            torch.autograd.backward(outs[s], grad_tensors=grad)
        if s > 0:
            grad = inputs[s].grad.to(devices[s - 1])  # the gradient crosses back
    return outs[-1].detach()


def _sync(devices) -> None:
    for d in {torch.device(d) for d in devices}:
        timing.Clock(d).synchronize()


def measure_one_process(cfg=None, devices=("cuda:0", "cuda:1")) -> dict:
    """One GPU vs naive model parallelism over ``devices``, in this process (part 1 of lab 04).

    Returns JSON-able data: ``one_gpu_ms`` / ``naive_ms`` (median step), their samples, and
    ``spans`` (the naive step's forward/backward per device, of the median sample).
    """
    cfg = {**BENCH, **(cfg or {})}
    devs = [torch.device(d) for d in devices]
    dtype, L, H, N = getattr(torch, cfg["dtype"]), cfg["n_layers"], cfg["hidden"], cfg["rows"]
    blocks = make_blocks(L, H, device=devs[0], dtype=dtype)
    x, y = make_batch(N, H, device=devs[0], dtype=dtype)
    full = nn.Sequential(*blocks)
    y_last = y.to(devs[-1])  # the loss is computed where the last stage is

    def one_gpu():
        F.mse_loss(full(x), y).backward()
    t1 = timing.benchmark(one_gpu, warmup=cfg["warmup"], repeat=cfg["repeat"], device=devs[0])
    full.zero_grad(set_to_none=True)
    stages = [nn.Sequential(*blocks[a:b]).to(devs[s]) for s, (a, b) in enumerate(partition(L, len(devs)))]
    timer, samples = timing.SpanTimer(), []
    for i in range(cfg["warmup"] + cfg["repeat"]):
        _sync(devs)
        timer.begin(devs)
        naive_step(stages, devs, x, y_last, F.mse_loss, timer)
        if i >= cfg["warmup"]:
            samples.append(timer.spans())
    steps = [bubble_from_spans(s)["step_ms"] for s in samples]
    med = _median_index(steps)
    del full, stages, blocks, x, y, y_last
    if devs[0].type == "cuda":
        torch.cuda.empty_cache()
    return {"config": cfg, "devices": [str(d) for d in devs], "one_gpu_ms": t1.median_ms,
            "one_gpu_samples_ms": list(t1.samples_ms), "naive_ms": statistics.median(steps),
            "naive_samples_ms": steps, "spans": samples[med]}


def _timed_steps(run, dev, timer, n_warmup, n_repeat, prepare=None) -> list:
    """Warm up, then time ``run()`` n_repeat times from a common start (``prepare()``, sync,
    barrier, sync: every rank's zero is the same instant to within a few us). ``run`` records its
    spans into ``timer``; returns the spans of every timed sample."""
    out = []
    for i in range(n_warmup + n_repeat):
        if prepare is not None:
            prepare()
        _sync([dev])
        dist.barrier()
        _sync([dev])
        timer.begin([dev])
        run()
        spans = timer.spans()
        if i >= n_warmup:
            out.append(spans)
    return out


def _peak_bytes(run, dev):
    """Peak bytes allocated on ``dev`` during ``run()`` above what was allocated before (None on CPU)."""
    if dev.type != "cuda":
        run()
        return None
    _sync([dev])
    torch.cuda.reset_peak_memory_stats(dev)
    base = torch.cuda.memory_allocated(dev)
    run()
    _sync([dev])
    return torch.cuda.max_memory_allocated(dev) - base


def _retained_bytes(stage, rows, hidden, dev, dtype, requires_grad):
    """Bytes one micro-batch's forward leaves allocated (saved activations + output; None on CPU)."""
    if dev.type != "cuda":
        return None
    h = torch.randn(rows, hidden, device=dev, dtype=dtype, requires_grad=requires_grad)
    _sync([dev])
    base = torch.cuda.memory_allocated(dev)
    out = stage(h)
    _sync([dev])
    kept = torch.cuda.memory_allocated(dev) - base
    del out, h
    return kept


def measure_rank(rank, world_size, cfg=None) -> dict:
    """Rank side of lab 04's measurements: the GPipe sweep over m, one-way P2P times of the
    activation messages, peak memory, and torch.distributed.pipelining's schedules. ``merge`` the
    ranks' results."""
    cfg = {**BENCH, **(cfg or {})}
    dev, dtype = rank_device(), getattr(torch, cfg["dtype"])
    L, H, N, p, ms_ = cfg["n_layers"], cfg["hidden"], cfg["rows"], world_size, cfg["schedule_m"]
    lo, hi = partition(L, p)[rank]
    stage = nn.Sequential(*make_blocks(L, H, device=dev, dtype=dtype, layers=range(lo, hi)))
    x, y = make_batch(N, H, device=dev, dtype=dtype)
    timer, W, R = timing.SpanTimer(), cfg["warmup"], cfg["repeat"]
    zero = functools.partial(stage.zero_grad, set_to_none=False)  # keeps .grad allocated

    def ours(m):
        return lambda: gpipe_step(stage, x, y, F.mse_loss, m, (N // m, H), timer=timer)
    out = {"rank": rank, "sweep": {}, "memory": {}, "p2p": {}, "schedules": {},
           "torch_version": torch.__version__}
    for m in cfg["ms"]:
        out["sweep"][m] = _timed_steps(ours(m), dev, timer, W, R, prepare=zero)
    for m in sorted({1, ms_}):
        zero()
        out["memory"][f"ours m={m}"] = _peak_bytes(ours(m), dev)
    out["memory"]["one micro-batch kept"] = _retained_bytes(stage, N // ms_, H, dev, dtype, rank > 0)
    for m in cfg["ms"]:  # one-way P2P of one activation message between ranks 0 and 1
        buf = torch.empty(N // m, H, device=dev, dtype=dtype)
        for name, src, dst in (("fwd", 0, 1), ("bwd", 1, 0)):
            op = ((lambda: dist.send(buf, dst)) if rank == src else
                  (lambda: dist.recv(buf, src)) if rank == dst else (lambda: None))
            t = timing.benchmark_collective(op, warmup=3, iters=10, repeat=5)
            out["p2p"].setdefault(name, []).append(t.median_ms)
    for name in available_schedules():
        if name == "1f1b" and ms_ < p:
            continue  # Schedule1F1B needs m >= p
        sched = make_schedule(stage, ms_, F.mse_loss, name)

        def run(sched=sched, name=name):
            with timer.span(dev, f"stage {rank}", "step", name):
                run_schedule(sched, x, y)
        out["schedules"][name] = _timed_steps(run, dev, timer, W, R, prepare=zero)
        zero()
        out["memory"][f"torch {name} m={ms_}"] = _peak_bytes(run, dev)
    out["n_params"] = sum(q.numel() for q in stage.parameters())
    out["element_size"] = x.element_size()
    return out


def _median_index(xs) -> int:
    return sorted(range(len(xs)), key=xs.__getitem__)[len(xs) // 2]


def merge(results: list, cfg=None) -> dict:
    """Combine the ranks' ``measure_rank`` results into JSON-able data (lists in the order of
    ``ms``). Per sample, the step is the slowest rank's end and the bubble ``bubble_from_spans``'s;
    reported: medians over samples, and the spans of the median sample."""
    cfg = {**BENCH, **(cfg or {})}
    p, ms = len(results), cfg["ms"]
    N, H, elt = cfg["rows"], cfg["hidden"], results[0]["element_size"]
    d = {"config": cfg, "world_size": p, "torch_version": results[0]["torch_version"],
         "n_params_per_stage": [r["n_params"] for r in results], "element_size": elt,
         "step_ms": [], "step_samples_ms": [], "bubble_predicted": [bubble_fraction(p, m) for m in ms],
         "bubble_measured": [], "bubble_per_rank": [], "busy_ms_per_rank": [], "spans": {},
         "schedules_ms": {}, "memory_bytes": {k: [r["memory"][k] for r in results]
                                             for k in results[0]["memory"]},
         "p2p": {"size_bytes": [N // m * H * elt for m in ms], "fwd_ms": results[0]["p2p"]["fwd"],
                 "bwd_ms": results[0]["p2p"]["bwd"]}}
    for m in ms:
        stats = [bubble_from_spans([s for r in results for s in r["sweep"][m][i]])
                 for i in range(len(results[0]["sweep"][m]))]
        steps = [st["step_ms"] for st in stats]
        lanes = [f"stage {r}" for r in range(p)]
        d["step_ms"].append(statistics.median(steps))
        d["step_samples_ms"].append(steps)
        d["bubble_measured"].append(statistics.median(st["mean"] for st in stats))
        d["bubble_per_rank"].append([statistics.median(st["bubble"][ln] for st in stats) for ln in lanes])
        d["busy_ms_per_rank"].append([statistics.median(st["busy_ms"][ln] for st in stats) for ln in lanes])
        d["spans"][str(m)] = [s for r in results for s in r["sweep"][m][_median_index(steps)]]
    for name in results[0]["schedules"]:
        n = len(results[0]["schedules"][name])
        d["schedules_ms"][name] = statistics.median(
            bubble_from_spans([s for r in results for s in r["schedules"][name][i]])["step_ms"]
            for i in range(n))
    return d


def comm_summary(data: dict) -> dict:
    """The pipeline's P2P messages for lab 06: one entry per m and direction, with the measured
    one-way time of one message and the step time (``{"ops": [...]}``, sizes in bytes, times in ms)."""
    cfg, p = data["config"], data["world_size"]
    dt = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}.get(cfg["dtype"], cfg["dtype"])
    ops = []
    for i, m in enumerate(cfg["ms"]):
        for key, what in (("fwd_ms", "activation"), ("bwd_ms", "gradient")):
            ops.append({"what": f"pipeline {what} send, m={m}, micro-batch={cfg['rows'] // m}, "
                                f"hidden={cfg['hidden']}, {dt}",
                        "op": "send_recv", "size_bytes": int(data["p2p"]["size_bytes"][i]),
                        "world_size": p, "count_per_step": m * (p - 1),
                        "measured_ms": data["p2p"][key][i], "step_ms": data["step_ms"][i]})
    return {"ops": ops}
