"""Lab 10's measurements: the all-reduce algorithms against n on one pool of ranks, and NCCL's choices.

``allreduce_sweep`` runs *in every rank* of a pool of ``max(ns)`` ranks; for each n it makes the
sub-group of ranks ``0 .. n-1`` (every rank calls ``new_group``; only members run), checks each
algorithm's result, counts what one call sends with the communication ledger, and times every size
in the nccl-tests style (``timing.benchmark_loops``: back-to-back calls, the algorithms taking turns sample by
sample, each sample the slowest rank's -- nccl-tests' ``-a 3``, not its default mean over ranks). ``combine`` turns the ranks' results into the recording's data.

``nccl_sweep`` (on GPUs) times ``dist.all_reduce`` over sizes; ``nccl_configs`` launches it once per
environment (``NCCL_ALGO`` / ``NCCL_PROTO`` / transports are read when NCCL creates its communicator,
so each setting needs processes of its own) with ``NCCL_DEBUG=INFO``, and keeps NCCL's tuning lines.
"""
from __future__ import annotations

import contextlib
import io

import torch
import torch.distributed as dist

from ... import timing
from ...config import rank_device
from ...instruments.ledger import Ledger


def _ledger_counts(fn, tensor, group) -> dict:
    """Messages and bytes this rank sends in one call of ``fn(tensor, group)``, from the ledger."""
    with Ledger() as book:
        fn(tensor, group)
    sends = [r for r in book.records if r.op == "send"]
    return {"messages": len(sends), "wire_bytes": book.wire_bytes_per_rank(),
            "collectives": sorted({r.op for r in book.records} - {"send", "recv"})}


def _correct(fn, n: int, group, numel: int, device) -> bool:
    """``fn`` sums a rank-dependent tensor over the group (checked exactly: small integers in float32)."""
    rank = dist.get_rank(group)
    x = torch.arange(numel, dtype=torch.float32, device=device) + 1000 * rank
    fn(x, group)
    want = torch.arange(numel, dtype=torch.float32, device=device) * n + 1000 * n * (n - 1) / 2
    return bool(torch.equal(x, want))


def allreduce_sweep(rank: int, world_size: int, algorithms: dict, sizes: list, ns: list, *,
                    ledger_size: int = 4096, warmup: int = 2, iters: int = 5, repeat: int = 5) -> dict:
    """Rank side: for each n of ``ns`` (each <= world_size), the sub-group of ranks 0..n-1 checks, counts
    and times every ``algorithms[name](tensor, group)`` (an all-reduce, sum, in place) at each size of
    ``sizes`` (bytes, float32). Returns this rank's part (``combine`` merges them)."""
    if max(ns) > world_size:
        raise ValueError(f"the sweep asks for n = {max(ns)} ranks but the pool has {world_size}. "
                         f"HINT: a pool of labutils.RankPool(world_size={max(ns)}, backend='gloo').")
    device, out = rank_device(), {}
    for n in ns:
        group = dist.new_group(list(range(n)))          # every rank of the pool calls it, members or not
        if rank >= n:
            continue
        part = {"correct": {}, "ledger": {}, "time_ms": {a: [] for a in algorithms},
                "p10_ms": {a: [] for a in algorithms}, "p90_ms": {a: [] for a in algorithms}}
        with one_thread_on_cpu(device):
            _sweep_group(part, algorithms, sizes, n, group, device, ledger_size, warmup, iters, repeat)
        out[n] = part
    dist.barrier()
    return out


def _sweep_group(part, algorithms, sizes, n, group, device, ledger_size, warmup, iters, repeat) -> None:
    """One n of ``allreduce_sweep``: check, count and time every algorithm on ``group``, into ``part``."""
    for name, fn in algorithms.items():
        part["correct"][name] = _correct(fn, n, group, 2 * n + 1, device)   # a length n does not divide
        part["ledger"][name] = _ledger_counts(fn, torch.zeros(ledger_size // 4, device=device), group)
    for size in sizes:
        bufs = {name: torch.zeros(size // 4, device=device) for name in algorithms}
        loops = {name: (lambda k, f=fn, t=bufs[name]: [f(t, group) for _ in range(k)])
                 for name, fn in algorithms.items()}
        res = timing.benchmark_loops(loops, warmup=warmup, iters=iters, repeat=repeat, group=group)
        for name, t in res.items():
            part["time_ms"][name].append(t.median_ms)
            part["p10_ms"][name].append(t.p10_ms)
            part["p90_ms"][name].append(t.p90_ms)


def combine(parts: list, sizes: list, ns: list, ledger_size: int, cores: int) -> dict:
    """The recording's data from every rank's ``allreduce_sweep`` result: times (the same on every rank:
    the slowest's), correctness on every rank, and per rank the ledger's messages and bytes."""
    algorithms = list(parts[0][ns[0]]["time_ms"])
    data = {"sizes": list(sizes), "ns": list(ns), "ledger_size_bytes": ledger_size, "cores": cores,
            "algorithms": algorithms, "time_ms": {}, "p10_ms": {}, "p90_ms": {}, "correct": {}, "ledger": {}}
    for a in algorithms:
        for key in ("time_ms", "p10_ms", "p90_ms"):
            data[key][a] = {str(n): parts[0][n][key][a] for n in ns}
        data["correct"][a] = {str(n): all(parts[r][n]["correct"][a] for r in range(n)) for n in ns}
        data["ledger"][a] = {str(n): {"messages": [parts[r][n]["ledger"][a]["messages"] for r in range(n)],
                                      "wire_bytes": [parts[r][n]["ledger"][a]["wire_bytes"] for r in range(n)],
                                      "collectives": sorted({c for r in range(n)
                                                             for c in parts[r][n]["ledger"][a]["collectives"]})}
                              for n in ns}
    return data


# ---------------------------------------------------------------------------------------- NCCL
def nccl_sweep(rank: int, world_size: int, sizes: list, *, warmup: int = 5, iters: int = 20,
               repeat: int = 5) -> dict:
    """Rank side (NCCL): ``dist.all_reduce`` of float32 buffers of ``sizes`` bytes, timed the nccl-tests
    way; one call of each size first, so that NCCL logs its choice for every size."""
    device = rank_device()
    times, p10, p90 = [], [], []
    for size in sizes:
        x = torch.zeros(max(size // 4, 1), device=device)
        t = timing.benchmark_collective(lambda: dist.all_reduce(x), warmup=warmup, iters=iters, repeat=repeat)
        times.append(t.median_ms)
        p10.append(t.p10_ms)
        p90.append(t.p90_ms)
    return {"sizes": list(sizes), "time_ms": times, "p10_ms": p10, "p90_ms": p90}


KEPT_LINES = ("Bytes -> Algo", "set by environment", " via ", "NCCL version", "channels")   # of NCCL's INFO log


def nccl_configs(configs: dict, sizes: list, *, timeout: float = 180.0, **kw) -> dict:
    """``{name: env}`` -> ``{name: {"sweep": nccl_sweep's result, "log": NCCL's tuning, environment, transport
    and channel lines (``KEPT_LINES``), "error": ""}}``: one launch per configuration, with ``NCCL_DEBUG=INFO``.
    A configuration NCCL refuses is kept with its error (and no sweep) instead of stopping the others."""
    import labutils
    out = {}
    for name, env in configs.items():
        buf, sweep, error = io.StringIO(), None, ""
        full_env = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,ENV,TUNING", **env}
        with contextlib.redirect_stdout(buf):
            try:
                sweep = labutils.launch(nccl_sweep, sizes, backend="nccl", timeout=timeout, env=full_env,
                                        kwargs=kw)[0]
            except (labutils.RankError, labutils.RankTimeout) as exc:
                error = str(exc).splitlines()[0][:300]
        log = "\n".join(ln for ln in buf.getvalue().splitlines() if any(k in ln for k in KEPT_LINES))
        out[name] = {"env": env, "sweep": sweep, "log": log, "error": error}
    return out


# ---------------------------------------------------------------------------------------- roofline
@contextlib.contextmanager
def one_thread_on_cpu(device):
    """On CPU ranks, torch's intra-op pool reduced to one thread for the block: several ranks on a few cores,
    each with a pool of as many threads as cores, would spin against each other (OpenMP's waiting threads
    busy-wait) and time that instead of the work."""
    if device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def roofline_sweep(rank: int, world_size: int, hiddens: list, *, tokens: int = 256, n: int = 2,
                   warmup: int = 2, repeat: int = 5) -> dict:
    """Rank side: on the sub-group of ranks 0..n-1, the forward pass of a tensor-parallel MLP's shard
    (``x @ W1_i``, GeLU, ``@ W2_i``: ffn = 4 hidden) and the all-reduce of its output, timed apart, for each
    hidden size (float32; CPU ranks compute on one thread each). Every rank of the pool calls it."""
    group = dist.new_group(list(range(n)))
    out = {"hiddens": list(hiddens), "tokens": tokens, "n": n, "compute_ms": [], "comm_ms": []}
    if rank < n:
        device = rank_device()
        with one_thread_on_cpu(device):
            _roofline_points(out, hiddens, tokens, n, group, device, warmup, repeat)
    dist.barrier()
    return out


def _roofline_points(out, hiddens, tokens, n, group, device, warmup, repeat) -> None:
    """The roofline's points, into ``out``."""
    for h in hiddens:
        x = torch.randn(tokens, h, device=device)
        w1, w2 = torch.randn(h, 4 * h // n, device=device), torch.randn(4 * h // n, h, device=device)
        z = torch.empty(tokens, h, device=device)
        compute = timing.benchmark_loops(
            {"mlp": lambda k: [torch.matmul(torch.nn.functional.gelu(x @ w1), w2, out=z) for _ in range(k)]},
            warmup=warmup, iters=3, repeat=repeat, group=group)["mlp"]
        comm = timing.benchmark_collective(lambda: dist.all_reduce(z, group=group), warmup=warmup, iters=3,
                                           repeat=repeat, group=group)
        out["compute_ms"].append(compute.median_ms)
        out["comm_ms"].append(comm.median_ms)
