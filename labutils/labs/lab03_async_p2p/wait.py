"""What ``wait()`` guarantees: two ranks, a late sender, reads made before and after ``wait()``.

    labutils.launch(wait.wait_semantics_gloo, backend="gloo", world_size=2)   # wait() blocks the host
    labutils.launch(wait.wait_semantics_nccl, backend="nccl", world_size=2)   # wait() orders a stream

Under gloo ``wait()`` blocks the host until the transfer is done; under NCCL it only makes the
current stream wait for NCCL's, and the host goes on. Host times are ``time.perf_counter`` (what the
host waited is the point); the late data and the late receive are made with ``torch.cuda._sleep``.
The bugs marked BUG are on purpose: they show what reading too early returns.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ... import compat, timing
from ...config import rank_device


def wait_semantics_gloo(rank: int, world_size: int, delay_s: float = 0.3) -> dict:
    """Ranks 0 -> 1 on gloo: the sender starts ``delay_s`` late.

    Returns (rank 1; other ranks ``{}``): ``wait_ms`` (host time inside ``req.wait()``),
    ``early_read_stale`` (a copy of the receive buffer taken before ``wait()`` still holds the old
    zeros), ``after_wait_ok``, and ``send_race_fraction``: the share of received elements that hold
    the value the sender wrote into its buffer *after* ``isend`` returned.
    """
    out, n = {}, 1 << 16
    if rank == 0:
        time.sleep(delay_s)
        dist.isend(torch.ones(n), dst=1).wait()
        x = torch.ones(n)
        req = dist.isend(x, dst=1)
        x.fill_(-1.0)  # BUG on purpose: the send has not necessarily read x yet
        req.wait()
    elif rank == 1:
        buf = torch.zeros(n)
        req = dist.irecv(buf, src=0)
        early = buf.clone()  # BUG on purpose: read before wait()
        t0 = time.perf_counter()
        req.wait()
        out = {"wait_ms": (time.perf_counter() - t0) * 1e3, "early_read_stale": bool((early == 0).all()),
               "after_wait_ok": bool((buf == 1).all())}
        time.sleep(delay_s)  # the receiver posts late: the sender's fill_(-1) runs first
        dist.irecv(buf, src=0).wait()
        out["send_race_fraction"] = float((buf == -1).double().mean())
    return out


def wait_semantics_nccl(rank: int, world_size: int, delay_ms: float = 100.0,
                        race_numel: int = 16 << 20) -> dict:
    """Ranks 0 -> 1 under NCCL; the sender's data is ready only after a ``delay_ms`` GPU sleep.

    Returns (rank 1; other ranks ``{}``): ``wait_ms`` (host time in ``req.wait()``), ``sync_ms``
    (host time until ``torch.cuda.synchronize()`` returned, from posting the irecv),
    ``early_read_stale`` (copy made on the current stream before ``wait()``),
    ``after_wait_ok`` (copy made on the current stream after ``wait()``), ``other_stream_stale``
    (copy made after ``wait()`` on a stream that ``wait()`` did not order), and
    ``send_race_fraction`` (share of ``race_numel`` received elements holding the value the sender
    wrote after ``isend`` returned, with the receiver posting its irecv ``delay_ms`` late).
    """
    dev, out = rank_device(), {}
    cycles = int(timing.sleep_cycles_per_ms() * delay_ms)
    dist.barrier()
    if rank == 0:
        x = torch.zeros(1 << 20, device=dev)
        compat.cuda_sleep(cycles)  # the data is "computed" late, on the GPU
        x.fill_(1.0)
        dist.isend(x, dst=1).wait()
    elif rank == 1:
        buf, side = torch.zeros(1 << 20, device=dev), torch.cuda.Stream()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        req = dist.irecv(buf, src=0)
        early = buf.clone()  # BUG on purpose: not ordered after the receive
        t1 = time.perf_counter()
        req.wait()
        wait_ms = (time.perf_counter() - t1) * 1e3
        after = buf.clone()  # ordered: wait() made the current stream wait for NCCL's
        with torch.cuda.stream(side):
            other = buf.clone()  # BUG on purpose: wait() ordered the current stream, not this one
        torch.cuda.synchronize()
        out = {"wait_ms": wait_ms, "sync_ms": (time.perf_counter() - t0) * 1e3,
               "early_read_stale": bool((early == 0).all()), "after_wait_ok": bool((after == 1).all()),
               "other_stream_stale": bool((other == 0).all())}
    torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        x = torch.ones(race_numel, device=dev)
        torch.cuda.synchronize()
        req = dist.isend(x, dst=1)
        x.fill_(-1.0)  # BUG on purpose: runs on the compute stream while the send is in flight
        req.wait()
    elif rank == 1:
        buf = torch.zeros(race_numel, device=dev)
        torch.cuda.synchronize()
        compat.cuda_sleep(cycles)  # the receive is posted late (NCCL's stream waits for ours)
        dist.irecv(buf, src=0).wait()
        out["send_race_fraction"] = float((buf == -1).double().mean())
    torch.cuda.synchronize()
    return out
