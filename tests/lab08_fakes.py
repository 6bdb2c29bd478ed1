"""Synthetic lab 08 recordings with the structure ``measure.ddp/zero/fsdp`` returns, for tests of the
verdicts and of the notebook's plotting cells on machines without GPUs. Never written to
notebooks/recorded/: the figures are invented (``scale`` moves them across the thresholds)."""
from __future__ import annotations

from labutils.labs.lab08_data_parallel import memory, trace
from labutils.labs.lab08_data_parallel import model as M

PSI = M.n_params(M.BENCH)


def _events(comm_after_backward: bool) -> list[dict]:
    """A step's kernels: forward GEMMs, backward GEMMs, NCCL all-reduces beside or after them."""
    ev, t = [], 0.0
    for name, n in (("forward", 20), ("backward", 40)):
        start = t
        for _ in range(n):
            ev.append({"ph": "X", "cat": "kernel", "name": "sm90_gemm", "ts": t, "dur": 900.0})
            t += 1000.0
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": name, "ts": start, "dur": t - start})
    comm_start = t if comm_after_backward else 22000.0
    for k in range(8):
        ev.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                   "ts": comm_start + k * 600.0, "dur": 500.0})
    return ev


def ddp(speedup: float = 1.93, hidden_best: float = 0.8, world_size: int = 2) -> dict:
    compute = 65.0
    comm = 4.2
    best_step = world_size * compute / speedup
    caps = M.BENCH["bucket_caps_mb"]
    sweep = []
    for cap in caps:
        step = best_step if cap == 16 else best_step + 2.0 if cap == max(caps) else best_step + 0.8
        n = max(1, int(4 * PSI / (cap * 2**20)))
        sweep.append({"bucket_cap_mb": cap, "gradient_as_bucket_view": True, "state_bytes": 16.0 * PSI,
                      "bucket_bytes": [4 * PSI // n] * n, "n_buckets": n, "volume_psi": 2.0,
                      "step_ms": step, "comm_ms": comm})
    best = min(sweep, key=lambda r: r["step_ms"])
    best["comm_ms"] = (best["step_ms"] - compute) / (1 - hidden_best)  # so that exactly hidden_best is hidden
    traces = {}
    for label, after in (("best bucket", False), ("one bucket", True)):
        per_rank = []
        for rank in range(world_size):
            s = trace.summarize(_events(after), lane=f"rank {rank}")
            per_rank.append(dict(s, bucket_cap_mb=16 if not after else max(caps), file=None))
        traces[label] = per_rank
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


def fsdp(state_ratio: float = 0.51, world_size: int = 2) -> dict:
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
    return {"config": M.BENCH, "world_size": world_size, "n_params": PSI, "rows": rows}


def write_all(directory) -> None:
    """Save the three fakes as recordings in ``directory`` (for executing the notebook without GPUs)."""
    from labutils import recorded
    for name, data in (("08_ddp", ddp()), ("08_zero", zero()), ("08_fsdp", fsdp())):
        recorded.save(name, data, fingerprint="SYNTHETIC test data | not a measurement", directory=directory)
