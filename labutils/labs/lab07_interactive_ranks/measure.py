"""What a pool round trip costs next to a fresh ``labutils.launch``, measured around the whole call.

    data = measure.roundtrip(pool, tiny_all_reduce, CELL)   # the notebook's function and cell
    measure.table({"this machine": data})                    # pandas DataFrame, one row per source

Samples are wall-clock times in the notebook's process (``timing.benchmark`` on the CPU clock: what a
learner waits for), after warm-up calls; a launch is timed whole (start, work, teardown).
"""
from __future__ import annotations

import statistics
import sys

from ... import timing
from ...pickling import dumps
from ...launch import launch


def roundtrip(pool, fn, cell: str, *, repeat: int = 30, launches: int = 1) -> dict:
    """Time ``pool.run(fn)``, ``pool.exec(cell)`` (what a ``%%ranks`` cell does), pickling ``fn`` as
    ``run`` does, and ``launches`` fresh launches of ``fn`` with the pool's world size and backend.

    Returns:
        ``{"world_size", "backend", "start_s", "pool_ms", "exec_ms", "pickle_ms", "launch_ms", "modules"}``
        with the samples in ms; ``start_s`` is how long this pool's ranks took to start
        (``RankPool.start_s``); ``modules`` counts the modules imported in the notebook, which cloudpickle
        looks through when it pickles a function by value.
    """
    def run():
        pool.run(fn, output="quiet")

    def cell_exec():
        pool.exec(cell, output="quiet")

    def fresh():
        launch(fn, world_size=pool.world_size, backend=pool.backend, output="quiet")

    run_t = timing.benchmark(run, warmup=5, repeat=repeat, device="cpu")
    exec_t = timing.benchmark(cell_exec, warmup=5, repeat=repeat, device="cpu")
    pickle_t = timing.benchmark(lambda: dumps((fn, (), {})), warmup=2, repeat=repeat, device="cpu")
    launch_t = timing.benchmark(fresh, warmup=0, repeat=launches, device="cpu")
    return {"world_size": pool.world_size, "backend": pool.backend, "start_s": pool.start_s,
            "pool_ms": list(run_t.samples_ms), "exec_ms": list(exec_t.samples_ms),
            "pickle_ms": list(pickle_t.samples_ms), "launch_ms": list(launch_t.samples_ms),
            "modules": len(sys.modules)}


def medians(data: dict) -> dict:
    """Medians (ms) of the samples in ``data``; keys missing from an older recording are left out."""
    return {k: statistics.median(data[k]) for k in ("pool_ms", "exec_ms", "pickle_ms", "launch_ms") if data.get(k)}


def table(sources: dict):
    """One column per ``{label: data}``, one row per quantity: the pool's start (paid once), a launch
    (paid every call), the two round trips, pickling the function, and launch / round trip. A value an
    older recording lacks shows as NaN."""
    import pandas as pd
    nan = float("nan")
    cols = {}
    for label, d in sources.items():
        m = medians(d)
        cols[f"{label} ({d['backend']}, {d['world_size']} ranks)"] = {
            "pool start, once (s)": round(d.get("start_s") or nan, 2),
            "launch, every call (s)": round(m["launch_ms"] / 1e3, 2),
            "pool.run(fn) round trip (ms)": round(m["pool_ms"], 2),
            "%%ranks cell round trip (ms)": round(m.get("exec_ms", nan), 2),
            "pickling fn in the notebook (ms)": round(m.get("pickle_ms", nan), 2),
            "modules imported in the notebook": d.get("modules", nan),
            "launch / pool.run": round(m["launch_ms"] / m["pool_ms"])}
    return pd.DataFrame(cols)


def break_even_inputs(data: dict) -> dict | None:
    """``{"start_s", "launch_s", "roundtrip_s"}`` (medians) of a round-trip measurement, for the break-even
    exercise; None for an older recording without the pool's start."""
    if not data.get("start_s"):
        return None
    m = medians(data)
    return {"start_s": data["start_s"], "launch_s": m["launch_ms"] / 1e3, "roundtrip_s": m["pool_ms"] / 1e3}
