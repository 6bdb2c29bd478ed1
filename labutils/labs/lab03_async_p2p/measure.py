"""Lab 03's ring all-gather against NCCL's, timed the nccl-tests way, inside launched ranks.

``ring_vs_collective`` has the ``fn(rank, world_size, ...)`` form of ``labutils.launch`` and runs
on gloo (CPU tensors) and NCCL (one GPU per rank)::

    import labutils
    from labutils.labs.lab03_async_p2p import measure
    from labutils.solutions.lab03 import ring_all_gather
    d = labutils.launch(measure.ring_vs_collective, ring_all_gather, [2**20, 2**26])[0]
    print(d["ring_busbw_gbps"], d["collective_busbw_gbps"], d["ring_correct"])
"""
from __future__ import annotations

import torch

from ... import bandwidth, timing
from ...compat import all_gather_into_tensor
from ...config import rank_device


def ring_vs_collective(rank: int, world_size: int, ring_fn, sizes_bytes: list[int],
                       warmup: int = 3, iters: int = 10, repeat: int = 5) -> dict:
    """Time ``ring_fn(output, input)`` and ``all_gather_into_tensor`` on the same buffers.

    ``sizes_bytes`` are nccl-tests' all_gather sizes: the *gathered* float32 output. Times are the
    slowest rank's (``timing.benchmark_collective``); busbw = algbw x (n - 1) / n.

    Returns:
        ``{"size_bytes", "ring_ms", "collective_ms", "ring_busbw_gbps", "collective_busbw_gbps",
        "ring_correct", "world_size"}`` (lists in size order).
    """
    dev, n = rank_device(), world_size
    out = {k: [] for k in ("size_bytes", "ring_ms", "collective_ms", "ring_busbw_gbps",
                           "collective_busbw_gbps")}
    correct = True
    for size in sizes_bytes:
        numel = max(1, size // (4 * n))
        inp = torch.full((numel,), float(rank), device=dev)
        got, ref = torch.empty(n * numel, device=dev), torch.empty(n * numel, device=dev)
        t_ring = timing.benchmark_collective(lambda: ring_fn(got, inp), warmup=warmup, iters=iters,
                                             repeat=repeat)
        t_coll = timing.benchmark_collective(lambda: all_gather_into_tensor(ref, inp), warmup=warmup,
                                             iters=iters, repeat=repeat)
        correct &= torch.equal(got.cpu(), ref.cpu())
        s = 4 * n * numel
        out["size_bytes"].append(s)
        for key, t in (("ring", t_ring), ("collective", t_coll)):
            out[f"{key}_ms"].append(t.median_ms)
            out[f"{key}_busbw_gbps"].append(bandwidth.busbw_gbps("all_gather", s, t.median_ms, n))
    return {**out, "ring_correct": correct, "world_size": n}


def library_verdict(result: dict, tie: float = 0.05) -> str:
    """The verdict on the source's "use an efficient library such as NCCL", from a measurement.

    Args:
        result: ``ring_vs_collective``'s dict (live or recorded).
        tie: relative busbw difference under which the two count as equal (0.05 = 5%, about the
            spread of repeated medians on one machine).

    Returns:
        A markdown sentence: the verdict in bold, then the NCCL/ring busbw ratio at each size.
        "True" when NCCL is faster at every size; "True below <size>" when it wins small sizes
        and ties (within ``tie``) or loses at the largest; "No" when it never wins.
    """
    sizes, ring, coll = (result[k] for k in ("size_bytes", "ring_busbw_gbps", "collective_busbw_gbps"))
    ratio = [c / r if r > 0 else float("inf") for c, r in zip(coll, ring)]
    wins = [q > 1 + tie for q in ratio]
    fmt = bandwidth.format_size
    if all(wins):
        head = "True"
    elif not any(wins):
        head = "No"
    else:
        first_not = next(i for i, w in enumerate(wins) if not w)
        head = f"True below {fmt(sizes[first_not])}"
    big = len(sizes) - 1
    state = ("a tie" if abs(ratio[big] - 1) <= tie else
             "NCCL ahead" if ratio[big] > 1 else "the ring ahead")
    per_size = ", ".join(f"{q:.2f}× at {fmt(s)}" for q, s in zip(ratio, sizes))
    text = (f"**{head}.** NCCL all_gather / hand-written ring busbw: {per_size}. "
            f"At {fmt(sizes[big])}: {coll[big]:.1f} vs {ring[big]:.1f} GB/s, {state}.")
    if result.get("world_size") == 2 and not wins[big]:
        text += (" With 2 ranks a ring is one exchange, bound by the same link either way; the "
                 "library earns its keep in latency (small sizes) and with more ranks.")
    return text
