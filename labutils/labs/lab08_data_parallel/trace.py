"""What lab 08 reads in the trace of training steps (``instruments.profiler``): overlap, waits, spans.

    doc = profiler.profile(step, calls=2, cpu=False, path="traces/08_ddp_rank0.json.gz")  # kernels only
    t = trace.summarize(profiler.events(doc), lane="rank 0", steps=2)  # per step
    t["comm_ms"], t["overlap_ms"]            # NCCL kernel time, and how much of it ran beside compute
    t["tail_ms"]                             # the compute stream's wait before the optimizer's kernels
    t["idle_ms"]                             # time in the step when no kernel at all ran on the GPU
    plots.timeline_plot(t["spans"])          # phases, compute and optimizer kernels, NCCL kernels

Open the file in https://ui.perfetto.dev (or chrome://tracing): one row per CUDA stream; DDP's
all-reduces are the ``ncclDevKernel_AllReduce...`` kernels on NCCL's own stream, beside the backward's
GEMMs on the default stream. ``summarize`` reads the same file: kernels whose name starts with
``nccl`` are communication, every other kernel is compute; among those, the optimizer's kernels are
recognised by name (``is_optimizer_kernel``: AdamW's fused and foreach kernels).

With ``cpu=True`` the profiler also records every operator, hook and launch on the CPU thread that
issues the GPU work -- and slows that thread, so a step whose GPU waits for its CPU gets longer under
it. ``cpu=False`` records the GPU's kernels only (through CUPTI): the timeline of a step as it runs
untraced, to within the cost of recording kernels. The ``record_function`` phases ("forward",
"backward", "optimizer") appear as ``gpu_user_annotation`` events only with ``cpu=True``.
"""
from __future__ import annotations

from labutils.instruments import profiler

PHASES = ("forward", "backward", "optimizer")


def is_optimizer_kernel(name: str) -> bool:
    """True for the kernels of ``torch.optim``'s fused and foreach AdamW: their names hold ``adam``
    (``FusedAdamMathFunctor``) or ``multi_tensor`` (``multi_tensor_apply_kernel``, which runs every
    foreach update). Neither forward, backward nor DDP's bucket copies launch such kernels."""
    name = name.lower()
    return not name.startswith("nccl") and ("adam" in name or "multi_tensor" in name)


def wait_before(kernels, is_target) -> float:
    """Total time the GPU ran none of ``kernels`` just before each run of target kernels.

    ``kernels`` is a list of ``(start, end, name)``; a *run* is a maximal stretch of target kernels in
    start order. Before each run, the wait is the run's first start minus the latest end of the
    non-target kernels that started before it (zero if they still ran). Summed over the runs (a trace
    of several steps has one run per step)."""
    waited, last_end, in_run = 0.0, None, False
    for a, b, name in sorted(kernels):
        if is_target(name):
            if not in_run and last_end is not None:
                waited += max(0.0, a - last_end)
            in_run = True
        else:
            last_end = b if last_end is None else max(last_end, b)
            in_run = False
    return waited


def union(intervals) -> list[tuple[float, float]]:
    """Sorted, non-overlapping cover of ``(start, end)`` intervals."""
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def total(intervals) -> float:
    """Length covered by ``intervals``."""
    return sum(b - a for a, b in union(intervals))


def intersection(xs, ys) -> float:
    """Length covered by both interval sets."""
    xs, ys = union(xs), union(ys)
    i = j = 0
    covered = 0.0
    while i < len(xs) and j < len(ys):
        lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        covered += max(0.0, hi - lo)
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return covered


def merge_close(intervals, gap: float) -> list[tuple[float, float]]:
    """``union`` that also joins intervals less than ``gap`` apart (fewer bars to draw)."""
    out: list[list[float]] = []
    for a, b in union(intervals):
        if out and a - out[-1][1] < gap:
            out[-1][1] = b
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def summarize(events: list[dict], *, lane: str = "GPU", draw_gap_ms: float = 0.05, steps: int = 1) -> dict:
    """Kernels and phases of ``steps`` profiled steps, times per step in ms.

    Returns:
        ``{"step_ms", "compute_ms", "comm_ms", "overlap_ms", "overlap_fraction", "idle_ms", "tail_ms",
        "n_comm_kernels", "spans"}``: ``step_ms`` is the span from the first GPU event to the last over
        ``steps``; busy times are unions of kernel intervals over ``steps``; ``overlap_ms`` is the time
        NCCL kernels ran while a compute kernel ran too, ``overlap_fraction`` its share of ``comm_ms``;
        ``idle_ms`` the time within the step when no kernel, memcpy or memset ran (the GPU waited: for
        the CPU to issue work, or for another rank); ``tail_ms`` the time the compute kernels stopped
        before the optimizer's started (``wait_before``: the optimizer waiting for the last all-reduce),
        None when no optimizer kernel is in the trace; ``n_comm_kernels`` is over all ``steps``. ``spans``
        (for ``plots.timeline_plot``, in ms from the first GPU event) are the phases and the kernels,
        merged where less than ``draw_gap_ms`` apart.

    Raises:
        ValueError: the trace holds no GPU kernel (a CPU-only trace, or CUDA activity not recorded).
    """
    kernels = profiler.kernels(events)
    if not kernels:
        raise ValueError("the trace holds no GPU kernel. HINT: profile a step that runs on a GPU, with "
                         "ProfilerActivity.CUDA (profiler.profile adds it when CUDA is in use).")
    phases = [e for e in events if e.get("ph") == "X" and e.get("cat") == "gpu_user_annotation"
              and e.get("name") in PHASES]
    iv = lambda e: (float(e["ts"]) / 1e3, (float(e["ts"]) + float(e.get("dur", 0))) / 1e3)  # noqa: E731
    comm = [iv(k) for k in kernels if k["kind"] == "nccl"]
    compute = [iv(k) for k in kernels if k["kind"] == "compute"]
    optimizer = [iv(k) for k in kernels if is_optimizer_kernel(k["name"])]
    non_nccl = [(*iv(k), k["name"]) for k in kernels if k["kind"] == "compute"]
    copies = [iv(k) for k in profiler.kernels(events, copies=True) if k["kind"] in ("memcpy", "memset")]
    t0 = min(a for a, _ in comm + compute + [iv(e) for e in phases])
    t1 = max(b for _, b in comm + compute + [iv(e) for e in phases])
    comm_ms, overlap_ms = total(comm), intersection(comm, compute)
    busy = total([(max(a, t0), min(b, t1)) for a, b in comm + compute + copies if b > t0 and a < t1])
    spans = [{"lane": f"{lane} phase", "start_ms": a - t0, "end_ms": b - t0, "kind": e["name"], "label": e["name"]}
             for e, (a, b) in ((e, iv(e)) for e in phases)]
    spans += [{"lane": f"{lane} compute kernels", "start_ms": a - t0, "end_ms": b - t0, "kind": "compute"}
              for a, b in merge_close([k for k in compute if k not in set(optimizer)], draw_gap_ms)]
    spans += [{"lane": f"{lane} compute kernels", "start_ms": a - t0, "end_ms": b - t0, "kind": "optimizer"}
              for a, b in merge_close(optimizer, draw_gap_ms)]
    spans += [{"lane": f"{lane} NCCL kernels", "start_ms": a - t0, "end_ms": b - t0, "kind": "NCCL"}
              for a, b in merge_close(comm, draw_gap_ms)]
    tail = wait_before(non_nccl, is_optimizer_kernel) / steps if optimizer else None
    return {"step_ms": (t1 - t0) / steps, "compute_ms": total(compute) / steps, "comm_ms": comm_ms / steps,
            "overlap_ms": overlap_ms / steps, "overlap_fraction": overlap_ms / comm_ms if comm_ms else 0.0,
            "idle_ms": ((t1 - t0) - busy) / steps, "tail_ms": tail, "n_comm_kernels": len(comm), "spans": spans}
