"""The SM clock and power of a GPU while it works (lab 04, part 1)::

    end = clock.mark()                                  # a CUDA event after the queued work
    samples = gpu_clock.while_running(end, "cuda:0")    # read every 5 ms until the event is reached
    gpu_clock.median(samples)                           # {"clock_mhz": ..., "power_w": ...} or None

A GPU does not run at one fixed clock: it raises and lowers its SM clock with the power it draws
and its temperature. ``read`` asks NVML through ``torch.cuda.clock_rate`` / ``power_draw`` (the
``pynvml`` module); where NVML cannot be read (no GPU, no ``pynvml``) there are no samples and
``median`` is None.
"""
from __future__ import annotations

import statistics
import time


def read(device) -> dict | None:
    """``{"clock_mhz", "power_w"}`` of one GPU now, or None where NVML cannot be read."""
    import torch
    try:
        return {"clock_mhz": float(torch.cuda.clock_rate(device)),
                "power_w": float(torch.cuda.power_draw(device)) / 1e3}
    except Exception:  # noqa: BLE001 - no GPU, no pynvml, or a driver without the counter
        return None


def while_running(end, device, period_s: float = 0.005) -> list[dict]:
    """Read the GPU every ``period_s`` until the CUDA event ``end`` has been reached (the queued work
    is done), and return right after it (the event is polled every 0.2 ms, so the caller's next work
    follows within about that: the GPU does not get a rest it would not have had). [] on the CPU
    (``end`` is a host time there) or where NVML cannot be read."""
    if not hasattr(end, "query"):
        return []
    samples, next_read = [], 0.0
    while not end.query():
        now = time.perf_counter()
        if now >= next_read:
            r = read(device)
            if r is None:
                end.synchronize()
                return []
            samples.append(r)
            next_read = now + period_s
        time.sleep(0.0002)
    return samples


def median(samples: list[dict]) -> dict | None:
    """Median clock (MHz) and power (W) of the samples, or None without samples."""
    if not samples:
        return None
    return {k: statistics.median(s[k] for s in samples) for k in ("clock_mhz", "power_w")}
