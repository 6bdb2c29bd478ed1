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
"""
from __future__ import annotations

import contextlib
import statistics
import time

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


def measure_one_gpu(cfg=None, device="cuda:0") -> dict:
    """Part 1's one-GPU training step (``BENCH``'s model, forward + backward) back to back, then with the
    GPU resting one step's time before each step -- the duty of each GPU of the split -- with NVML read
    throughout.

    Returns JSON-able data: ``one_gpu_ms`` / ``one_gpu_rested_ms`` (medians) and their samples,
    ``rest_ms``, ``power_limit_w`` and ``nvml`` (``summary`` of the readings, back to back and rested;
    None where NVML cannot be read).
    """
    cfg = {**BENCH, **(cfg or {})}
    dev = torch.device(device)
    dtype, L, H, N = getattr(torch, cfg["dtype"]), cfg["n_layers"], cfg["hidden"], cfg["rows"]
    full = nn.Sequential(*make_blocks(L, H, device=dev, dtype=dtype))
    x, y = make_batch(N, H, device=dev, dtype=dtype)

    def step():
        F.mse_loss(full(x), y).backward()
    clock = timing.Clock(dev)
    with nvml_probe(dev) if dev.type == "cuda" else contextlib.nullcontext() as probe:
        def read(end):  # NVML's clock, power and clock-event reasons while the timed call runs
            return while_running(end, probe)

        back_to_back, b2b = timed_steps(step, clock, cfg["warmup"], cfg["repeat"], read=read)
        rest_s = statistics.median(back_to_back) / 1e3
        rested, rested_readings = timed_steps(step, clock, 1, cfg["repeat"], rest_s=rest_s, read=read)
        limit = probe.power_limit_w() if probe is not None else None
    del full, x, y
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"config": cfg, "device": str(dev),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "one_gpu_ms": statistics.median(back_to_back), "one_gpu_samples_ms": back_to_back,
            "one_gpu_rested_ms": statistics.median(rested), "one_gpu_rested_samples_ms": rested,
            "rest_ms": rest_s * 1e3, "power_limit_w": limit,
            "nvml": {"back to back": summary(b2b), "rested": summary(rested_readings)}}
