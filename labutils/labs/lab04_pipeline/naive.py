"""Naive model parallelism in one process (lab 04, part 1): the step, and its measurement against one
GPU doing the same work::

    from labutils.labs.lab04_pipeline import naive
    data = naive.measure_one_process()          # cuda:0 alone, then split over cuda:0 + cuda:1

The one-GPU step is timed back to back and with the GPU resting between steps (as each GPU of the
split rests while the other works), with the GPU's SM clock read while it computes (``gpu_clock``).
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import timing
from . import gpu_clock
from .measure import BENCH, median_index, sync_devices
from .model import make_batch, make_blocks
from .schedule import bubble_from_spans, partition


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


def timed_steps(run, clock: timing.Clock, warmup: int, repeat: int, rest_s: float = 0.0,
                read=None) -> tuple[list, list]:
    """Time ``run()`` ``repeat`` times after ``warmup`` untimed calls, each from an idle device; with
    ``rest_s``, the device rests that long before each call. Returns the samples (ms) and the readings
    ``read(end)`` took while each timed call ran (default: the GPU's clock and power, ``gpu_clock``; []
    where NVML is missing)."""
    read = read or (lambda end: gpu_clock.while_running(end, clock.device))
    timing.check_counts(warmup=warmup, repeat=repeat)
    pairs, readings = [], []
    for i in range(warmup + repeat):
        clock.synchronize()
        if rest_s:
            time.sleep(rest_s)
        start = clock.mark()
        run()
        end = clock.mark()
        if i >= warmup:
            pairs.append((start, end))
            readings += read(end)
    clock.synchronize()
    return [clock.elapsed_ms(a, b) for a, b in pairs], readings


def measure_one_process(cfg=None, devices=("cuda:0", "cuda:1")) -> dict:
    """One GPU vs naive model parallelism over ``devices``, in this process (part 1 of lab 04).

    The one-GPU step is timed twice: back to back, and with the GPU resting one step's time before
    each step (the duty of each GPU of the split, which works about half of its step).

    Returns JSON-able data: ``one_gpu_ms`` / ``one_gpu_rested_ms`` / ``naive_ms`` (medians) and their
    samples, ``rest_ms``, ``gpu_clock`` (median SM clock and power while the one-GPU steps ran, back to
    back and rested; None where NVML cannot be read) and ``spans`` (the naive step's forward/backward
    per device, of the median sample).
    """
    cfg = {**BENCH, **(cfg or {})}
    devs = [torch.device(d) for d in devices]
    dtype, L, H, N = getattr(torch, cfg["dtype"]), cfg["n_layers"], cfg["hidden"], cfg["rows"]
    W, R = cfg["warmup"], cfg["repeat"]
    blocks = make_blocks(L, H, device=devs[0], dtype=dtype)
    x, y = make_batch(N, H, device=devs[0], dtype=dtype)
    full = nn.Sequential(*blocks)
    y_last = y.to(devs[-1])  # the loss is computed where the last stage is

    def one_gpu():
        F.mse_loss(full(x), y).backward()
    clock = timing.Clock(devs[0])
    back_to_back, b2b_readings = timed_steps(one_gpu, clock, W, R)
    rest_s = statistics.median(back_to_back) / 1e3
    rested, rested_readings = timed_steps(one_gpu, clock, 1, R, rest_s=rest_s)
    full.zero_grad(set_to_none=True)
    stages = [nn.Sequential(*blocks[a:b]).to(devs[s]) for s, (a, b) in enumerate(partition(L, len(devs)))]
    timer, samples = timing.SpanTimer(), []
    for i in range(W + R):
        sync_devices(devs)
        timer.begin(devs)
        naive_step(stages, devs, x, y_last, F.mse_loss, timer)
        if i >= W:
            samples.append(timer.spans())
    steps = [bubble_from_spans(s)["step_ms"] for s in samples]
    med = median_index(steps)
    del full, stages, blocks, x, y, y_last
    if devs[0].type == "cuda":
        torch.cuda.empty_cache()
    return {"config": cfg, "devices": [str(d) for d in devs],
            "one_gpu_ms": statistics.median(back_to_back), "one_gpu_samples_ms": back_to_back,
            "one_gpu_rested_ms": statistics.median(rested), "one_gpu_rested_samples_ms": rested,
            "rest_ms": rest_s * 1e3,
            "gpu_clock": {"back to back": gpu_clock.median(b2b_readings),
                          "rested": gpu_clock.median(rested_readings)},
            "naive_ms": statistics.median(steps), "naive_samples_ms": steps, "spans": samples[med]}
