"""The benchmark's CUDA-graph mode (nccl-tests' ``-G N``): ``iters`` calls captured in one CUDA graph,
the graph replayed N times per sample, time per call = sample time / (N x iters).

An eager call costs the host: Python, the dispatcher, ProcessGroupNCCL's bookkeeping and the kernel
launch, before the GPU does anything. For a small message that host work is most of the time, and
a back-to-back loop measures it. A replayed graph hands the GPU the whole sequence of kernels at once,
so what remains is the device's own time per call (the NCCL kernel, and the graph's launch of it).
Both modes measure the same collective; their difference is host launch overhead::

    python -m labutils bench -b 8 -e 1M --collectives all_reduce --cuda-graph 20

The rules of capturing a collective, as ``capture`` follows them:

1. the communicator exists and the call has run before capture (warm-up) -- on a side stream, as
   ``torch.cuda.graph`` asks, so that lazily created state is made outside the capture;
2. static shapes and addresses: a graph replays the same kernels on the same memory, so every
   buffer is allocated before capture and refilled in place, never rebound;
3. the backend supports capture: NCCL does (since 2.9.6); gloo runs on the CPU and has no graphs.

Validation still runs: a one-call graph of the same collective is replayed on freshly filled inputs
and every element of the result is checked (``ops.verify_case``).
"""
from __future__ import annotations

import dataclasses

from .. import timing
from .ops import Case, verify_case

GRAPH_HINT = ("HINT: drop --cuda-graph (the eager mode runs everywhere), or run on GPUs with NCCL "
              "(--backend nccl, one GPU per rank).")


def require_graphs(backend: str) -> None:
    """Raise ValueError unless ``backend`` can capture collectives in CUDA graphs (NCCL)."""
    if backend != "nccl":
        raise ValueError(f"--cuda-graph needs NCCL on GPUs, but the backend is {backend}: {backend} runs on "
                         f"the CPU and has no CUDA graphs. {GRAPH_HINT}")


def capture(loop, iters: int, *, warmup: int = 1):
    """Capture ``loop(iters)`` in one CUDA graph, after ``warmup`` calls on a side stream.

    Returns:
        ``torch.cuda.CUDAGraph``; ``graph.replay()`` re-issues the ``iters`` calls on the current stream.

    Raises:
        RuntimeError: the capture failed (the cause, and what to try).
    """
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loop(max(warmup, 1))
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):  # torch's default capture_error_mode ("global")
            loop(iters)
    except RuntimeError as exc:
        raise RuntimeError(
            f"capturing {iters} calls in a CUDA graph failed: {exc}. HINT: every buffer must exist before "
            "capture (no allocation, no .item(), no host synchronisation inside the captured calls); "
            "NCCL must be >= 2.9.6; or drop --cuda-graph.") from exc
    return graph


def time_graph(graph, iters: int, replays: int, repeat: int, group=None) -> timing.Timing:
    """Per-call time of a graph of ``iters`` calls: ``replays`` replays back to back between two CUDA
    events per sample, ``repeat`` samples, slowest rank, in ms per call."""
    t = timing.benchmark_loops({"graph": timing.repeated(graph.replay)}, warmup=1, iters=replays, repeat=repeat, group=group)["graph"]
    return timing.summarize([x / iters for x in t.samples_ms])


def measure(case: Case, iters: int, replays: int, repeat: int) -> timing.Timing:
    """Capture ``iters`` calls of ``case`` and time their replay (every rank calls it)."""
    graph = capture(timing.repeated(case.run), iters)
    try:
        return time_graph(graph, iters, replays, repeat)
    finally:
        del graph


def verify(case: Case, repeats: int = 1) -> int:
    """Wrong elements (summed over ranks) of ``case`` run as a captured one-call graph, replayed on
    freshly filled inputs."""
    graph = capture(timing.repeated(case.run), 1)
    replayed = dataclasses.replace(case, run_fn=lambda c: graph.replay())
    try:
        return verify_case(replayed, repeats)
    finally:
        del replayed, graph
