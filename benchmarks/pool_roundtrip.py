"""Round trip of a tiny all_reduce "cell": RankPool vs labutils.launch vs bare torch.multiprocessing.spawn.

    python benchmarks/pool_roundtrip.py                        # gloo on CPU; NCCL with >= 2 GPUs
    python benchmarks/pool_roundtrip.py > benchmarks/pool_roundtrip_2xH200.txt   # the reference run

One round trip = the notebook asks every rank to all_reduce one float and has the results back
(``pool.run(fn)``; ``pool.exec(code)`` is what a ``%%ranks`` cell does). A launch and a spawn pay
process start, ``import torch`` and process-group set-up every time; the pool paid them once
(its start is shown on its own line). Samples are wall-clock (``time.perf_counter``) around the
whole call, after warm-up; the table shows median, p10 and p90 (``labutils.timing.summarize``).
Goal of issue 7: <= 50 ms per pool round trip on CPU. This is a benchmark, not a test: it
asserts nothing and prints what it measured, with the machine's fingerprint and load.
"""
from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import labutils
from labutils import hw, procs, timing

CELL = "t = torch.ones(1, device=device)\ndist.all_reduce(t)\n"
GOAL_CPU_MS = 50.0


def tiny_all_reduce(rank, world_size):
    """The work of one round trip: all_reduce a single float (returned, so it comes back)."""
    t = torch.ones(1, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return t


def _spawned(rank, world_size, backend, port):
    """Bare ``torch.multiprocessing.spawn`` entry: what a script without labutils would do."""
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)  # eager communicator, like labutils' default
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120), **kw)
    tiny_all_reduce(rank, world_size)
    dist.destroy_process_group()


def _time(fn, warmup: int, iters: int) -> timing.Timing:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    return timing.summarize(samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pool-iters", type=int, default=200, help="timed pool round trips (default 200)")
    ap.add_argument("--launch-iters", type=int, default=3,
                    help="timed launches and spawns each (default 3: each costs seconds)")
    args = ap.parse_args(argv)
    cfg = labutils.default_config(verbose=False)
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):  # spawn's ranks: loopback, as labutils'
        os.environ.setdefault(var, "lo")
    load0 = os.getloadavg()[0]
    info = hw.describe(peer_access=False)
    print(f"pool_roundtrip: tiny all_reduce (1 float), {cfg.world_size} ranks, backend {cfg.backend}")
    print(f"machine: {info.fingerprint()}")

    rows = []
    t0 = time.perf_counter()
    pool = labutils.RankPool(cfg.world_size, cfg.backend, output="quiet")
    start = timing.summarize([(time.perf_counter() - t0) * 1e3])
    with pool:
        rows.append(("RankPool.run(fn)", _time(lambda: pool.run(tiny_all_reduce), 10, args.pool_iters)))
        rows.append(("%%ranks cell (RankPool.exec)", _time(lambda: pool.exec(CELL), 10, args.pool_iters)))
    rows.append(("labutils.launch(fn)", _time(
        lambda: labutils.launch(tiny_all_reduce, world_size=cfg.world_size, backend=cfg.backend,
                                output="quiet"), 1, args.launch_iters)))
    rows.append(("torch.multiprocessing.spawn", _time(
        lambda: mp.spawn(_spawned, args=(cfg.world_size, cfg.backend, procs.free_loopback_port()),
                         nprocs=cfg.world_size, join=True), 1, args.launch_iters)))
    rows.append(("RankPool start (paid once)", start))

    print(f"\n{'method':<30} {'n':>4} {'median':>11} {'p10':>11} {'p90':>11}")
    for name, t in rows:
        print(f"{name:<30} {len(t.samples_ms):>4} {t.median_ms:>8.2f} ms {t.p10_ms:>8.2f} ms "
              f"{t.p90_ms:>8.2f} ms")
    pool_ms, launch_ms, spawn_ms = rows[0][1].median_ms, rows[2][1].median_ms, rows[3][1].median_ms
    print(f"\npool round trip is {launch_ms / pool_ms:,.0f}x faster than a launch and "
          f"{spawn_ms / pool_ms:,.0f}x faster than a bare spawn (medians).")
    if cfg.backend == "gloo":
        verdict = "met" if pool_ms <= GOAL_CPU_MS else "NOT met"
        print(f"goal <= {GOAL_CPU_MS:g} ms per pool round trip on CPU: {verdict} "
              f"(median {pool_ms:.2f} ms).")
    print(f"load average (1 min) before/after: {load0:.2f}/{os.getloadavg()[0]:.2f} "
          f"on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
