"""labutils.checks' ledger helpers on real gloo ranks: what each rank sent (ops, peers, bytes) under
batch_isend_irecv, isend/irecv and send/recv, judged against a ring all-reduce's own cost.

Run: pytest -n 0 tests/test_checks_ledger.py -q
"""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from labutils import checks

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

ELEMS = 6   # per rank and chunk: the tensor has ELEMS * n float32 elements


def _ring_chunks(rank, n, step):
    """(chunk sent, chunk received) at ``step``: reduce-scatter for steps 0 .. n-2, then all-gather."""
    if step < n - 1:
        return (rank - step) % n, (rank - step - 1) % n
    s = step - (n - 1)
    return (rank + 1 - s) % n, (rank - s) % n


def _ring_batched(t):
    """Ring all-reduce: n-1 reduce-scatter steps, then n-1 all-gather steps, each one batch_isend_irecv."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(t.chunk(n))
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        send_i, recv_i = _ring_chunks(rank, n, step)
        buf = torch.empty_like(chunks[recv_i])
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[send_i].clone(), nxt),
                                         dist.P2POp(dist.irecv, buf, prv)]):
            q.wait()
        if step < n - 1:
            chunks[recv_i] += buf
        else:
            chunks[recv_i].copy_(buf)


def _ring_blocking(t):
    """The same ring with blocking send/recv (even ranks send first, odd ranks receive first)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    chunks = list(t.chunk(n))
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    for step in range(2 * (n - 1)):
        send_i, recv_i = _ring_chunks(rank, n, step)
        buf = torch.empty_like(chunks[recv_i])
        if rank % 2 == 0:
            dist.send(chunks[send_i].clone(), nxt)
            dist.recv(buf, prv)
        else:
            dist.recv(buf, prv)
            dist.send(chunks[send_i].clone(), nxt)
        if step < n - 1:
            chunks[recv_i] += buf
        else:
            chunks[recv_i].copy_(buf)


def _everything_to_everyone(t):
    """Correct but not a ring: the whole tensor to every other rank (isend/irecv), then add."""
    rank, n = dist.get_rank(), dist.get_world_size()
    bufs = {p: torch.empty_like(t) for p in range(n) if p != rank}
    reqs = [dist.isend(t.clone(), p) for p in bufs] + [dist.irecv(b, p) for p, b in bufs.items()]
    for q in reqs:
        q.wait()
    for b in bufs.values():
        t += b


def _disguised(t):
    dist.all_reduce(t)


def _run(rank, world_size, fn):
    from labutils.instruments.ledger import Ledger
    t = torch.arange(ELEMS * world_size, dtype=torch.float32) + 100 * rank
    expected = t.clone()
    dist.all_reduce(expected)
    with Ledger() as book:
        fn(t)
    return {"equal": bool(torch.equal(t, expected)), "sent": checks.ledger_report(book)}


def _ring_next(rank, n):
    return {(rank + 1) % n}


@pytest.mark.parametrize("fn", [_ring_batched, _ring_blocking], ids=["batch_isend_irecv", "send/recv"])
def test_a_ring_all_reduce_sends_2_n_minus_1_over_n_of_the_tensor_to_its_next_rank(fn, gloo3, capsys):
    n, size_bytes = 3, 4 * ELEMS * 3
    reports = gloo3.run(_run, fn)
    assert all(r["equal"] for r in reports)
    sent = [r["sent"] for r in reports]
    chunk = size_bytes // n
    for rank, s in enumerate(sent):
        assert s["counts"] == {"send": 2 * (n - 1), "recv": 2 * (n - 1)}
        assert s["sent_to"] == {(rank + 1) % n: 2 * (n - 1) * chunk}
        assert s["received_from"] == {(rank - 1) % n: 2 * (n - 1) * chunk}
        assert s["calls"][:2] == [("send", (rank + 1) % n, chunk, float(chunk)), ("recv", (rank - 1) % n, chunk, 0.0)] \
            or s["calls"][:2] == [("recv", (rank - 1) % n, chunk, 0.0), ("send", (rank + 1) % n, chunk, float(chunk))]
        assert s["wire_bytes"] == 2 * (n - 1) / n * size_bytes and s["size_bytes"] == 4 * (n - 1) * chunk
    checks.expect_only_ops(sent, {"send", "recv"}, "your ring", "use isend/irecv only")
    checks.expect_calls(sent, {"send": 2 * (n - 1), "recv": 2 * (n - 1)}, "your ring", "h")
    checks.expect_peers(sent, _ring_next, "your ring", "send to rank + 1 only")
    checks.expect_wire_bytes(sent, 2 * (n - 1) / n * size_bytes, "your ring all-reduce", "2 (n-1)/n S per rank")
    checks.expect_wire_bytes(sent, lambda rank, n: 2 * (n - 1) / n * size_bytes, "ring", "h")
    checks.expect_wire_bytes(sent, [2 * (n - 1) / n * size_bytes] * n, "ring", "h")
    assert capsys.readouterr().out == ""    # the helpers judge; the checker prints its own tick


def test_everything_to_everyone_is_right_but_sends_more_than_a_ring(gloo3):
    n, size_bytes = 3, 4 * ELEMS * 3
    reports = gloo3.run(_run, _everything_to_everyone)
    assert all(r["equal"] for r in reports)            # the result alone cannot tell it from a ring
    sent = [r["sent"] for r in reports]
    assert [s["sent_to"] for s in sent] == [{p: size_bytes for p in range(n) if p != r} for r in range(n)]
    checks.expect_only_ops(sent, {"send", "recv"}, "your ring", "h")       # only point-to-point: passes
    hint = "a ring sends each rank's 1/n chunk, 2 (n-1) times, to the next rank only"
    with pytest.raises(checks.ExerciseError, match=r"✗ your ring all-reduce: rank 0 put 144 bytes on the wire "
                       r"\(send x2, recv x2\), more than the 96 the algorithm sends. HINT: a ring sends"):
        checks.expect_wire_bytes(sent, 2 * (n - 1) / n * size_bytes, "your ring all-reduce", hint)
    with pytest.raises(checks.ExerciseError, match=r"rank 0 sent to \[1, 2\]; the algorithm sends to \[1\]"):
        checks.expect_peers(sent, _ring_next, "your ring", hint)
    with pytest.raises(checks.ExerciseError, match=r"rank 0 issued send x2, recv x2; the algorithm issues send x4, "
                                                   r"recv x4. HINT: a ring"):
        checks.expect_calls(sent, lambda rank, n: {"send": 2 * (n - 1), "recv": 2 * (n - 1)}, "your ring", hint)


def test_a_disguised_all_reduce_is_named(gloo3):
    sent = [r["sent"] for r in gloo3.run(_run, _disguised)]
    assert sent[0]["counts"] == {"all_reduce": 1} and sent[0]["sent_to"] == {}
    with pytest.raises(checks.ExerciseError, match=r"rank 0 issued all_reduce x1; expected only recv, send"
                                                   r". HINT: no collectives"):
        checks.expect_only_ops(sent, {"send", "recv"}, "your ring", "no collectives")


def test_nothing_sent_and_bad_expectations():
    empty = {"counts": {}, "wire_bytes": 0.0, "size_bytes": 0, "sent_to": {}, "received_from": {}, "calls": []}
    with pytest.raises(checks.ExerciseError, match="rank 0 issued nothing; expected only send"):
        checks.expect_only_ops([empty], {"send"}, "x", "h")
    with pytest.raises(checks.ExerciseError, match="rank 0 sent to no rank; the algorithm sends to \\[1\\]"):
        checks.expect_peers([empty, empty], _ring_next, "x", "h")
    with pytest.raises(checks.ExerciseError, match="put 0 bytes on the wire \\(nothing\\), less than the 8"):
        checks.expect_wire_bytes([empty], 8, "x", "h")
    with pytest.raises(ValueError, match="not bytes. HINT"):
        checks.expect_wire_bytes([empty], "8", "x", "h")
