"""Lab 02's measurements, run inside launched ranks: collectives, tensors vs objects, partition imbalance.

Every function has the rank-function signature ``fn(rank, world_size, ...)`` and returns JSON-able
data, so a notebook cell is ``POOL.run(measure.fn, ...)`` inside ``recorded.live_or_recorded``. Under
gloo the same functions run on CPU tensors with small sizes (``tests/test_tensor_parallel.py`` does
that); timings use ``labutils.timing`` (CUDA events, warm-ups, medians, the slowest rank). The paths a
byte can take between two GPUs are in ``paths``, the tensor-parallel MLP in ``steps``, the
correctness checks in ``verify``.
"""
from __future__ import annotations

import math
import pickle
import statistics
import time

import torch
import torch.distributed as dist

from ... import bandwidth, timing
from ...compat import all_gather_into_tensor, reduce_scatter_tensor
from ...config import rank_device
from .verify import DTYPES, uneven_list_gather

SWEEP_OPS = ("all_gather", "all_gather_into_tensor", "reduce_scatter_tensor", "all_reduce")


# ----------------------------------------------------------------------------- collectives
def _collective(op: str, size_bytes: int, n: int, dev, dt):
    """(S in nccl-tests' convention, a zero-argument call issuing ``op`` once)."""
    elem = torch.empty(0, dtype=dt).element_size()
    count = max(n, size_bytes // elem // n * n)  # elements of S, a multiple of n
    z = lambda k: torch.zeros(k, device=dev, dtype=dt)  # noqa: E731 (zeros: sums never overflow)
    if op == "all_gather":
        inp, outs = z(count // n), [z(count // n) for _ in range(n)]
        return count * elem, lambda: dist.all_gather(outs, inp)
    if op == "all_gather_into_tensor":
        inp, out = z(count // n), z(count)
        return count * elem, lambda: all_gather_into_tensor(out, inp)
    if op == "reduce_scatter_tensor":
        inp, out = z(count), z(count // n)
        return count * elem, lambda: reduce_scatter_tensor(out, inp)
    if op == "all_reduce":
        buf = z(count)
        return count * elem, lambda: dist.all_reduce(buf)
    raise ValueError(f"unknown op {op!r}. HINT: one of {SWEEP_OPS}.")


def collective_sweep(rank: int, world_size: int, sizes_bytes: list[int], ops=SWEEP_OPS,
                     dtype: str = "bfloat16", warmup: int = 5, iters: int = 20, repeat: int = 5) -> dict:
    """nccl-tests-style sweep: time (slowest rank, median), algbw and busbw per op and size.

    Returns:
        ``{"world_size", "dtype", "ops": {op: {"size_bytes", "time_ms", "p10_ms", "p90_ms",
        "algbw_gbps", "busbw_gbps"}}}``; sizes as nccl-tests' S (see ``labutils.bandwidth``).
    """
    dev, dt = rank_device(), DTYPES[dtype]
    result = {"world_size": world_size, "dtype": dtype, "ops": {}}
    for op in ops:
        cols = {k: [] for k in ("size_bytes", "time_ms", "p10_ms", "p90_ms", "algbw_gbps", "busbw_gbps")}
        for size in sizes_bytes:
            s, call = _collective(op, size, world_size, dev, dt)
            t = timing.benchmark_collective(call, warmup=warmup, iters=iters, repeat=repeat)
            for k, v in (("size_bytes", s), ("time_ms", t.median_ms), ("p10_ms", t.p10_ms),
                         ("p90_ms", t.p90_ms), ("algbw_gbps", bandwidth.algbw_gbps(s, t.median_ms)),
                         ("busbw_gbps", bandwidth.busbw_gbps(op, s, t.median_ms, world_size))):
                cols[k].append(v)
            del call
        result["ops"][op] = cols
    return result


# ----------------------------------------------------------------------------- serialisation
def _field_value(v) -> int:
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal"}.get(v.valueType, "ullVal")
    return int(getattr(v.value, attr))


def nvlink_tx_bytes() -> int | None:
    """Bytes sent over NVLink so far by all GPUs together (NVML's data counter, field
    ``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX`` = 138, in KiB, scope = all links), or None when
    NVML, the counter or ``pynvml`` (package nvidia-ml-py) is not available."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML, no driver, no package: no witness
        return None
    try:
        total = 0
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            v = pynvml.nvmlDeviceGetFieldValues(handle, [(138, 0xFFFFFFFF)])[0]
            if v.nvmlReturn != 0:
                return None
            total += _field_value(v) * 1024
        return total
    except Exception:  # noqa: BLE001
        return None
    finally:
        pynvml.nvmlShutdown()


def link_bytes_per_call(call, iters: int) -> float | None:
    """NVLink bytes (all GPUs) per call of ``call``, read by rank 0 around ``iters`` calls."""
    clock = timing.Clock(rank_device())
    clock.synchronize()
    dist.barrier()
    before = nvlink_tx_bytes() if dist.get_rank() == 0 else None
    dist.barrier()
    for _ in range(iters):
        call()
    clock.synchronize()
    dist.barrier()
    time.sleep(0.1)  # let the counters settle
    after = nvlink_tx_bytes() if dist.get_rank() == 0 else None
    return None if before is None or after is None else (after - before) / iters


def object_vs_tensor(rank: int, world_size: int, sizes_bytes: list[int], repeat: int = 5,
                     link_iters: int = 5) -> dict:
    """The same tensor gathered two ways: ``all_gather_into_tensor`` (NCCL moves the bytes, no
    serialisation) and ``all_gather_object`` (pickle -> bytes -> all_gather of sizes and of padded
    byte tensors -> unpickle). Also times pickle/unpickle alone and, at the largest size, counts
    the NVLink bytes of each path (None without NVML).

    Returns:
        ``{"rows": [{size_bytes, tensor_ms, object_ms, pickle_ms, unpickle_ms, pickled_bytes,
        received_devices}], "link": {...}}``; times are the slowest rank's medians.
    """
    dev = rank_device()
    rows, link = [], {}
    for size in sizes_bytes:
        t = torch.zeros(size // 4, dtype=torch.float32, device=dev)
        out = torch.empty(world_size * t.numel(), dtype=t.dtype, device=dev)
        objs: list = [None] * world_size
        as_tensor = lambda: all_gather_into_tensor(out, t)  # noqa: E731
        as_object = lambda: dist.all_gather_object(objs, t)  # noqa: E731
        t_tensor = timing.benchmark_collective(as_tensor, warmup=3, iters=10, repeat=repeat)
        t_object = timing.benchmark_collective(as_object, warmup=1, iters=1, repeat=repeat)
        dumps, loads = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            blob = pickle.dumps(t)  # what all_gather_object does first (GPU -> CPU copy included)
            t1 = time.perf_counter()
            pickle.loads(blob)
            dumps.append((t1 - t0) * 1e3)
            loads.append((time.perf_counter() - t1) * 1e3)
        times = timing.slowest_rank([statistics.median(dumps), statistics.median(loads)])
        rows.append({"size_bytes": t.numel() * 4, "tensor_ms": t_tensor.median_ms,
                     "object_ms": t_object.median_ms, "pickle_ms": times[0], "unpickle_ms": times[1],
                     "pickled_bytes": len(blob),
                     "received_devices": sorted({str(o.device) for o in objs})})
        if size == max(sizes_bytes):
            link = {"size_bytes": t.numel() * 4,  # a ring all-gather: each rank sends (n-1) blocks
                    "payload_bytes_per_call": world_size * (world_size - 1) * t.numel() * 4,
                    "tensor_link_bytes_per_call": link_bytes_per_call(as_tensor, link_iters),
                    "object_link_bytes_per_call": link_bytes_per_call(as_object, link_iters)}
        del t, out, objs
    return {"world_size": world_size, "rows": rows, "link": link}


# ----------------------------------------------------------------------------- partitions
def _phase_times(phases, steps: int, warmup: int, dev) -> list[float]:
    """Median ms of each phase over ``steps`` back-to-back steps (clock marks between phases)."""
    clock = timing.Clock(dev)
    for _ in range(warmup):
        for _, fn in phases:
            fn()
    clock.synchronize()
    samples = [[] for _ in phases]
    for _ in range(steps):
        marks = [clock.mark()]
        for _, fn in phases:
            fn()
            marks.append(clock.mark())
        clock.synchronize()
        for s, a, b in zip(samples, marks, marks[1:]):
            s.append(clock.elapsed_ms(a, b))
    return [statistics.median(s) for s in samples]


def imbalance_sweep(rank: int, world_size: int, factors: list[float], rows: int = 8192,
                    cols: int = 8192, out_cols: int = 1024, dtype: str = "bfloat16", steps: int = 20,
                    warmup: int = 3) -> dict:
    """Source section 4.1: every rank computes ``x_r @ W`` (``rows x cols`` times ``cols x out_cols``,
    a compute-heavy step with a small output), rank 0 with ``k`` x the rows of the others, then all
    ranks all-gather the (padded) results. Returns per k every rank's median compute, all_gather and
    step time (ms): the fast ranks' "communication" time grows by exactly their idle time."""
    dev, dt = rank_device(), DTYPES[dtype]
    w = torch.randn(cols, out_cols, device=dev, dtype=dt) / math.sqrt(cols)
    out = {"world_size": world_size, "rows": rows, "cols": cols, "out_cols": out_cols, "factors": [],
           "compute_ms": [], "all_gather_ms": [], "step_ms": []}
    for k in factors:
        counts = [round(k * rows) if r == 0 else rows for r in range(world_size)]
        x = torch.randn(counts[rank], cols, device=dev, dtype=dt)
        padded = torch.zeros(max(counts), out_cols, device=dev, dtype=dt)
        gathered = torch.empty(world_size * max(counts), out_cols, device=dev, dtype=dt)
        phases = [("compute", lambda: torch.matmul(x, w, out=padded[: x.shape[0]])),
                  ("all_gather", lambda: all_gather_into_tensor(gathered, padded))]
        mine = torch.tensor(_phase_times(phases, steps, warmup, dev) + [0.0], dtype=torch.float64, device=dev)
        mine[2] = mine[0] + mine[1]
        every = torch.empty(world_size * 3, dtype=torch.float64, device=dev)
        all_gather_into_tensor(every, mine)
        every = every.view(world_size, 3).T.tolist()
        out["factors"].append(k)
        for key, v in zip(("compute_ms", "all_gather_ms", "step_ms"), every):
            out[key].append(v)
    return out


def partitions(rank: int, world_size: int, factors: list[float], **imbalance_kw) -> dict:
    """Section 4 in one launch: ``uneven_list_gather`` and ``imbalance_sweep(factors)``."""
    return {"uneven_list": uneven_list_gather(rank, world_size),
            "imbalance": imbalance_sweep(rank, world_size, factors, **imbalance_kw)}
