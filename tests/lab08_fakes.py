"""Synthetic lab 08 recordings with the structure ``measure.ddp/zero/fsdp`` returns, for tests of the
verdicts and of the notebook's plotting cells on machines without GPUs. Never written to
notebooks/recorded/: the figures are invented (``scale`` moves them across the thresholds)."""
from __future__ import annotations

from labutils.labs.lab08_data_parallel import memory, trace
from labutils.labs.lab08_data_parallel import model as M

PSI = M.n_params(M.BENCH)


def _events(comm_after_backward: bool, comm: bool = True) -> list[dict]:
    """A step's kernels: forward GEMMs, backward GEMMs, NCCL all-reduces beside or after them (or none:
    ``comm=False``, a no_sync step)."""
    ev, t = [], 0.0
    for name, n in (("forward", 20), ("backward", 40)):
        start = t
        for _ in range(n):
            ev.append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": t, "dur": 900.0})
            t += 1000.0
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "ts": start, "dur": t - start})
    comm_start = t if comm_after_backward else 22000.0
    for k in range(8 if comm else 0):
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                   "ts": comm_start + k * 600.0, "dur": 500.0})
    return ev


def _traces(labels: dict, world_size: int, **tags) -> dict:
    """``{label: [summary per rank]}`` from ``{label: (comm_after_backward, comm)}``."""
    return {label: [dict(trace.summarize(_events(after, comm), lane=f"rank {rank}"), file=None, **tags)
                    for rank in range(world_size)]
            for label, (after, comm) in labels.items()}


def ddp(speedup: float = 1.93, hidden_best: float = 0.8, one_hidden: float = -0.5, wrapper: float = 0.005,
        few_ctas_gain: float = 0.02, saved_psi: float = 4.0, world_size: int = 2) -> dict:
    """A recording in ``measure.ddp``'s format whose verdicts sit where the arguments put them: the fastest
    configuration is 16 MB on 4 CTAs, ``few_ctas_gain`` faster than 16 MB on NCCL's default."""
    plain = 65.0
    no_sync = plain * (1 + wrapper)
    best_step = world_size * plain / speedup
    default16 = best_step / (1 - few_ctas_gain)

    def row(cap, ctas, step, comm):
        n = max(1, int(4 * PSI / (cap * 2**20)))
        return {"bucket_cap_mb": cap, "ctas": ctas, "bucket_bytes": [4 * PSI // n] * n, "n_buckets": n,
                "volume_psi": 2.0, "step_ms": step, "no_sync_ms": no_sync, "comm_ms": comm, "spread": 0.004}

    one_step = default16 + 2.0
    sweep = [row(1, None, default16 + 0.5, 6.0), row(16, None, default16, 5.6), row(256, None, default16 + 0.4, 4.2),
             row(2048, None, one_step, (one_step - no_sync) / (1 - one_hidden))]
    for ctas in (16, 8, 4, 2):
        step = best_step if ctas == 4 else (best_step + default16) / 2
        comm = (best_step - no_sync) / (1 - hidden_best) if ctas == 4 else 5.6 * 24 / ctas
        sweep.append(row(16, ctas, step, comm))
    memory = {"bucket_cap_mb": 16, "ctas": 4,
              "view": {"state_bytes": 16.0 * PSI, "grad_copy_bytes": 0.0},
              "no_view": {"state_bytes": (16.0 + saved_psi) * PSI, "grad_copy_bytes": saved_psi * PSI}}
    traces = _traces({"one bucket": (True, True)}, world_size, bucket_cap_mb=2048, ctas=None)
    traces.update(_traces({"best": (False, True), "best, no_sync": (False, False)}, world_size,
                          bucket_cap_mb=16, ctas=4))
    cfg = dict(M.BENCH)
    return {"config": cfg, "world_size": world_size, "n_params": PSI, "gpu": "NVIDIA H200", "compute_ms": plain,
            "cta_cap_mb": 16, "sweep": sweep, "memory": memory, "traces": traces}


def legacy_ddp(speedup: float = 1.93, hidden_best: float = 0.8, world_size: int = 2) -> dict:
    """A recording in the format ``measure.ddp`` wrote before the no_sync baseline and the CTA sweep."""
    compute = 65.0
    comm = 4.2
    best_step = world_size * compute / speedup
    caps = [1, 4, 16, 64, 256, 2048]
    sweep = []
    for cap in caps:
        step = best_step if cap == 16 else best_step + 2.0 if cap == max(caps) else best_step + 0.8
        n = max(1, int(4 * PSI / (cap * 2**20)))
        sweep.append({"bucket_cap_mb": cap, "gradient_as_bucket_view": True, "state_bytes": 16.0 * PSI,
                      "bucket_bytes": [4 * PSI // n] * n, "n_buckets": n, "volume_psi": 2.0,
                      "step_ms": step, "comm_ms": comm})
    best = min(sweep, key=lambda r: r["step_ms"])
    best["comm_ms"] = (best["step_ms"] - compute) / (1 - hidden_best)  # so that exactly hidden_best is hidden
    traces = _traces({"best bucket": (False, True), "one bucket": (True, True)}, world_size)
    for label, cap in (("best bucket", 16), ("one bucket", max(caps))):
        for t in traces[label]:
            t["bucket_cap_mb"] = cap
            del t["idle_ms"]  # not in the summaries of that time
    return {"config": M.BENCH, "world_size": world_size, "n_params": PSI, "gpu": "NVIDIA H200",
            "compute_ms": compute, "one_gpu_state_bytes": 16.0 * PSI, "sweep": sweep,
            "no_bucket_view": {"bucket_cap_mb": 16, "gradient_as_bucket_view": False, "state_bytes": 20.0 * PSI,
                               "bucket_bytes": [], "n_buckets": 76, "volume_psi": 2.0, "step_ms": best_step + 1},
            "traces": traces}


def zero(off_by: float = 0.03, world_size: int = 2) -> dict:
    rows = []
    for scheme, calls in (("DDP", {"all_reduce": 290}), ("ZeRO-1", {"reduce_scatter": 290, "all_gather": 290}),
                          ("ZeRO-2", {"reduce_scatter": 290, "all_gather": 290})):
        pred = memory.predicted_bytes(scheme, PSI, world_size)
        rows.append({"scheme": scheme, "peak_bytes": pred * (1 + off_by), "predicted_bytes": pred,
                     "volume_psi": 2.0, "calls": calls})
    return {"config": M.BENCH, "world_size": world_size, "n_params": PSI, "rows": rows}


def fsdp(state_ratio: float = 0.51, world_size: int = 2, traced: bool = True) -> dict:
    ddp_state = 16.0 * PSI
    rows = [
        {"name": "DDP", "state_bytes": ddp_state, "peak_bytes": ddp_state + 20e9, "volume_psi": 2.0,
         "calls": {"all_reduce": 76}, "step_ms": 67.0},
        {"name": "FSDP2", "state_bytes": ddp_state * state_ratio, "peak_bytes": ddp_state / 2 + 21e9,
         "volume_psi": 2.999, "calls": {"all_gather": 49, "reduce_scatter": 25}, "step_ms": 70.0},
        {"name": "FSDP2, reshard_after_forward=False", "state_bytes": ddp_state * state_ratio,
         "peak_bytes": ddp_state / 2 + 21.6e9, "volume_psi": 2.0, "calls": {"all_gather": 25, "reduce_scatter": 25},
         "step_ms": 69.0},
        {"name": f"FSDP2, prefetch {M.BENCH['prefetch']} blocks", "state_bytes": ddp_state * state_ratio,
         "peak_bytes": ddp_state / 2 + 21.2e9, "volume_psi": 2.999,
         "calls": {"all_gather": 49, "reduce_scatter": 25}, "step_ms": 69.9},
    ]
    if traced:  # measure.traced_variants: FSDP2's default and explicit prefetch
        for r in (rows[1], rows[3]):
            r["trace"] = [{k: v for k, v in t.items() if k != "spans"}
                          for t in _traces({"x": (False, True)}, world_size)["x"]]
    return {"config": M.BENCH, "world_size": world_size, "n_params": PSI, "rows": rows}


def write_all(directory) -> None:
    """Save the three fakes as recordings in ``directory`` (for executing the notebook without GPUs)."""
    from labutils import recorded
    for name, data in (("08_ddp", ddp()), ("08_zero", zero()), ("08_fsdp", fsdp())):
        recorded.save(name, data, fingerprint="SYNTHETIC test data | not a measurement", directory=directory)
