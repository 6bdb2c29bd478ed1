"""What the ``08_ddp`` recording says about overlap: pure arithmetic on ``measure.ddp``'s result.

    best = overlap.best(data)                     # the configuration with the fastest step
    best["exposed_ms"], best["comm_ms"]           # what communicating cost the step; the all-reduces alone
    best["overlap_fraction"], best["stretch_ms"], best["tail_ms"]   # from the kernel timeline (GPUs)
    overlap.sweep_table(data)                     # the notebook's table (a pandas DataFrame)

Every configuration (bucket cap x NCCL CTAs) is measured on one DDP wrapper, two ways.

**Timed** (CUDA events, each sample the slowest rank's): ``step_ms``, the DDP step; ``no_sync_ms``, the
same step under ``ddp.no_sync()`` -- same wrapper, hooks, forward and backward, no all-reduce; the two
sampled in turn, so ``exposed_ms``, the median of the per-sample differences step - no_sync, is what
communicating cost the step; ``comm_ms``, the very all-reduces DDP issued, back to back on the same
communicator, without the model.

**On the kernel timeline** (GPUs only: a few steps and as many no_sync steps under the profiler with CUDA
activity only, ``timeline`` below, one dict per rank; the row's fields are the slowest traced rank's):
``overlap_fraction``, the share of the NCCL kernels' time during which a compute kernel ran too;
``stretch_ms``, how much longer the compute kernels were busy in the step than under no_sync;
``tail_ms``, how long the compute stream stopped before the optimizer's kernels (waiting for the last
all-reduce); ``excess_ms``, the traced step's length minus the traced no_sync step's. The excess is the
stretch plus whatever else kept the compute stream from running (the tail, and any other gap).

Recordings made before the paired difference and the timeline existed (``measures_exposed`` False) hold
``step_ms``, ``no_sync_ms`` and ``comm_ms``; their hidden share was (no_sync + comm - step) / comm.
"""
from __future__ import annotations

import statistics

DEFAULT = "NCCL default"
TIMELINE_FIELDS = ("overlap_fraction", "stretch_ms", "tail_ms", "excess_ms")


def measures_exposed(data: dict) -> bool:
    """True for a recording with the paired difference (``exposed_ms``) in every configuration."""
    return all("exposed_ms" in r for r in data["sweep"])


def has_timeline(row: dict) -> bool:
    """True where the configuration was traced (GPUs): its timeline fields are numbers."""
    return all(row.get(k) is not None for k in TIMELINE_FIELDS)


def paired_difference(step_samples_ms, no_sync_samples_ms) -> tuple[float, list[float]]:
    """(median, samples) of step - no_sync, sample by sample: the two were timed in turn, so a drift of
    the machine moves both of a pair alike and leaves their difference.

    Raises:
        ValueError: the sample lists are empty or of different lengths (not timed in turn).
    """
    if not step_samples_ms or len(step_samples_ms) != len(no_sync_samples_ms):
        raise ValueError(f"paired samples needed: {len(step_samples_ms)} step vs {len(no_sync_samples_ms)} "
                         "no_sync samples. HINT: time both in one timing.benchmark_loops call.")
    diffs = [float(s) - float(n) for s, n in zip(step_samples_ms, no_sync_samples_ms)]
    return statistics.median(diffs), diffs


def timeline(step: dict, no_sync: dict) -> dict:
    """One rank's comparison of a traced step with a traced no_sync step (``trace.summarize`` of each,
    per step). See the module docstring for the fields."""
    return {"overlap_fraction": step["overlap_fraction"], "comm_ms": step["comm_ms"],
            "overlap_ms": step["overlap_ms"], "compute_ms": step["compute_ms"],
            "no_sync_compute_ms": no_sync["compute_ms"], "stretch_ms": step["compute_ms"] - no_sync["compute_ms"],
            "tail_ms": step["tail_ms"], "no_sync_tail_ms": no_sync["tail_ms"], "traced_step_ms": step["step_ms"],
            "traced_no_sync_ms": no_sync["step_ms"], "excess_ms": step["step_ms"] - no_sync["step_ms"]}


def slowest(per_rank: list[dict]) -> dict:
    """The timeline of the rank whose traced step was longest (the rank a collective step waits for)."""
    return max(per_rank, key=lambda t: t["traced_step_ms"])


def hidden_fraction(baseline_ms: float, comm_ms: float, step_ms: float) -> float:
    """Share of the all-reduce time the step did not pay: (baseline + comm - step) / comm, where
    baseline is the same step without communication (the judgement of older recordings)."""
    return (baseline_ms + comm_ms - step_ms) / comm_ms


def hidden(data: dict, row: dict) -> float:
    """``hidden_fraction`` of one configuration against its no_sync step."""
    return hidden_fraction(row["no_sync_ms"], row["comm_ms"], row["step_ms"])


def ctas_label(ctas) -> str:
    """``"NCCL default"`` or ``"8 CTAs"``."""
    return DEFAULT if ctas is None else f"{ctas} CTAs"


def best(data: dict) -> dict:
    """The configuration with the fastest DDP step."""
    return min(data["sweep"], key=lambda r: r["step_ms"])


def default_ctas(data: dict) -> list[dict]:
    """The bucket-cap sweep: configurations on NCCL's default CTA count, by cap."""
    return sorted((r for r in data["sweep"] if r.get("ctas") is None), key=lambda r: r["bucket_cap_mb"])


def one_bucket(data: dict) -> dict:
    """The largest cap on NCCL's default CTAs (one bucket when the cap exceeds the gradients)."""
    return default_ctas(data)[-1]


def cta_sweep(data: dict) -> list[dict]:
    """The CTA sweep: every configuration at the bucket cap the CTAs were swept at, NCCL's default first,
    then by decreasing CTA count. Empty where no CTA sweep ran (gloo)."""
    if data.get("cta_cap_mb") is None:
        return []
    rows = [r for r in data["sweep"] if r["bucket_cap_mb"] == data["cta_cap_mb"]]
    return sorted(rows, key=lambda r: -1 if r.get("ctas") is None else 1 / r["ctas"])


def speedup(data: dict) -> float:
    """DDP's throughput over one GPU's: N x t(one GPU, same per-GPU batch) / t(fastest DDP step)."""
    return data["world_size"] * data["compute_ms"] / best(data)["step_ms"]


def label(row: dict) -> str:
    """``"25 MB cap, 8 CTAs"``."""
    return f"{row['bucket_cap_mb']:g} MB cap, {ctas_label(row.get('ctas'))}"


def sweep_table(data: dict):
    """The configurations as a DataFrame, in measurement order. The timeline columns are NaN where the
    configuration was not traced (CPU ranks, or a recording made before the timeline existed)."""
    import pandas as pd
    nan = float("nan")
    new = measures_exposed(data)
    rows = []
    for r in data["sweep"]:
        traced = has_timeline(r)
        rows.append({
            "bucket_cap_mb": r["bucket_cap_mb"], "NCCL CTAs": ctas_label(r.get("ctas")),
            "all-reduces": r["n_buckets"], "step ms": r["step_ms"], "no_sync ms": r["no_sync_ms"],
            "exposed ms": r["exposed_ms"] if new else r["step_ms"] - r["no_sync_ms"],
            "all-reduce alone ms": r["comm_ms"],
            "exposed / alone": (r["exposed_ms"] if new else r["step_ms"] - r["no_sync_ms"]) / r["comm_ms"],
            "beside compute": r["overlap_fraction"] if traced else nan,
            "stretch ms": r["stretch_ms"] if traced else nan, "tail ms": r["tail_ms"] if traced else nan,
            "traced excess ms": r["excess_ms"] if traced else nan,
            "x one GPU": data["world_size"] * data["compute_ms"] / r["step_ms"]})
    return pd.DataFrame(rows)


def profiler_cost(data: dict) -> dict | None:
    """The fastest configuration's step three ways, each the slowest rank's: ``timed_ms`` (untraced, CUDA
    events), ``cuda_only_ms`` (traced with CUDA activity only; None without a timeline) and
    ``cpu_activity_ms`` (traced with CPU activity too), with ``cpu_activity_idle_ms``, the GPU's idle time in
    that trace. None where no trace with CPU activity exists (CPU ranks). Recordings without the timeline
    hold that trace as ``"best"``."""
    traces = data.get("traces", {})
    cpu = traces.get("best, CPU activity") or (traces.get("best") if not measures_exposed(data) else None)
    if not cpu:
        return None
    b, slow = best(data), max(cpu, key=lambda t: t["step_ms"])
    return {"timed_ms": b["step_ms"], "cpu_activity_ms": slow["step_ms"], "cpu_activity_idle_ms": slow["idle_ms"],
            "cuda_only_ms": slowest(b["timeline"])["traced_step_ms"] if b.get("timeline") else None}
