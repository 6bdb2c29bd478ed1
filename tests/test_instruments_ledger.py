"""labutils.instruments.ledger on real gloo ranks (2 and 3): collectives, point-to-point, sub-groups,
DTensor's functional collectives, the convention (size handed over vs bytes on the wire) and summaries.

Run: pytest -n 0 tests/test_instruments_ledger.py -q
"""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from labutils import compat
from labutils.instruments.ledger import Ledger, Record

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file


def _collectives(rank, world_size):
    n = world_size
    x = torch.ones(6 * n)                                            # 24 n bytes of float32
    with Ledger("c") as book:
        dist.all_reduce(x.clone())
        compat.all_gather_into_tensor(torch.empty(6 * n * n), x)      # S = the gathered output
        dist.all_gather([torch.empty(6 * n) for _ in range(n)], x)    # list form: the same S
        compat.reduce_scatter_tensor(torch.empty(6), x.clone())        # S = the input
        dist.all_to_all_single(torch.empty_like(x), x)
        splits = [rank + 1 if j == rank else 1 for j in range(n)]      # keep rank+1 rows, 1 to each peer
        recv = [rank + 1 if i == rank else 1 for i in range(n)]
        dist.all_to_all_single(torch.empty(sum(recv)), torch.ones(sum(splits)), recv, splits)
        dist.broadcast(x.clone(), src=0)
        dist.reduce(x.clone(), dst=0)
        dist.barrier()
    return [(r.op, r.ranks, r.peer, r.size_bytes, r.wire_bytes, r.element_size, r.phase)
            for r in book.records], dict(book.unrecorded), book.summary(), book.wire_bytes_per_rank()


@pytest.mark.parametrize("pool", ["gloo2", "gloo3"])
def test_collectives_sizes_and_wire_bytes(pool, request):
    pool = request.getfixturevalue(pool)
    n = pool.world_size
    s = 24 * n
    for rank, (records, unrecorded, summary, total) in enumerate(pool.run(_collectives)):
        world = tuple(range(n))
        expected = [
            ("all_reduce", world, None, s, 2 * (n - 1) / n * s, 4, "c"),
            ("all_gather", world, None, s * n, (n - 1) / n * s * n, 4, "c"),
            ("all_gather", world, None, s * n, (n - 1) / n * s * n, 4, "c"),
            ("reduce_scatter", world, None, s, (n - 1) / n * s, 4, "c"),
            ("all_to_all", world, None, s, (n - 1) / n * s, 4, "c"),
            ("all_to_all", world, None, 4 * (rank + n), 4 * (n - 1), 4, "c"),
            ("broadcast", world, None, s, s, 4, "c"),
            ("reduce", world, None, s, s, 4, "c"),
        ]
        assert [r[:4] for r in records] == [e[:4] for e in expected]
        for got, want in zip(records, expected):
            assert got[4] == pytest.approx(want[4]) and got[5:] == want[5:]
        assert unrecorded == {"barrier": 1}
        assert [(row["op"], row["calls"]) for row in summary] == [
            ("all_reduce", 1), ("all_gather", 2), ("reduce_scatter", 1), ("all_to_all", 2),
            ("broadcast", 1), ("reduce", 1)]
        assert summary[1]["size_bytes"] == 2 * s * n
        assert total == pytest.approx(sum(e[4] for e in expected))


def _point_to_point(rank, world_size):
    n = world_size
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    with Ledger() as book:
        if rank == 0:
            dist.send(torch.ones(5), dst=1)                              # 20 bytes
        elif rank == 1:
            dist.recv(torch.empty(5), src=0)
        reqs = [dist.isend(torch.ones(3, dtype=torch.float64), nxt),      # 24 bytes
                dist.irecv(torch.empty(3, dtype=torch.float64), prv)]
        for q in reqs:
            q.wait()
        ops = [dist.P2POp(dist.isend, torch.ones(2, dtype=torch.int16), nxt),   # 4 bytes
               dist.P2POp(dist.irecv, torch.empty(2, dtype=torch.int16), prv)]
        for q in dist.batch_isend_irecv(ops):
            q.wait()
    return ([(r.op, r.peer, r.size_bytes, r.wire_bytes, r.element_size) for r in book.records],
            book.counts(), book.wire_bytes_per_rank())


@pytest.mark.parametrize("pool", ["gloo2", "gloo3"])
def test_point_to_point_is_counted_by_the_sender(pool, request):
    pool = request.getfixturevalue(pool)
    n = pool.world_size
    for rank, (records, counts, total) in enumerate(pool.run(_point_to_point)):
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        first = {0: [("send", 1, 20, 20.0, 4)], 1: [("recv", 0, 20, 0.0, 4)]}.get(rank, [])
        assert records == first + [("send", nxt, 24, 24.0, 8), ("recv", prv, 24, 0.0, 8),
                                   ("send", nxt, 4, 4.0, 2), ("recv", prv, 4, 0.0, 2)]
        assert counts == {"send": 2 + (rank == 0), "recv": 2 + (rank == 1)}
        assert total == 28 + 20 * (rank == 0)


def _subgroup_and_nesting(rank, world_size):
    pair = dist.new_group([1, 2])                    # every rank creates it; ranks 1 and 2 use it
    with Ledger("outer") as outer:
        with Ledger("inner") as inner:
            if rank in (1, 2):
                dist.all_reduce(torch.ones(3), group=pair)
                peer = 3 - rank
                if rank == 1:
                    dist.send(torch.ones(1), dst=peer, group=pair)
                else:
                    dist.recv(torch.empty(1), src=peer, group=pair)
        dist.all_reduce(torch.ones(3))
    return ([(r.op, r.ranks, r.peer, r.wire_bytes) for r in inner.records],
            [(r.op, r.ranks, r.phase) for r in outer.records], outer.summary(by=("ranks", "op")),
            outer.wire_bytes_per_rank(ops=("send",)))


def test_a_subgroups_call_is_sized_on_its_group_and_ledgers_nest(gloo3):
    inner_rows, outer_rows, by_group, sent = zip(*gloo3.run(_subgroup_and_nesting))
    assert inner_rows[0] == []
    # a 2-rank all-reduce: (2 - 1) / 2 x 2 x 12 bytes = 12 bytes sent, whatever the world's size
    assert inner_rows[1] == [("all_reduce", (1, 2), None, 12.0), ("send", (1, 2), 2, 4.0)]
    assert inner_rows[2] == [("all_reduce", (1, 2), None, 12.0), ("recv", (1, 2), 1, 0.0)]
    assert outer_rows[0] == [("all_reduce", (0, 1, 2), "outer")]
    assert outer_rows[1][-1] == ("all_reduce", (0, 1, 2), "outer") and len(outer_rows[1]) == 3
    assert [(row["ranks"], row["op"], row["calls"]) for row in by_group[1]] == [
        ((1, 2), "all_reduce", 1), ((1, 2), "send", 1), ((0, 1, 2), "all_reduce", 1)]
    assert sent == (0, 4.0, 0)


def _dtensor(rank, world_size):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    n = world_size
    mesh = init_device_mesh("cpu", (n,))
    d = distribute_tensor(torch.ones(2 * n, 3), mesh, [Shard(0)])
    with Ledger("dtensor") as book:
        d.redistribute(mesh, [Replicate()]).to_local()               # a functional all-gather
    return book.summary(), book.records[0].ranks


def test_dtensor_redistribute_is_a_functional_all_gather(gloo2):
    n = 2
    s = 2 * n * 3 * 4
    for rows, ranks in gloo2.run(_dtensor):
        assert ranks == (0, 1)
        assert rows == [{"phase": "dtensor", "op": "all_gather", "calls": 1, "size_bytes": s,
                         "wire_bytes": pytest.approx((n - 1) / n * s)}]


def test_summary_groups_by_phase_and_op_in_first_seen_order():
    book = Ledger("fwd")
    book.records += [Record("all_reduce", (0, 1), None, 100, 100.0, 4, "fwd"),
                     Record("all_gather", (0, 1), None, 8, 4.0, 4, "fwd"),
                     Record("all_reduce", (0, 1), None, 50, 50.0, 4, "fwd")]
    assert book.summary() == [
        {"phase": "fwd", "op": "all_reduce", "calls": 2, "size_bytes": 150, "wire_bytes": 150.0},
        {"phase": "fwd", "op": "all_gather", "calls": 1, "size_bytes": 8, "wire_bytes": 4.0}]
    assert book.wire_bytes_per_rank() == 154.0 and book.wire_bytes_per_rank(ops=("all_gather",)) == 4.0


def test_an_empty_ledger_and_the_record_type():
    with Ledger() as book:
        torch.ones(2) + 1                             # no communication: nothing recorded
    assert book.records == [] and book.summary() == [] and book.counts() == {}
    assert book.wire_bytes_per_rank() == 0
    with pytest.raises(ValueError, match="HINT: any of"):
        book.summary(by=("bytes",))
    r = Record("send", (0, 1), 1, 8, 8.0, 4, "")
    with pytest.raises(AttributeError):
        r.op = "recv"                                 # frozen: a ledger's records are what was seen
