"""The benchmark's buffers, op callables and correctness check, on one rank (the sweep is in
``labutils.bench.sweep``).

``Buffers`` holds one collective's send, receive and expected buffers for the largest size (as
nccl-tests allocates them); ``Buffers.case`` gives the views for one (size, placement) as a ``Case``:
``case.run()`` issues the op, ``case.fill(seed)`` writes rank- and position-dependent inputs and the
result they must give, ``case.wrong()`` counts the elements that differ. ``verify_one`` checks any
implementation of a collective that way (lab 06 checks a hand-written one)::

    import labutils
    from labutils.bench import ops
    labutils.launch(ops.verify_one, "all_reduce", 2**20)     # [0, 0]: no wrong element

Placements are those torch.distributed offers: ``all_reduce``, ``broadcast`` and ``reduce`` take one
tensor (in place only); ``all_gather`` / ``reduce_scatter`` run in place when the per-rank buffer is
the rank's slice of the large one (NCCL's definition of in place); ``all_to_all`` and send/recv
need two buffers (nccl-tests does not check them in place either).
"""
from __future__ import annotations

import dataclasses

from .. import bandwidth
from ..config import rank_device
from .config import (DTYPES, FORMS, REDUCING, BenchConfig, count_wrong, fill_pattern, layout, one_way_peer,
                     pattern_tile, reduce_tiles)


def _reduce_op(redop: str):
    import torch.distributed as dist
    return {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN, "avg": dist.ReduceOp.AVG}[redop]


def _send_recv(c):
    """Ring exchange as nccl-tests' sendrecv: send to rank+1, receive from rank-1, one NCCL group."""
    import torch.distributed as dist
    n = c.world_size
    ops = [dist.P2POp(dist.isend, c.inp, (c.rank + 1) % n), dist.P2POp(dist.irecv, c.out, (c.rank - 1) % n)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()  # NCCL: the current stream waits for the transfer (the CPU does not)


def _send_one_way(c):
    """One direction only, pair by pair (``config.one_way_peer``): one operation per rank and call."""
    import torch.distributed as dist
    role, peer = one_way_peer(c.rank, c.world_size)
    if role == "send":
        dist.isend(c.inp, peer).wait()
    elif role == "recv":
        dist.irecv(c.out, peer).wait()


def _runner(collective: str):
    import torch.distributed as dist
    from ..compat import all_gather_into_tensor as all_gather, reduce_scatter_tensor as reduce_scatter
    return {
        "all_reduce": lambda c: dist.all_reduce(c.out, op=c.op),
        "all_gather": lambda c: all_gather(c.out, c.inp),
        "reduce_scatter": lambda c: reduce_scatter(c.out, c.inp, op=c.op),
        "all_to_all": lambda c: dist.all_to_all_single(c.out, c.inp),
        "broadcast": lambda c: dist.broadcast(c.out, src=c.root),
        "reduce": lambda c: dist.reduce(c.out, dst=c.root, op=c.op),
        "send_recv": _send_recv,
        "send_one_way": _send_one_way,
    }[collective]


def bare_loop(case: "Case"):
    """``loop(k)``: k back-to-back calls of the very torch function ``case`` times, with nothing
    around it (no case object, no lambda, no check of a returned work): the reference the
    benchmark's own per-call time is compared with."""
    import torch.distributed as dist
    from ..compat import torch_function
    inp, out, op, root, r, n = case.inp, case.out, case.op, case.root, case.rank, case.world_size
    coll = case.collective
    if coll == "all_reduce":
        def loop(k):
            for _ in range(k):
                dist.all_reduce(out, op=op)
    elif coll in ("all_gather", "reduce_scatter"):
        fn = torch_function("all_gather_into_tensor" if coll == "all_gather" else "reduce_scatter_tensor")
        kw = {} if coll == "all_gather" else {"op": op}

        def loop(k):
            for _ in range(k):
                fn(out, inp, **kw)
    elif coll == "all_to_all":
        def loop(k):
            for _ in range(k):
                dist.all_to_all_single(out, inp)
    elif coll == "broadcast":
        def loop(k):
            for _ in range(k):
                dist.broadcast(out, src=root)
    elif coll == "reduce":
        def loop(k):
            for _ in range(k):
                dist.reduce(out, dst=root, op=op)
    elif coll == "send_recv":
        pair = [dist.P2POp(dist.isend, inp, (r + 1) % n), dist.P2POp(dist.irecv, out, (r - 1) % n)]

        def loop(k):
            for _ in range(k):
                for work in dist.batch_isend_irecv(pair):
                    work.wait()
    elif coll == "send_one_way":
        role, peer = one_way_peer(r, n)
        call = {"send": dist.isend, "recv": dist.irecv}.get(role)
        buf = inp if role == "send" else out

        def loop(k):
            if call is not None:
                for _ in range(k):
                    call(buf, peer).wait()
    else:
        raise ValueError(f"no bare loop for {coll!r}.")
    return loop


@dataclasses.dataclass
class Case:
    """One (collective, size, placement) on this rank: views of the buffers and the op to run.

    ``run_fn(case)`` does the op; pass your own to verify another implementation (``verify_one``).
    """
    collective: str
    placement: str
    rank: int
    world_size: int
    count: int
    redop: str
    root: int
    inp: object
    out: object
    expected: object
    run_fn: object = None
    op: object = None

    def __post_init__(self):  # resolved once: the timed loop should only pay for the call itself
        self.run_fn = self.run_fn or _runner(self.collective)
        self.op = _reduce_op(self.redop)

    def run(self):
        return self.run_fn(self)

    def fill(self, seed: int) -> None:
        """Inputs as nccl-tests' InitData (outputs zeroed first), and the expected result."""
        coll, r, n, c = self.collective, self.rank, self.world_size, self.count
        tiles = [pattern_tile(p, seed, coll, self.redop) for p in range(n)]
        if not (coll == "reduce_scatter" and self.placement == "in-place"):
            self.out.zero_()  # the in-place reduce_scatter output is a slice of its input
        if coll == "broadcast" and r != self.root:
            pass  # in place: a non-root's buffer (zeros) is only written by the broadcast
        else:
            fill_pattern(self.inp, tiles[r], r * c if coll == "all_gather" else 0)
        if coll == "all_gather":
            for p in range(n):
                fill_pattern(self.expected[p * c:(p + 1) * c], tiles[p], p * c)
        elif coll == "all_to_all":
            for p in range(n):
                fill_pattern(self.expected[p * c:(p + 1) * c], tiles[p], r * c)
        elif coll in REDUCING:
            fill_pattern(self.expected, reduce_tiles(tiles, self.redop), r * c if coll == "reduce_scatter" else 0)
        elif coll == "send_one_way":
            role, peer = one_way_peer(r, n)
            if role == "recv":
                fill_pattern(self.expected, tiles[peer], 0)
            else:
                self.expected.zero_()  # a sender's or an idle rank's output is never written
        else:  # broadcast, send_recv
            fill_pattern(self.expected, tiles[self.root if coll == "broadcast" else (r - 1) % n], 0)

    def wrong(self) -> int:
        """Wrong elements on this rank (reduce: only the root's result is defined)."""
        if self.collective == "reduce" and self.rank != self.root:
            return 0
        return count_wrong(self.out, self.expected)


class Buffers:
    """Send, receive and expected buffers of one collective for the largest size (as nccl-tests)."""

    def __init__(self, collective: str, max_layout: dict, dtype, device):
        import torch
        self.collective = collective
        self.send = torch.empty(max_layout["in_numel"], dtype=dtype, device=device)
        self.recv = torch.empty(max_layout["out_numel"], dtype=dtype, device=device)
        self.expected = torch.empty(max_layout["out_numel"], dtype=dtype, device=device)

    def case(self, lay: dict, placement: str, rank: int, world_size: int, redop: str, root: int,
             run=None) -> Case:
        """Views for one point; in place = NCCL's definition (the rank's slice of the big buffer)."""
        coll, c = self.collective, lay["count"]
        inp, out = self.send[:lay["in_numel"]], self.recv[:lay["out_numel"]]
        if placement == "in-place":
            if coll == "all_gather":
                inp = out[rank * c:(rank + 1) * c]
            elif coll == "reduce_scatter":
                out = inp[rank * c:(rank + 1) * c]
            else:
                inp = out
        return Case(coll, placement, rank, world_size, c, redop, root, inp, out,
                    self.expected[:lay["out_numel"]], run)


def verify_case(case: Case, repeats: int = 1, group=None) -> int:
    """Fill, run once, compare; returns the wrong elements summed over ranks (every rank calls it)."""
    import torch
    import torch.distributed as dist
    wrong = 0
    for rep in range(repeats):
        case.fill(seed=rep + 1)
        case.run()
        mine = torch.tensor([case.wrong()], dtype=torch.int64, device=case.out.device)
        dist.all_reduce(mine, group=group)
        wrong = int(mine.item())
        if wrong:
            break
    return wrong


def verify_one(rank: int, world_size: int, collective: str, size_bytes: int, run=None, *,
              placement: str | None = None, datatype: str = "float", redop: str = "sum", root: int = 0) -> int:
    """Verify one implementation of ``collective`` at one size (every rank calls it).

    ``run(case)`` must do the collective on ``case.inp`` -> ``case.out`` (the same tensor in place)
    with ``case.op`` (a ``dist.ReduceOp``) and ``case.root``; None = torch.distributed's own.

    Returns:
        Wrong elements summed over ranks (0 = correct).
    """
    import torch
    coll = bandwidth.canonical_op(collective)
    cfg = BenchConfig(datatype=datatype, redop=redop, root=root, collectives=(coll,))
    lay = layout(coll, size_bytes, cfg.itemsize, world_size)
    bufs = Buffers(coll, lay, getattr(torch, DTYPES[cfg.datatype][0]), rank_device())
    return verify_case(bufs.case(lay, placement or FORMS[coll][0], rank, world_size, redop, root, run))
