"""Lab 04 on one GPU: the same training step back to back and rested, with what NVML says about the clock.

Part 1 of the lab finds a one-GPU step faster when the GPU rests between steps. This measurement needs
one GPU and says why: while the steps run it reads, every few ms, the SM clock, the power, the
temperature and the *clock-event reasons* -- the bits NVML sets for each limit that holds the clock
where it is (power cap, thermal slowdown, hardware slowdown, ...; ``hw.CLOCK_EVENT_REASONS``)::

    from labutils.labs.lab04_pipeline import boost
    data = boost.measure_one_gpu()                 # cuda:0; JSON-able
    data["nvml"]["back to back"]["reason_share"]   # {"software power cap": 0.93, ...}

Where NVML cannot be read (no GPU, no nvidia-ml-py, a driver without the query) the step times are
still measured and ``data["nvml"]`` holds None.

``power_timeline`` reads the same over time, from a rested GPU on: when each reason comes on while the
steps run back to back, and whether it is set while the GPU computes a step after resting one::

    data = boost.power_timeline()                  # ~12 s on cuda:0; data["samples"]: one dict per reading
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from ... import hw, timing
from .measure import BENCH
from .model import make_batch, make_blocks
from .naive import timed_steps

PERIOD_S = 0.005      # one NVML reading every 5 ms while the GPU computes


class NvmlProbe:
    """SM clock, power, temperature and clock-event reasons of one CUDA device, read through pynvml."""

    def __init__(self, pynvml, handle):
        self.nvml, self.handle = pynvml, handle
        self.query_reasons = hw.clock_event_reasons_query(pynvml)

    def read(self) -> dict | None:
        """``{"clock_mhz", "power_w", "temperature_c", "reasons"}`` now (``reasons``: NVML's bit mask; it
        and the temperature None where this nvidia-ml-py or driver cannot say), or None without clock or power."""
        n = self.nvml
        try:
            out = {"clock_mhz": float(n.nvmlDeviceGetClockInfo(self.handle, n.NVML_CLOCK_SM)),
                   "power_w": n.nvmlDeviceGetPowerUsage(self.handle) / 1e3}
        except Exception:  # noqa: BLE001 - a driver without one of the counters
            return None
        try:
            out["temperature_c"] = float(n.nvmlDeviceGetTemperature(self.handle, n.NVML_TEMPERATURE_GPU))
        except Exception:  # noqa: BLE001 - a package or driver without the (deprecated) query
            out["temperature_c"] = None
        try:
            out["reasons"] = self.query_reasons(self.handle) if self.query_reasons else None
        except Exception:  # noqa: BLE001 - a driver without the query: clock and power still count
            out["reasons"] = None
        return out

    def power_limit_w(self) -> float | None:
        """The power limit the driver enforces (W), or None."""
        try:
            return self.nvml.nvmlDeviceGetEnforcedPowerLimit(self.handle) / 1e3
        except Exception:  # noqa: BLE001
            return None


@contextlib.contextmanager
def nvml_probe(device):
    """``with nvml_probe("cuda:0") as probe:`` -- an ``NvmlProbe`` for that CUDA device (found by UUID, so
    that ``CUDA_VISIBLE_DEVICES`` cannot point it at another GPU), or None where NVML cannot be read."""
    device = torch.device(device)
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no package, no driver
        yield None
        return
    try:
        index = device.index or 0
        try:
            handle = pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{torch.cuda.get_device_properties(index).uuid}")
        except Exception:  # noqa: BLE001 - a torch or driver without UUIDs: NVML's index order
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        probe = NvmlProbe(pynvml, handle)
        yield probe if probe.read() is not None else None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def while_running(end, probe: NvmlProbe | None, period_s: float = PERIOD_S) -> list[dict]:
    """Read ``probe`` every ``period_s`` until the CUDA event ``end`` is reached, and return right after
    it (the event is polled every 0.2 ms: the GPU gets no rest it would not have had). [] without a probe
    or off CUDA (``end`` is then a host time)."""
    if probe is None or not hasattr(end, "query"):
        return []
    samples, next_read = [], 0.0
    while not end.query():
        now = time.perf_counter()
        if now >= next_read:
            r = probe.read()
            if r is not None:
                samples.append(r)
            next_read = now + period_s
        time.sleep(0.0002)
    return samples


def summary(samples: list[dict]) -> dict | None:
    """Medians of clock, power and temperature, and the share of the samples in which each clock-event
    reason was set (``reason_share``; None where the reasons could not be read). None without samples."""
    if not samples:
        return None
    out = {k: statistics.median(s[k] for s in samples) for k in ("clock_mhz", "power_w")}
    temps = [s["temperature_c"] for s in samples if s.get("temperature_c") is not None]
    out["temperature_c"] = statistics.median(temps) if temps else None
    masks = [s["reasons"] for s in samples if s.get("reasons") is not None]
    share = None
    if masks:
        counts: dict[str, int] = {}
        for mask in masks:
            for word in hw.reason_words(mask):
                counts[word] = counts.get(word, 0) + 1
        share = {word: n / len(masks) for word, n in sorted(counts.items(), key=lambda kv: -kv[1])}
    return {**out, "samples": len(samples), "reason_share": share}


def workload(cfg, dev) -> tuple[dict, Callable[[], None]]:
    """The lab's one-GPU model on ``dev``: (``BENCH`` updated by ``cfg``, one forward-and-backward step)."""
    cfg = {**BENCH, **(cfg or {})}
    dtype, L, H, N = getattr(torch, cfg["dtype"]), cfg["n_layers"], cfg["hidden"], cfg["rows"]
    full = nn.Sequential(*make_blocks(L, H, device=dev, dtype=dtype))
    x, y = make_batch(N, H, device=dev, dtype=dtype)

    def step():
        F.mse_loss(full(x), y).backward()
    return cfg, step


def measure_one_gpu(cfg=None, device="cuda:0") -> dict:
    """Part 1's one-GPU training step (``BENCH``'s model, forward + backward) back to back, then with the
    GPU resting one step's time before each step -- the duty of each GPU of the split -- with NVML read
    throughout.

    Returns JSON-able data: ``one_gpu_ms`` / ``one_gpu_rested_ms`` (medians) and their samples,
    ``rest_ms``, ``power_limit_w`` and ``nvml`` (``summary`` of the readings, back to back and rested;
    None where NVML cannot be read).
    """
    dev = torch.device(device)
    cfg, step = workload(cfg, dev)
    clock = timing.Clock(dev)
    with nvml_probe(dev) if dev.type == "cuda" else contextlib.nullcontext() as probe:
        def read(end):  # NVML's clock, power and clock-event reasons while the timed call runs
            return while_running(end, probe)

        back_to_back, b2b = timed_steps(step, clock, cfg["warmup"], cfg["repeat"], read=read)
        rest_s = statistics.median(back_to_back) / 1e3
        rested, rested_readings = timed_steps(step, clock, 1, cfg["repeat"], rest_s=rest_s, read=read)
        limit = probe.power_limit_w() if probe is not None else None
    del step  # the model and batch live in its closure: free them before returning
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"config": cfg, "device": str(dev),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "one_gpu_ms": statistics.median(back_to_back), "one_gpu_samples_ms": back_to_back,
            "one_gpu_rested_ms": statistics.median(rested), "one_gpu_rested_samples_ms": rested,
            "rest_ms": rest_s * 1e3, "power_limit_w": limit,
            "nvml": {"back to back": summary(b2b), "rested": summary(rested_readings)}}


TIMELINE_REST_S = 3.0   # idle before the run: the averages the limits watch fall back (no reason set after it)
TIMELINE_RUN_S = 3.0    # each run: several power-averaging windows of about a second
TIMELINE_PERIOD_S = 0.01
PHASES = ("rest", "back to back", "rest again", "rested steps")


def _read_until(probe: NvmlProbe, t0: float, phase: str, computing: bool, done, samples: list,
                period_s: float) -> None:
    """Read ``probe`` every ``period_s`` until ``done()``; each reading gets ``phase``, ``computing`` and
    ``t_s`` (seconds since ``t0``, host clock)."""
    next_read = 0.0
    while not done():
        now = time.perf_counter()
        if now >= next_read:
            r = probe.read()
            if r is not None:
                samples.append({"phase": phase, "t_s": round(now - t0, 4), "computing": computing, **r})
            next_read = now + period_s
        time.sleep(0.0002)


def power_timeline(cfg=None, device="cuda:0", rest_s: float = TIMELINE_REST_S, run_s: float = TIMELINE_RUN_S,
                   period_s: float = TIMELINE_PERIOD_S) -> dict:
    """Part 1's one-GPU training step, with NVML read every ``period_s`` through four phases (``PHASES``):
    ``rest`` (idle ``rest_s``), ``back to back`` (steps with no pause for ``run_s``: two queued at a time,
    so the GPU never waits for the host), ``rest again`` (idle ``rest_s``) and ``rested steps`` (for
    ``run_s``, each step after an idle pause as long as a back-to-back step: the duty of each GPU of the
    split). ``t_s`` counts from each phase's start; ``computing`` says whether a step was running.

    Returns JSON-able data: ``samples`` (NVML readings), ``step_ms`` (per phase, each step's time from CUDA
    events: back to back, consecutive ends; rested, start to end), ``rest_s``, ``run_s``, ``power_limit_w``.

    Where NVML cannot be read there, ``samples`` is [] (and no step runs).

    Raises:
        RuntimeError: not a CUDA device.
    """
    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        raise RuntimeError(f"power_timeline needs a CUDA device, got {device!r}. HINT: run it on a GPU machine; "
                           "elsewhere the notebook shows the recording.")
    cfg, step = workload(cfg, dev)
    clock = timing.Clock(dev)
    for _ in range(cfg["warmup"]):
        step()
    clock.synchronize()
    samples: list[dict] = []
    steps: dict[str, list[float]] = {"back to back": [], "rested steps": []}
    with nvml_probe(dev) as probe:
        if probe is None:  # no nvidia-ml-py, or a driver without the queries: nothing to follow
            return {"config": cfg, "device": str(dev), "gpu": torch.cuda.get_device_name(dev), "rest_s": rest_s,
                    "run_s": run_s, "period_s": period_s, "pause_ms": None, "power_limit_w": None,
                    "step_ms": steps, "samples": []}
        t0 = time.perf_counter()
        _read_until(probe, t0, "rest", False, lambda: time.perf_counter() - t0 >= rest_s, samples, period_s)
        t0 = time.perf_counter()
        marks = [clock.mark()]
        while time.perf_counter() - t0 < run_s:
            step()
            marks.append(clock.mark())
            if len(marks) > 2:  # keep two steps queued: read while the older one runs
                _read_until(probe, t0, "back to back", True, marks[-2].query, samples, period_s)
        _read_until(probe, t0, "back to back", True, marks[-1].query, samples, period_s)
        clock.synchronize()
        steps["back to back"] = [clock.elapsed_ms(a, b) for a, b in zip(marks, marks[1:])]
        pause_s = statistics.median(steps["back to back"]) / 1e3
        t0 = time.perf_counter()
        _read_until(probe, t0, "rest again", False, lambda: time.perf_counter() - t0 >= rest_s, samples, period_s)
        t0 = time.perf_counter()
        pairs = []
        while time.perf_counter() - t0 < run_s:
            idle_until = time.perf_counter() + pause_s
            _read_until(probe, t0, "rested steps", False, lambda: time.perf_counter() >= idle_until, samples,
                        period_s)
            start = clock.mark()
            step()
            end = clock.mark()
            _read_until(probe, t0, "rested steps", True, end.query, samples, period_s)
            pairs.append((start, end))
        clock.synchronize()
        steps["rested steps"] = [clock.elapsed_ms(a, b) for a, b in pairs]
        limit = probe.power_limit_w()
    del step  # the model and batch live in its closure: free them before returning
    torch.cuda.empty_cache()
    return {"config": cfg, "device": str(dev), "gpu": torch.cuda.get_device_name(dev), "rest_s": rest_s,
            "run_s": run_s, "period_s": period_s, "pause_ms": pause_s * 1e3, "power_limit_w": limit,
            "step_ms": steps, "samples": samples}
