"""Lab 08's verdicts, from the recordings ``08_ddp``, ``08_zero`` and ``08_fsdp`` (see ``measure``).

``CLAIMS`` maps each recording to the function that judges it; the notebook prints exactly these
lines and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/``.
"""
from __future__ import annotations

from labutils import claims

from .memory import formula

GIB = 2**30


def hidden_fraction(compute_ms: float, comm_ms: float, step_ms: float) -> float:
    """Share of the all-reduce that backward hid: (compute + comm - step) / comm."""
    return (compute_ms + comm_ms - step_ms) / comm_ms


def best_bucket(data: dict) -> dict:
    """The sweep's row with the fastest DDP step."""
    return min(data["sweep"], key=lambda r: r["step_ms"])


def speedup(data: dict) -> float:
    """DDP's throughput over one GPU's: N x t(one GPU, same per-GPU batch) / t(DDP step)."""
    return data["world_size"] * data["compute_ms"] / best_bucket(data)["step_ms"]


def ddp_verdicts(data: dict) -> list[claims.Verdict]:
    n, c = data["world_size"], data["compute_ms"]
    best = best_bucket(data)
    one = max(data["sweep"], key=lambda r: r["bucket_cap_mb"])
    s = speedup(data)
    h_best = hidden_fraction(c, best["comm_ms"], best["step_ms"])
    h_one = hidden_fraction(c, one["comm_ms"], one["step_ms"])
    saved = data["no_bucket_view"]["state_bytes"] - best["state_bytes"]
    grads = 4 * data["n_params"]
    return [
        claims.at_least(f"DDP on {n} GPUs trains a compute-bound transformer at >= 1.85x one GPU's throughput", s, 1.85,
                        figure=f"{s:.2f}x = {n} x {c:.1f} ms (one GPU) / {best['step_ms']:.1f} ms "
                               f"(DDP, {best['bucket_cap_mb']} MB buckets)"),
        claims.at_least("At the best bucket size, backward hides >= 70% of the gradient all-reduce", h_best, 0.70,
                        figure=f"{h_best:.0%} of {best['comm_ms']:.1f} ms hidden ({best['bucket_cap_mb']} MB cap, "
                               f"all-reduce calls: {best['n_buckets']})"),
        claims.at_most("With a cap above the model's size the all-reduce waits for the whole backward: little is hidden", h_one, 0.25,
                       figure=f"{h_one:.0%} of {one['comm_ms']:.1f} ms hidden ({one['bucket_cap_mb']} MB cap, "
                              f"all-reduce calls: {one['n_buckets']})"),
        claims.within("gradient_as_bucket_view=True saves one copy of the gradients (4 bytes per parameter)",
                      saved, grads, 0.10, figure=f"{saved / GIB:.2f} GiB saved; 4Ψ = {grads / GIB:.2f} GiB"),
    ]


def zero_verdicts(data: dict) -> list[claims.Verdict]:
    out = []
    for row in data["rows"]:
        out.append(claims.within(
            f"{row['scheme']}: peak memory per rank = {formula(row['scheme'])} (fp32 Adam, ZeRO paper's counting)",
            row["peak_bytes"], row["predicted_bytes"], 0.10,
            figure=f"measured {row['peak_bytes'] / GIB:.2f} GiB, predicted {row['predicted_bytes'] / GIB:.2f} GiB"))
    worst = max(abs(r["volume_psi"] / 2.0 - 1) for r in data["rows"])
    out.append(claims.at_most(
        "DDP by hand, ZeRO-1 and ZeRO-2 all communicate 2Ψ per step", worst, 0.02,
        figure=", ".join(f"{r['scheme']} {r['volume_psi']:.3f}Ψ" for r in data["rows"]) + f" (worst off by {worst:.1%})"))
    return out


def fsdp_rows(data: dict) -> dict:
    return {r["name"]: r for r in data["rows"]}


def fsdp_verdicts(data: dict) -> list[claims.Verdict]:
    rows = fsdp_rows(data)
    ddp, f = rows["DDP"], rows["FSDP2"]
    keep = rows["FSDP2, reshard_after_forward=False"]
    pre_name = next(k for k in rows if "prefetch" in k)
    pre = rows[pre_name]
    ratio = f["state_bytes"] / ddp["state_bytes"]
    return [
        claims.at_most("FSDP2 holds <= 0.55x DDP's per-GPU memory for weights + gradients + Adam state", ratio, 0.55,
                       figure=f"{ratio:.2f}x: {f['state_bytes'] / GIB:.2f} GiB vs {ddp['state_bytes'] / GIB:.2f} GiB "
                              f"on each of {data['world_size']} GPUs"),
        claims.within("FSDP2 (ZeRO-3) communicates 3Ψ per step", f["volume_psi"], 3.0, 0.02,
                      figure=f"{f['volume_psi']:.3f}Ψ"),
        claims.within("reshard_after_forward=False skips the backward all-gathers: 2Ψ per step",
                      keep["volume_psi"], 2.0, 0.02, figure=f"{keep['volume_psi']:.3f}Ψ"),
        claims.compare("reshard_after_forward=False raises the peak memory (full weights kept for backward)",
                       keep["peak_bytes"] / f["peak_bytes"], ">", 1.0,
                       figure=f"peak {keep['peak_bytes'] / GIB:.2f} GiB vs {f['peak_bytes'] / GIB:.2f} GiB"),
        claims.at_least(f"{pre_name} makes the step >= 2% faster than FSDP2's default", f["step_ms"] / pre["step_ms"],
                        1.02, figure=f"{pre['step_ms']:.1f} ms vs {f['step_ms']:.1f} ms"),
    ]


CLAIMS = {"08_ddp": ddp_verdicts, "08_zero": zero_verdicts, "08_fsdp": fsdp_verdicts}
