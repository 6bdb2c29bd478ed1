"""Lab 04's measurements on ranks: the GPipe sweep over m, one-way P2P of the activation messages,
peak memory and ``torch.distributed.pipelining``'s schedules (one process: ``naive``)::

    from labutils.labs.lab04_pipeline import measure
    data = measure.merge(pool.run(measure.measure_rank, gpipe_step), measure.BENCH)   # >= 2 GPUs

``measure_rank`` times the GPipe loop it is given (the notebook's ``gpipe_step``, which takes a
``span(kind, label)`` hook): its spans come from a ``timing.SpanTimer`` (CUDA events on GPUs) plus
the host time at which each span was entered. A step is the slowest rank's end, its bubble
``schedule.bubble_from_spans``'s. Rank functions run on ``cuda:<rank>`` under NCCL and on the CPU
under gloo (where the tests run them with a tiny configuration).
"""
from __future__ import annotations

import functools
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from ... import timing
from ...instruments import memory
from ...config import rank_device
from .analysis import stage_times
from .model import make_batch, make_blocks
from .pipelining import available_schedules, make_schedule, run_schedule
from .schedule import bubble_fraction, bubble_from_spans, partition

# Measurements on 2xH200: ~1.1 G parameters in bf16, 8192 rows per step (a ~80 ms step on one GPU).
BENCH = {"n_layers": 8, "hidden": 4096, "rows": 8192, "dtype": "bfloat16", "ms": [1, 2, 4, 8, 16],
         "schedule_m": 8, "warmup": 2, "repeat": 6}


def sync_devices(devices) -> None:
    """Wait until every device in ``devices`` has finished its queued work."""
    for d in {torch.device(d) for d in devices}:
        timing.Clock(d).synchronize()


def median_index(xs) -> int:
    """Index of the median of ``xs`` (the upper one for an even count)."""
    return sorted(range(len(xs)), key=xs.__getitem__)[len(xs) // 2]


class StageSpans:
    """A ``timing.SpanTimer`` for one rank's stage that also notes when the host entered each span
    (``host_start_ms``, from the same zero): an op the GPU started right when the host issued it
    found the GPU waiting for the host. ``span`` is the GPipe loop's ``span(kind, label)`` hook."""

    def __init__(self, device, lane: str):
        self.timer, self.device, self.lane = timing.SpanTimer(), device, lane
        self._t0, self._host = 0.0, []

    def begin(self) -> None:
        self.timer.begin([self.device])
        self._t0, self._host = time.perf_counter(), []

    def span(self, kind: str, label: str):
        self._host.append((time.perf_counter() - self._t0) * 1e3)
        return self.timer.span(self.device, self.lane, kind, label)

    def spans(self) -> list[dict]:
        return [dict(s, host_start_ms=h) for s, h in zip(self.timer.spans(), self._host)]


def _timed_steps(run, dev, spans: StageSpans, n_warmup, n_repeat, prepare=None) -> list:
    """Warm up, then time ``run()`` n_repeat times from a common start (``prepare()``, sync,
    barrier, sync: every rank's zero is the same instant to within a few us). ``run`` records its
    spans into ``spans``; returns the spans of every timed sample."""
    out = []
    for i in range(n_warmup + n_repeat):
        if prepare is not None:
            prepare()
        sync_devices([dev])
        dist.barrier()
        sync_devices([dev])
        spans.begin()
        run()
        if i >= n_warmup:
            out.append(spans.spans())
    return out


def _peak_bytes(run, dev):
    """Peak bytes allocated on ``dev`` during ``run()`` above what was allocated before (None on CPU)."""
    with memory.Probe(dev) as probe:
        run()
    return probe.peak_bytes


def _micro_batch_bytes(stage, rows, hidden, dev, dtype, requires_grad):
    """What one micro-batch costs in memory on this stage: bytes its forward leaves allocated (saved
    activations + output), and the peak its backward needs on top of that, with every ``.grad``
    already allocated as during a step (gradients of activations, and the weight-sized temporaries
    that are added into ``.grad``). (None, None) on the CPU."""
    if dev.type != "cuda":
        return None, None
    h = torch.randn(rows, hidden, device=dev, dtype=dtype, requires_grad=requires_grad)
    with memory.Probe(dev) as forward:
        out = stage(h)
    grad = torch.ones_like(out)  # what the next stage would send back
    with memory.Probe(dev) as backward:
        out.backward(grad)
    del out, h, grad
    return forward.held_bytes, backward.peak_bytes


def measure_rank(rank, world_size, step, cfg=None) -> dict:
    """Rank side of lab 04's measurements: ``step`` (the GPipe loop, ``step(stage, x, target,
    loss_fn, m, act_shape, span=...)``) swept over m, one-way P2P times of the activation messages,
    peak memory, and torch.distributed.pipelining's schedules. ``merge`` the ranks' results."""
    cfg = {**BENCH, **(cfg or {})}
    dev, dtype = rank_device(), getattr(torch, cfg["dtype"])
    L, H, N, p, ms_ = cfg["n_layers"], cfg["hidden"], cfg["rows"], world_size, cfg["schedule_m"]
    lo, hi = partition(L, p)[rank]
    stage = nn.Sequential(*make_blocks(L, H, device=dev, dtype=dtype, layers=range(lo, hi)))
    x, y = make_batch(N, H, device=dev, dtype=dtype)
    spans, W, R = StageSpans(dev, f"stage {rank}"), cfg["warmup"], cfg["repeat"]
    zero = functools.partial(stage.zero_grad, set_to_none=False)  # keeps .grad allocated

    def ours(m):
        return lambda: step(stage, x, y, F.mse_loss, m, (N // m, H), span=spans.span)
    out = {"rank": rank, "sweep": {}, "memory": {}, "p2p": {}, "schedules": {},
           "torch_version": torch.__version__}
    for m in cfg["ms"]:
        out["sweep"][m] = _timed_steps(ours(m), dev, spans, W, R, prepare=zero)
    for m in sorted({1, ms_}):
        zero()
        out["memory"][f"ours m={m}"] = _peak_bytes(ours(m), dev)
    zero()
    kept, backward = _micro_batch_bytes(stage, N // ms_, H, dev, dtype, rank > 0)
    out["memory"]["one micro-batch kept"], out["memory"]["one micro-batch backward"] = kept, backward
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
            with spans.span("step", name):
                run_schedule(sched, x, y)
        out["schedules"][name] = _timed_steps(run, dev, spans, W, R, prepare=zero)
        zero()
        out["memory"][f"torch {name} m={ms_}"] = _peak_bytes(run, dev)
    out["n_params"] = sum(q.numel() for q in stage.parameters())
    out["element_size"] = x.element_size()
    return out


def merge(results: list, cfg=None) -> dict:
    """Combine the ranks' ``measure_rank`` results into JSON-able data (lists in the order of
    ``ms``). Per sample, the step is the slowest rank's end and the bubble ``bubble_from_spans``'s;
    reported: medians over samples, every sample's bubble (``bubble_samples``), each stage's median
    forward/backward time per micro-batch over all samples (``stage_ms``), and the spans of the
    median sample."""
    cfg = {**BENCH, **(cfg or {})}
    p, ms = len(results), cfg["ms"]
    N, H, elt = cfg["rows"], cfg["hidden"], results[0]["element_size"]
    d = {"config": cfg, "world_size": p, "torch_version": results[0]["torch_version"],
         "n_params_per_stage": [r["n_params"] for r in results], "element_size": elt,
         "step_ms": [], "step_samples_ms": [], "bubble_predicted": [bubble_fraction(p, m) for m in ms],
         "bubble_measured": [], "bubble_samples": [], "bubble_per_rank": [], "busy_ms_per_rank": [],
         "stage_ms": [], "spans": {}, "schedules_ms": {},
         "memory_bytes": {k: [r["memory"][k] for r in results] for k in results[0]["memory"]},
         "p2p": {"size_bytes": [N // m * H * elt for m in ms], "fwd_ms": results[0]["p2p"]["fwd"],
                 "bwd_ms": results[0]["p2p"]["bwd"]}}
    for m in ms:
        samples = [[s for r in results for s in r["sweep"][m][i]] for i in range(len(results[0]["sweep"][m]))]
        stats = [bubble_from_spans(sample) for sample in samples]
        steps = [st["step_ms"] for st in stats]
        lanes = [f"stage {r}" for r in range(p)]
        d["step_ms"].append(statistics.median(steps))
        d["step_samples_ms"].append(steps)
        d["bubble_measured"].append(statistics.median(st["mean"] for st in stats))
        d["bubble_samples"].append([st["mean"] for st in stats])
        d["bubble_per_rank"].append([statistics.median(st["bubble"][ln] for st in stats) for ln in lanes])
        d["busy_ms_per_rank"].append([statistics.median(st["busy_ms"][ln] for st in stats) for ln in lanes])
        d["stage_ms"].append(stage_times([s for sample in samples for s in sample], p))
        d["spans"][str(m)] = samples[median_index(steps)]
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
