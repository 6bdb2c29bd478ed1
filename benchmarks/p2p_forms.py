"""Which form of send/recv should the benchmark time? Every correct form, one way and both ways.

    python benchmarks/p2p_forms.py                             # NCCL with >= 2 GPUs, else gloo on CPU
    python benchmarks/p2p_forms.py > benchmarks/p2p_forms_2xH200.txt   # the reference run

torch.distributed offers several ways to move a message between two ranks. This script times each
(rank 0 <-> rank 1; other ranks idle) the way ``python -m labutils bench`` times a call -- a bare
loop of back-to-back calls between CUDA events, slowest rank, median of samples
(``labutils.timing.benchmark_loops``) -- after checking that it delivers the right data, and names
the cheapest correct form of each kind. ``labutils/bench/config.py`` (``P2P_FORMS``) says which form
the benchmark uses for ``send_recv`` (both directions at once, nccl-tests' ring) and for
``send_one_way``.

one way (rank 0 -> rank 1):
  send/recv           dist.send on rank 0, dist.recv on rank 1 (blocking calls)
  isend/irecv + wait  dist.isend(...).wait() / dist.irecv(...).wait()
  batch of one        dist.batch_isend_irecv([one P2POp]) and wait
both ways (each rank sends to the other and receives from it):
  batch_isend_irecv   both operations in one NCCL group, one call
  isend+irecv pair    two calls, ordered by rank parity, then wait on both
  send then recv      blocking calls ordered by rank parity (even: send first)

This is a benchmark, not a test: it asserts nothing and prints what it measured, with the fingerprint.
"""
from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

import labutils
from labutils import hw, timing
from labutils.bandwidth import format_size
from labutils.commands.bench import parse_size
from labutils.config import rank_device

SIZES = (8, 64 * 2**10, 4 * 2**20)


def forms(rank: int, send, recv) -> dict:
    """``{name: (kind, loop(k))}``: rank 0 and rank 1 take part, other ranks idle."""
    peer = 1 - rank if rank < 2 else None

    def one_way_blocking(k):
        for _ in range(k):
            if rank == 0:
                dist.send(send, 1)
            elif rank == 1:
                dist.recv(recv, 0)

    def one_way_async(k):
        for _ in range(k):
            if rank == 0:
                dist.isend(send, 1).wait()
            elif rank == 1:
                dist.irecv(recv, 0).wait()

    def one_way_batch(k):
        if rank > 1:
            return
        op = dist.P2POp(dist.isend, send, 1) if rank == 0 else dist.P2POp(dist.irecv, recv, 0)
        for _ in range(k):
            for work in dist.batch_isend_irecv([op]):
                work.wait()

    def both_batch(k):
        if rank > 1:
            return
        ops = [dist.P2POp(dist.isend, send, peer), dist.P2POp(dist.irecv, recv, peer)]
        for _ in range(k):
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def both_pair(k):
        if rank > 1:
            return
        for _ in range(k):
            if rank == 0:
                works = [dist.isend(send, peer), dist.irecv(recv, peer)]
            else:
                works = [dist.irecv(recv, peer), dist.isend(send, peer)]
            for work in works:
                work.wait()

    def both_blocking(k):
        if rank > 1:
            return
        for _ in range(k):
            if rank == 0:
                dist.send(send, peer)
                dist.recv(recv, peer)
            else:
                dist.recv(recv, peer)
                dist.send(send, peer)

    return {"send/recv": ("one way", one_way_blocking), "isend/irecv + wait": ("one way", one_way_async),
            "batch of one": ("one way", one_way_batch), "batch_isend_irecv": ("both ways", both_batch),
            "isend+irecv pair": ("both ways", both_pair), "send then recv": ("both ways", both_blocking)}


def delivers(rank: int, kind: str, loop, send, recv) -> bool:
    """True on every rank iff one call moved the data it should (checked on every rank)."""
    send.fill_(rank + 1)
    recv.fill_(-1)
    loop(1)
    if rank > 1 or (kind == "one way" and rank == 0):
        want = -1.0                      # nothing arrives here
    else:
        want = float((1 - rank) + 1)     # the peer's value
    ok = torch.tensor([int(bool((recv == want).all()))], device=send.device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def measure(rank: int, world_size: int, sizes, iters: int, repeat: int) -> list[dict]:
    device = rank_device()
    rows = []
    for size in sizes:
        send = torch.zeros(max(1, size // 4), device=device)
        recv = torch.zeros_like(send)
        table = forms(rank, send, recv)
        correct = {name: delivers(rank, kind, loop, send, recv) for name, (kind, loop) in table.items()}
        ts = timing.benchmark_loops({name: loop for name, (_, loop) in table.items()},
                                    warmup=3, iters=iters, repeat=repeat)
        rows += [{"size_bytes": size, "form": name, "kind": kind, "correct": correct[name],
                  "time_us": ts[name].median_us} for name, (kind, _) in table.items()]
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=",".join(format_size(s).replace(" ", "") for s in SIZES),
                   help="comma-separated sizes (bytes or K/M/G)")
    p.add_argument("--iters", type=int, default=100, help="calls per sample")
    p.add_argument("--repeat", type=int, default=7, help="samples per form and size")
    a = p.parse_args()
    sizes = [parse_size(s) for s in a.sizes.split(",")]
    cfg = labutils.default_config(verbose=False)
    rows = labutils.launch(measure, sizes, a.iters, a.repeat, output="quiet", timeout=600)[0]
    print(f"p2p_forms: one message between rank 0 and rank 1, {cfg.world_size} ranks, backend {cfg.backend}")
    print(f"machine: {hw.describe(peer_access=False).fingerprint()}")
    print(f"method: bare loop of {a.iters} back-to-back calls between two "
          f"{'CUDA events' if cfg.backend == 'nccl' else 'perf_counter reads'}, slowest rank, "
          f"median of {a.repeat} samples (labutils.timing.benchmark_loops)\n")
    print(f"{'size':>9}  {'kind':<10} {'form':<20} {'correct':>7} {'us per call':>12}")
    for r in rows:
        print(f"{format_size(r['size_bytes']):>9}  {r['kind']:<10} {r['form']:<20} {str(r['correct']):>7} "
              f"{r['time_us']:12.2f}")
    print()
    for size in sizes:
        for kind in ("one way", "both ways"):
            mine = [r for r in rows if r["size_bytes"] == size and r["kind"] == kind and r["correct"]]
            if mine:
                best = min(mine, key=lambda r: r["time_us"])
                print(f"cheapest correct {kind:<9} at {format_size(size):>9}: {best['form']} "
                      f"({best['time_us']:.2f} us)")


if __name__ == "__main__":
    main()
