"""What the ``08_ddp`` recording says about overlap: pure arithmetic on ``measure.ddp``'s result.

    best = overlap.best(data)                       # the configuration with the fastest step
    overlap.hidden_fraction(best["no_sync_ms"], best["comm_ms"], best["step_ms"])
    overlap.sweep_table(data)                       # the notebook's table (a pandas DataFrame)

Every configuration (bucket cap x NCCL CTAs) is timed three ways on the same DDP wrapper:

* ``step_ms``: the DDP step, gradients all-reduced during backward;
* ``no_sync_ms``: the same step under ``ddp.no_sync()`` -- same wrapper, same hooks, no all-reduce;
* ``comm_ms``: the very all-reduces DDP issued (sizes from the ledger), back to back on the same
  communicator, without the model.

If nothing overlapped, step = no_sync + comm. The share of the all-reduce that backward hid is
(no_sync + comm - step) / comm; what communication cost the step is step - no_sync. Recordings made
before the no_sync baseline and the CTA sweep existed (``is_legacy``) have neither; their hidden share
was taken against the plain one-GPU step (``compute_ms``).
"""
from __future__ import annotations

DEFAULT = "NCCL default"


def hidden_fraction(baseline_ms: float, comm_ms: float, step_ms: float) -> float:
    """Share of the all-reduce time the step did not pay: (baseline + comm - step) / comm, where
    baseline is the same step without communication."""
    return (baseline_ms + comm_ms - step_ms) / comm_ms


def is_legacy(data: dict) -> bool:
    """True for a recording without the no_sync baseline and the CTA sweep (made before they existed)."""
    return "no_sync_ms" not in data["sweep"][0]


def ctas_label(ctas) -> str:
    """``"NCCL default"`` or ``"8 CTAs"``."""
    return DEFAULT if ctas is None else f"{ctas} CTAs"


def baseline_ms(data: dict, row: dict) -> float:
    """The step without communication that ``row`` is judged against: its no_sync step (legacy: the
    plain one-GPU step)."""
    return data["compute_ms"] if is_legacy(data) else row["no_sync_ms"]


def hidden(data: dict, row: dict) -> float:
    """``hidden_fraction`` of one configuration."""
    return hidden_fraction(baseline_ms(data, row), row["comm_ms"], row["step_ms"])


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
    then by decreasing CTA count. Empty for a legacy recording, or where no CTA sweep ran (gloo)."""
    if is_legacy(data) or data.get("cta_cap_mb") is None:
        return []
    rows = [r for r in data["sweep"] if r["bucket_cap_mb"] == data["cta_cap_mb"]]
    return sorted(rows, key=lambda r: -1 if r.get("ctas") is None else 1 / r["ctas"])


def speedup(data: dict) -> float:
    """DDP's throughput over one GPU's: N x t(one GPU, same per-GPU batch) / t(fastest DDP step)."""
    return data["world_size"] * data["compute_ms"] / best(data)["step_ms"]


def label(row: dict) -> str:
    """``"16 MB cap, 8 CTAs"``."""
    return f"{row['bucket_cap_mb']:g} MB cap, {ctas_label(row.get('ctas'))}"


def sweep_table(data: dict):
    """The configurations as a DataFrame, in measurement order (legacy: without the new columns)."""
    import pandas as pd
    rows = []
    for r in data["sweep"]:
        row = {"bucket_cap_mb": r["bucket_cap_mb"]}
        if not is_legacy(data):
            row["NCCL CTAs"] = ctas_label(r["ctas"])
        row["all-reduces"] = r["n_buckets"]
        row["step ms"] = r["step_ms"]
        if not is_legacy(data):
            row["no_sync ms"] = r["no_sync_ms"]
            row["comm cost ms"] = r["step_ms"] - r["no_sync_ms"]
        row["comm only ms"] = r["comm_ms"]
        row["hidden"] = hidden(data, r)
        row["x one GPU"] = data["world_size"] * data["compute_ms"] / r["step_ms"]
        if "spread" in r:
            row["step spread"] = r["spread"]
        rows.append(row)
    return pd.DataFrame(rows)


def decomposition(data: dict) -> dict | None:
    """Where the fastest configuration's step goes beyond the plain model's, in ms (None for a legacy
    recording): ``ddp_overhead`` = no_sync - plain (the wrapper and its hooks, no communication);
    ``comm_cost`` = step - no_sync (what communicating cost: the gradient copies into the buckets, the
    all-reduces' share of SMs and memory bandwidth, the exposed tail, waiting for the other rank); and
    from the traces of that configuration, rank 0, step vs no_sync: compute kernels busy longer
    (``compute_slowdown``), GPU idle longer (``idle_added``), NCCL time beside no compute kernel
    (``comm_alone_in_step``)."""
    if is_legacy(data):
        return None
    b = best(data)
    out = {"plain": data["compute_ms"], "no_sync": b["no_sync_ms"], "step": b["step_ms"],
           "ddp_overhead": b["no_sync_ms"] - data["compute_ms"], "comm_cost": b["step_ms"] - b["no_sync_ms"]}
    traces = data.get("traces", {})
    if "best" in traces and "best, no_sync" in traces:
        s, n = traces["best"][0], traces["best, no_sync"][0]
        out.update(compute_slowdown=s["compute_ms"] - n["compute_ms"], idle_added=s["idle_ms"] - n["idle_ms"],
                   comm_alone_in_step=s["comm_ms"] - s["overlap_ms"])
    return out


def rank_wait_ms(per_rank: list[dict]) -> float:
    """From one traced step on every rank: how much longer the busiest rank's NCCL kernels ran than the
    least busy rank's. The same all-reduces move the same bytes on every rank, so the difference is time
    a rank's kernels spent waiting for a rank that reached the collective later."""
    comm = [t["comm_ms"] for t in per_rank]
    return max(comm) - min(comm)
