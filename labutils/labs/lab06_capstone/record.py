"""Lab 06's measurements: live where the GPUs are, else the recording -- or, for a clone that has no
recording of that name yet, a plain message instead of an error, so the notebook still runs.

    m = record.measurement("06_alpha_split", measure)    # recorded.Measurement, or None
"""
from __future__ import annotations

from ... import recorded


def measurement(name: str, measure, *, gpus_needed: int = 2):
    """``recorded.live_or_recorded(name, measure)``; None (and a message) when this machine cannot
    measure it and no recording exists."""
    try:
        return recorded.live_or_recorded(name, measure, gpus_needed=gpus_needed)
    except FileNotFoundError as exc:
        print(f"NOT AVAILABLE: this machine cannot measure {name!r} ({gpus_needed} GPUs needed) and there is "
              f"no recording of it yet.\n  {exc}\nThe cells that show it are skipped.")
        return None
