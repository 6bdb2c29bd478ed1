"""What NVML's readings over time say about the limit that holds a GPU's clock (lab 04, part 1). Pure:
it reads the samples ``boost.power_timeline`` recorded, one dict per NVML reading::

    {"phase": "back to back", "t_s": 0.42, "computing": True, "clock_mhz": 1530.0, "power_w": 384.2,
     "temperature_c": 61.0, "reasons": 4}          # reasons: NVML's clock-event bit mask (hw.CLOCK_EVENT_REASONS)

    from labutils.labs.lab04_pipeline import power
    power.onset_s(samples, "back to back", "software power cap")   # first time the cap was reported
    power.power_ramp(samples, "back to back")                      # when the power *reading* got there

Why the reasons and not the power: NVML's power reading is an average over a window (about a second on
recent GPUs), so it lags what the GPU draws; the clock-event reasons are read at each sample.
"""
from __future__ import annotations

import statistics

from ... import hw

RAMP = 0.9            # the power reading "got there" once it reaches 90% of its median over the phase's last second


def readings(samples: list[dict], phase: str, computing: bool | None = True) -> list[dict]:
    """The readings of one phase (by default only those taken while the GPU computed), in time order."""
    return sorted((s for s in samples if s["phase"] == phase and (computing is None or s["computing"] == computing)),
                  key=lambda s: s["t_s"])


def words_of(sample: dict) -> list[str]:
    """The clock-event reasons set in one reading, in words ([] where they could not be read)."""
    return [] if sample.get("reasons") is None else hw.reason_words(sample["reasons"])


def share(rows: list[dict], *words) -> float | None:
    """Share of the readings ``rows`` in which any of ``words`` is set; None without readable reasons."""
    known = [r for r in rows if r.get("reasons") is not None]
    if not known:
        return None
    return sum(1 for r in known if set(words) & set(words_of(r))) / len(known)


def onset_s(samples: list[dict], phase: str, word: str) -> float | None:
    """The time (s from the phase's start) of the first reading of ``phase`` with ``word`` set, or None."""
    return next((r["t_s"] for r in readings(samples, phase) if word in words_of(r)), None)


def power_ramp(samples: list[dict], phase: str) -> dict | None:
    """When the power reading of ``phase`` reached ``RAMP`` of its final level (the median over the phase's
    last second): ``{"final_w", "ramp_s"}``, or None without readings."""
    rows = readings(samples, phase)
    if not rows:
        return None
    end = rows[-1]["t_s"]
    final = statistics.median(r["power_w"] for r in rows if r["t_s"] >= end - 1.0)
    ramp = next(r["t_s"] for r in rows if r["power_w"] >= RAMP * final)
    return {"final_w": final, "ramp_s": ramp}


def at(samples: list[dict], phase: str, t_s: float) -> dict | None:
    """The first reading of ``phase`` at or after ``t_s``."""
    return next((r for r in readings(samples, phase) if r["t_s"] >= t_s), None)


def phase_table(samples: list[dict], phases) -> list[dict]:
    """One row per phase: readings, medians of clock / power / temperature, and for each reason seen the share
    of readings with it and the first time it was set (computing readings only, except for an idle phase)."""
    out = []
    for phase in phases:
        rows = readings(samples, phase) or readings(samples, phase, computing=None)
        if not rows:
            continue
        temps = [r["temperature_c"] for r in rows if r.get("temperature_c") is not None]
        row = {"phase": phase, "readings": len(rows), "seconds": rows[-1]["t_s"] - rows[0]["t_s"],
               "SM clock (MHz)": statistics.median(r["clock_mhz"] for r in rows),
               "power reading (W)": statistics.median(r["power_w"] for r in rows),
               "temperature (C)": statistics.median(temps) if temps else None}
        seen = sorted({w for r in rows for w in words_of(r)})
        for w in seen:
            row[f"{w}: share"] = share(rows, w)
            row[f"{w}: from (s)"] = next(r["t_s"] for r in rows if w in words_of(r))
        out.append(row)
    return out
