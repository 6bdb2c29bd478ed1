"""Checkers for lab 03: a pipelined all-reduce (each chunk's transfer in flight while the next chunk is
produced), and a ring all-gather and a ring all-reduce written with point-to-point ops.

    CHECKERS = labutils.RankPool(world_size=3, backend="gloo", output="quiet", wait=False)
    ring_fn = check.ring_all_gather(my_ring_all_gather, pool=CHECKERS)   # prints ✓ ... or raises

Each checker runs on at least 3 gloo ranks -- a ``labutils.RankPool``'s (``pool=``) or ranks it launches
once (``world_size=``, 3 by default): on 2 ranks "send the whole tensor to the other rank and add" *is* a
ring, so only 3 or more tell the two apart. It runs your function on a few shapes and dtypes next to the
collective it imitates and compares them chunk by chunk on every rank. While your function runs, the
collectives (``dist.all_gather_into_tensor``, ``dist.all_reduce``, ...) are switched off -- the exercise is
to build them from ``isend``/``irecv`` -- and a ``labutils.instruments.ledger.Ledger`` records every message
each rank sends and receives. A right answer must also be a ring, judged on that ledger: only
point-to-point operations; every send to the right neighbour (rank + 1), every receive from the left
(rank - 1); one message per step (n - 1 for an all-gather, 2 (n - 1) for an all-reduce); and no more bytes
on the wire per rank than the ring's own cost -- (n-1)/n of the gathered output for an all-gather,
2 (n-1)/n of the tensor for an all-reduce (nccl-tests' bus factors), rounded up to whole chunks where n does
not divide the size. "Everything to everyone" gets the right numbers and fails on the bytes (an
all-reduce) or on the peers (an all-gather), with a HINT that says what it costs.

``pipelined_all_reduce`` judges the order of what ``fn(chunks, produce)`` issues, from a log of when each
``dist.all_reduce`` is called and each work waited for (``dist.all_reduce`` is wrapped while ``fn`` runs) and
from the ledger: one ``async_op=True`` all-reduce per chunk, started after ``produce(i)`` and before
``produce(i + 1)``, every work waited for after the last chunk -- and the sums. A stub that raises ``NotImplementedError``
counts as "not attempted": nothing is checked, and the checker returns torch's own collective as the
stand-in the rest of the notebook uses (``torch_all_gather``, ``torch_all_reduce``), so the notebook goes
on. Each checker returns the function to use from here on: yours once it passes, else the stand-in.
"""
from __future__ import annotations

import contextlib
import math

from . import fail, passed, run_ranks, say_not_attempted, standin

MIN_RANKS = 3      # on 2 ranks "the whole tensor to the neighbour, then add" is indistinguishable from a ring
_FORBIDDEN = ("all_gather_into_tensor", "all_gather_single", "all_gather", "all_reduce",
              "reduce_scatter_tensor", "reduce_scatter_single", "reduce_scatter", "broadcast",
              "all_to_all_single", "all_to_all", "reduce", "gather", "scatter")
_AG_CASES = (((4,), "float32"), ((3, 5), "int64"), ((250, 8), "float32"))
_AR_CASES = (((11,), "float32"), ((4, 6), "int64"), ((1 << 16,), "float32"))   # 11: uneven chunks
DEADLOCK_HINT = ("post each step's send and receive together: dist.batch_isend_irecv([dist.P2POp("
                  "dist.isend, send_chunk, right), dist.P2POp(dist.irecv, recv_chunk, left)]). An "
                  "isend followed by an irecv on every rank deadlocks under NCCL (section 1), and a "
                  "blocking dist.send on every rank deadlocks under gloo too")


@contextlib.contextmanager
def _collectives_forbidden():
    """Replace the collectives in ``torch.distributed`` by functions that raise, for the duration."""
    import torch.distributed as dist

    def blocked(name):
        def call(*args, **kwargs):
            raise RuntimeError(f"this exercise builds the collective from point-to-point ops, but "
                               f"your function called dist.{name}. HINT: use dist.isend/dist.irecv "
                               "or dist.batch_isend_irecv.")
        return call

    saved = {name: getattr(dist, name) for name in _FORBIDDEN if hasattr(dist, name)}
    for name in saved:
        setattr(dist, name, blocked(name))
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def _input(shape, dtype: str, rank: int, device):
    """Distinct integer values per rank (exact in float32), so any misplaced chunk shows."""
    import torch
    n = math.prod(shape)
    t = torch.arange(n, dtype=torch.int64) + 1000 * (rank + 1)
    return t.reshape(shape).to(getattr(torch, dtype)).to(device)


def _call(fn, first: bool, *args) -> tuple[bool, dict]:
    """Run ``fn(*args)`` with collectives off and a ledger on. Returns (False, {}) if the stub still raises
    NotImplementedError on the first case (not attempted), else (True, what this rank sent and received)."""
    from ..instruments.ledger import Ledger
    try:
        with _collectives_forbidden(), Ledger() as ledger:
            fn(*args)
    except NotImplementedError:
        if not first:
            raise
        return False, {}
    return True, _traffic(ledger)


def _traffic(ledger) -> dict:
    """What one rank put on the wire: its non-empty sends and receives as [peer, bytes], in order, and every
    other operation the ledger saw (a collective that slipped past the switch, e.g. from C++)."""
    sends = [[r.peer, r.size_bytes] for r in ledger.records if r.op == "send" and r.size_bytes]
    recvs = [[r.peer, r.size_bytes] for r in ledger.records if r.op == "recv" and r.size_bytes]
    others = sorted({r.op for r in ledger.records if r.op not in ("send", "recv")} | set(ledger.unrecorded))
    return {"sends": sends, "recvs": recvs, "others": others}


def torch_all_gather(output, input, group=None) -> None:
    """The stand-in for an unwritten ring all-gather: torch's own collective."""
    from ..compat import all_gather_into_tensor
    all_gather_into_tensor(output, input, group=group)


def torch_all_reduce(tensor, group=None) -> None:
    """The stand-in for an unwritten ring all-reduce: torch's own collective (sum, in place)."""
    import torch.distributed as dist
    dist.all_reduce(tensor, group=group)


standin(torch_all_gather, "torch's dist.all_gather_into_tensor")
standin(torch_all_reduce, "torch's dist.all_reduce")


def _chunks_differ(got, expected, n: int) -> list[int]:
    import torch
    pairs = zip(got.reshape(-1).tensor_split(n), expected.reshape(-1).tensor_split(n))
    return [k for k, (a, b) in enumerate(pairs) if not torch.equal(a, b)]


def _case(shape, dtype: str, got, expected, untouched: bool, traffic: dict, **ring) -> dict:
    """One case's report: result (chunks that differ, output never written), traffic, the ring's own cost."""
    n = ring.pop("n")
    return {"case": f"{tuple(shape)} {dtype}", "untouched": untouched,
            "bad": _chunks_differ(got.cpu(), expected.cpu(), n), **traffic, **ring}


def _all_gather_rank(rank: int, world_size: int, fn) -> dict:
    import torch
    from ..compat import all_gather_into_tensor
    from ..config import rank_device
    dev, cases = rank_device(), []
    for i, (shape, dtype) in enumerate(_AG_CASES):
        inp = _input(shape, dtype, rank, dev)
        expected = inp.new_empty((world_size * shape[0], *shape[1:]))
        all_gather_into_tensor(expected, inp)
        got = torch.full_like(expected, -7)
        attempted, traffic = _call(fn, i == 0, got, inp.clone())
        if not attempted:
            return {"attempted": False, "cases": []}
        size = expected.numel() * expected.element_size()              # S: the gathered output
        cases.append(_case(shape, dtype, got, expected, bool((got == -7).all()), traffic, n=world_size,
                           size_bytes=size, ring_bytes=(world_size - 1) * size // world_size,
                           ring_messages=world_size - 1))
    return {"attempted": True, "cases": cases}


def _all_reduce_rank(rank: int, world_size: int, fn) -> dict:
    import torch.distributed as dist
    from ..config import rank_device
    dev, cases = rank_device(), []
    for i, (shape, dtype) in enumerate(_AR_CASES):
        start = _input(shape, dtype, rank, dev)
        expected = start.clone()
        dist.all_reduce(expected)
        got = start.clone()
        attempted, traffic = _call(fn, i == 0, got)
        if not attempted:
            return {"attempted": False, "cases": []}
        chunk = -(-start.numel() // world_size) * start.element_size()  # the largest of tensor_split's chunks
        cases.append(_case(shape, dtype, got, expected, bool((got == start).all()), traffic, n=world_size,
                           size_bytes=start.numel() * start.element_size(),
                           ring_bytes=2 * (world_size - 1) * chunk, ring_messages=2 * (world_size - 1)))
    return {"attempted": True, "cases": cases}


def _judge_ring(what: str, r: int, n: int, case: dict, cost: str, hints: dict) -> None:
    """Fail unless rank ``r``'s traffic in ``case`` is a ring's: point-to-point only, no more bytes than the
    ring's cost, every send to r + 1 and every receive from r - 1, one message per step."""
    right, left = (r + 1) % n, (r - 1) % n
    where = f"{what}, case {case['case']}, rank {r} of {n}"
    if case["others"]:
        fail(f"{where}: your function issued {', '.join(case['others'])}", "build the ring from point-to-point "
             "operations only: dist.isend/dist.irecv or dist.batch_isend_irecv")
    sent = sum(b for _, b in case["sends"])
    peers = sorted({p for p, _ in case["sends"]})
    if sent > case["ring_bytes"]:
        ratio = sent / case["ring_bytes"]
        fail(f"{where}: the result is right, but this rank sent {sent} B in {len(case['sends'])} message(s) to "
             f"rank(s) {peers}, {ratio:.2f}x the {case['ring_bytes']} B a ring sends ({cost}, S = "
             f"{case['size_bytes']} B)", f"where the links limit the time, {ratio:.2f}x the bytes is {ratio:.2f}x "
             f"the time, and the gap grows with the ranks: {hints['bytes']}")
    if peers and peers != [right]:
        fail(f"{where}: this rank sent to rank(s) {peers}; in a ring it sends only to its right neighbour, "
             f"rank {right}", f"a ring uses the n links between neighbours and nothing else (sending to a rank "
             f"further away crosses other ranks' links, or needs a connection to every peer): send to "
             f"(rank + 1) % n and receive from (rank - 1) % n, the direction the chunk indices assume")
    sources = sorted({p for p, _ in case["recvs"]})
    if sources and sources != [left]:
        fail(f"{where}: this rank received from rank(s) {sources}; in a ring it receives only from its left "
             f"neighbour, rank {left}", "receive from (rank - 1) % n, the rank that sends to you")
    if len(case["sends"]) != case["ring_messages"] or len(case["recvs"]) != case["ring_messages"]:
        fail(f"{where}: this rank sent {len(case['sends'])} and received {len(case['recvs'])} non-empty "
             f"message(s); the ring has {case['ring_messages']} steps, one message each way per step",
             hints["steps"])


def _check(rank_fn, fn, name: str, what: str, collective: str, cost: str, hints: dict, stand_in, backend,
           world_size, timeout: float, pool):
    if not callable(fn):
        fail(f"{what}: expected a function, got {fn!r}", f"pass the function itself: check.{name}(my_fn)")
    if pool is not None and (backend is not None or world_size is not None):
        raise ValueError(f"check.{name}: pass either pool= or backend=/world_size=, not both. HINT: the "
                         "pool's ranks already have a backend and a world size.")
    n = pool.world_size if pool is not None else (MIN_RANKS if world_size is None else world_size)
    if n < MIN_RANKS or (pool is not None and pool.backend != "gloo") or backend not in (None, "gloo"):
        where = (f"a pool of {pool.world_size} {pool.backend!r} ranks" if pool is not None
                 else f"{n} {backend or 'gloo'!r} ranks")
        raise ValueError(f"check.{name} judges a ring on {MIN_RANKS} or more gloo ranks, not on {where}. HINT: "
                         f"on 2 ranks sending the whole tensor to the other rank is a ring too; pass labutils."
                         f"RankPool(world_size={MIN_RANKS}, backend='gloo'), or leave pool out.")
    per_rank = run_ranks(rank_fn, fn, world_size=None if pool is not None else n, backend="gloo",
                         pool=pool, timeout_s=timeout, hint=hints["error"], hang_hint=DEADLOCK_HINT)
    if not per_rank[0]["attempted"]:
        say_not_attempted(f"your {what} (my_{name})", stand_in.labutils_standin)
        return stand_in
    for r, res in enumerate(per_rank):
        for case in res["cases"]:
            if case["untouched"]:
                fail(f"{what}, case {case['case']}: rank {r}'s output was never written", hints["untouched"])
            if case["bad"]:
                fail(f"{what}, case {case['case']}: on rank {r}, chunk(s) {case['bad']} differ from "
                     f"{collective}", hints["order"])
    for r, res in enumerate(per_rank):   # the largest case first: its bytes are the clearest
        for case in sorted(res["cases"], key=lambda c: -c["size_bytes"]):
            _judge_ring(what, r, n, case, cost, hints)
    cases = ", ".join(c["case"] for c in per_rank[0]["cases"])
    big = max(per_rank[0]["cases"], key=lambda c: c["size_bytes"])
    passed(f"{what} matches {collective} on every rank of {n} ({cases}), and it is a ring: each rank sent "
           f"{big['ring_messages']} messages, all to its right neighbour, {sum(b for _, b in big['sends'])} B "
           f"for S = {big['size_bytes']} B ({cost})")
    return fn


def ring_all_gather(fn, *, pool=None, backend: str | None = None, world_size: int | None = None,
                    timeout: float = 30.0):
    """Check ``fn(output, input)`` against ``dist.all_gather_into_tensor`` on every rank, and that it is a
    ring (see the module docstring).

    Args:
        pool: a ``labutils.RankPool`` of at least 3 gloo ranks to run on (a deadlock in ``fn`` restarts it);
            else fresh gloo ranks, ``world_size`` of them (3 if not given; ``backend`` may only be "gloo").

    Returns:
        The function that passed: ``fn``, or torch's collective (the stand-in) if ``fn`` is a stub.

    Raises:
        ExerciseError: wrong chunks, output never written, an error or a deadlock in ``fn``; not a ring
            (a collective, a send to another rank than the right neighbour, more bytes or messages).
        ValueError: ``pool`` together with ``backend`` or ``world_size``; fewer than 3 ranks, or not gloo.
    """
    hints = {"error": "call it like dist.all_gather_into_tensor(output, input); use only "
                      "isend/irecv/batch_isend_irecv",
             "untouched": "receive into views of output (output.view(n, -1)[k]), not into new "
                          "tensors, and copy your own input into chunk rank",
             "order": "chunk k must hold rank k's input. In step s = 0 .. n-2 rank r sends chunk "
                      "(r - s) mod n to rank r + 1 and receives chunk (r - s - 1) mod n from rank r - 1",
             "bytes": "a ring all-gather sends each chunk once per step, one chunk of S/n per step, so every "
                      "rank sends (n-1)/n of S whatever n is. Send chunks[(r - s) % n] (a view, not the whole "
                      "output) in step s",
             "steps": "one batch per step, n - 1 steps: in step s one isend of chunk (r - s) mod n to the "
                      "right and one irecv of chunk (r - s - 1) mod n from the left"}
    return _check(_all_gather_rank, fn, "ring_all_gather", "ring all-gather", "all_gather_into_tensor",
                  "(n-1)/n of S, the gathered output", hints, torch_all_gather, backend, world_size, timeout, pool)


def ring_all_reduce(fn, *, pool=None, backend: str | None = None, world_size: int | None = None,
                    timeout: float = 30.0):
    """Check ``fn(tensor)`` (in-place sum) against ``dist.all_reduce`` on every rank.

    Args:
        pool: as in ``ring_all_gather``: at least 3 gloo ranks.

    Returns:
        The function that passed: ``fn``, or torch's collective (the stand-in) if ``fn`` is a stub.

    Raises:
        ExerciseError: wrong chunks, tensor unchanged, an error or a deadlock in ``fn``; not a ring (as in
            ``ring_all_gather``). Sending the whole tensor to every peer and adding gives the right sum and
            fails here: it sends (n-1) S per rank against the ring's 2 (n-1)/n S.
        ValueError: as in ``ring_all_gather``.
    """
    hints = {"error": "call it like dist.all_reduce(tensor): sum in place; use only "
                      "isend/irecv/batch_isend_irecv",
             "untouched": "write the sums back into the tensor you were given (in place), e.g. "
                          "through chunks = tensor.view(-1).tensor_split(n)",
             "order": "reduce-scatter first: in step s rank r sends chunk (r - s) mod n and adds the "
                      "chunk (r - s - 1) mod n it receives; rank r then owns chunk (r + 1) mod n. "
                      "All-gather next: send chunk (r + 1 - s) mod n, receive chunk (r - s) mod n. "
                      "Split with tensor.view(-1).tensor_split(n) so every rank agrees on sizes",
             "bytes": "the whole tensor to every peer (or round the ring) costs (n-1) S per rank, while a "
                      "ring sends one chunk of S/n per step, 2 (n-1) steps: 2 (n-1)/n S, less than 2 S for any "
                      "n. Reduce-scatter chunks first, then all-gather the summed chunks",
             "steps": "one batch per step: n - 1 reduce-scatter steps, then n - 1 all-gather steps, each "
                      "one isend of a chunk to the right and one irecv from the left"}
    return _check(_all_reduce_rank, fn, "ring_all_reduce", "ring all-reduce", "all_reduce",
                  "2(n-1)/n of S, the tensor", hints, torch_all_reduce, backend, world_size, timeout, pool)


# ---- the overlap exercise: each chunk's all-reduce in flight while the next chunk is produced ------------------
_PIPE_CASES = (((1000,), (37,), (64, 4), (5,)), ((300,),))   # chunk shapes, float32; one case of a single chunk


def _pipe_value(shape, i: int, rank: int):
    """What produce(i) writes on ``rank``: distinct per chunk and rank, exact in float32."""
    import torch
    return (torch.arange(math.prod(shape), dtype=torch.float32) + 100 * (i + 1) + 1000 * rank).reshape(shape)


class _TrackedWork:
    """An async all_reduce's work that notes when it is waited for."""

    def __init__(self, work, index: int, events: list):
        self.work, self.index, self.events = work, index, events

    def wait(self, *args, **kwargs):
        self.events.append(["wait", self.index])
        return self.work.wait(*args, **kwargs)

    def is_completed(self) -> bool:
        return self.work.is_completed()


def _pipelined_rank(rank: int, world_size: int, fn) -> dict:
    import torch
    import torch.distributed as dist
    from ..instruments.ledger import Ledger
    cases = []
    for c, shapes in enumerate(_PIPE_CASES):
        chunks = [torch.full(shape, -1.0) for shape in shapes]
        ptrs = [t.data_ptr() for t in chunks]
        events: list = []
        real = dist.all_reduce

        def all_reduce(tensor, *args, async_op=False, **kwargs):
            index = ptrs.index(tensor.data_ptr()) if tensor.data_ptr() in ptrs else -1
            events.append(["issue", index, bool(async_op)])
            work = real(tensor, *args, async_op=async_op, **kwargs)
            return _TrackedWork(work, index, events) if work is not None else None

        def produce(i: int) -> None:
            events.append(["produce", int(i)])
            chunks[i].copy_(_pipe_value(shapes[i], i, rank))

        dist.all_reduce = all_reduce
        try:
            with Ledger() as ledger:
                fn(chunks, produce)
        except NotImplementedError:
            if c:
                raise
            return {"attempted": False, "cases": []}
        finally:
            dist.all_reduce = real
        expected = [sum(_pipe_value(s, i, r) for r in range(world_size)) for i, s in enumerate(shapes)]
        cases.append({"case": f"{len(shapes)} chunk(s)", "events": events,
                      "wrong": [i for i, (t, e) in enumerate(zip(chunks, expected)) if not torch.equal(t, e)],
                      "ops": ledger.counts(), "sizes": [r.size_bytes for r in ledger.records if r.op == "all_reduce"],
                      "chunk_bytes": [t.numel() * t.element_size() for t in chunks]})
    return {"attempted": True, "cases": cases}


def _judge_pipeline(r: int, case: dict) -> None:
    where = f"pipelined all-reduce, {case['case']}, rank {r}"
    n = len(case["chunk_bytes"])
    events = case["events"]
    produced = [e[1] for e in events if e[0] == "produce"]
    if produced != list(range(n)):
        fail(f"{where}: produce was called for chunks {produced}", f"call produce(i) once for each i = 0 .. {n - 1}, "
             "in order: chunk i exists only once produce(i) has run")
    others = {op: k for op, k in case["ops"].items() if op != "all_reduce"}
    if others:
        fail(f"{where}: your function issued {others}", "one dist.all_reduce per chunk, nothing else")
    if sorted(case["sizes"]) != sorted(case["chunk_bytes"]) or any(e[0] == "issue" and e[1] < 0 for e in events):
        fail(f"{where}: it all-reduced {len(case['sizes'])} tensor(s) of {case['sizes']} B; the chunks are "
             f"{case['chunk_bytes']} B", "all-reduce each chunk itself, in place (dist.all_reduce(chunks[i], "
             "async_op=True)): one call per chunk, not a copy and not one call for everything")
    if any(e[0] == "issue" and not e[2] for e in events):
        fail(f"{where}: an all_reduce was called without async_op=True", "a blocking all_reduce returns only when "
             "the data has arrived, so nothing can be produced meanwhile: pass async_op=True and keep the work")
    at = {("produce", e[1]): k for k, e in enumerate(events) if e[0] == "produce"}
    issued = {e[1]: k for k, e in enumerate(events) if e[0] == "issue"}
    if sorted(issued) != list(range(n)) or len(case["sizes"]) != n:
        fail(f"{where}: all-reduced chunk(s) {[e[1] for e in events if e[0] == 'issue']}", f"all-reduce each of the "
             f"{n} chunks exactly once")
    last = at[("produce", n - 1)]
    for i in range(n):
        if issued[i] < at[("produce", i)]:
            fail(f"{where}: chunk {i}'s all_reduce started before produce({i}) wrote it", "start it after produce(i)")
        if i + 1 < n and issued[i] > at[("produce", i + 1)]:
            fail(f"{where}: chunk {i}'s all_reduce started only after produce({i + 1})", f"start it right after "
                 f"produce({i}), so that it is in flight while chunk {i + 1} is produced: a transfer started late "
                 "has less to hide behind, and one started after the last chunk has nothing")
    waits = [k for k, e in enumerate(events) if e[0] == "wait"]
    waited = {events[k][1] for k in waits}
    if waited != set(range(n)):
        fail(f"{where}: the work of chunk(s) {sorted(set(range(n)) - waited)} was never waited for", "call wait() "
             "on every work before returning: until then the chunk may not hold the sum yet (under NCCL the next "
             "kernel on the stream would not wait for it)")
    early = sorted({events[k][1] for k in waits if k < last})
    if early:
        fail(f"{where}: the work of chunk(s) {early} was waited for before the last chunk was produced",
             "wait only once every chunk is produced: on gloo wait() blocks the host, so what comes after it "
             "(the next produce) no longer overlaps the transfer. Keep the works in a list and wait for them at the end")
    if case["wrong"]:
        fail(f"{where}: chunk(s) {case['wrong']} do not hold the sum over the ranks", "all-reduce (sum) each chunk "
             "after it is produced, and wait before returning")


def pipelined_all_reduce(fn, *, pool=None, world_size: int | None = None, timeout: float = 30.0):
    """Check ``fn(chunks, produce)``: every chunk summed over the ranks, each chunk's all_reduce started with
    ``async_op=True`` right after ``produce(i)`` wrote it and before ``produce(i + 1)``, and every work waited
    for only after the last chunk was produced -- so that each transfer is in flight while the next chunk is
    being produced. Judged on at least 3 gloo ranks from an event log (``dist.all_reduce`` wrapped while ``fn``
    runs: when each call is issued and each work waited for) and the ledger (one all_reduce per chunk, of
    that chunk's size, nothing else).

    Returns:
        None (no later cell needs the function).

    Raises:
        ExerciseError: a wrong sum, a blocking or late all_reduce, a wait before the last chunk, a work never
            waited for, a copy or a single all_reduce of everything, an error or a deadlock in ``fn``.
        ValueError: ``pool`` together with ``world_size``; fewer than 3 ranks, or not gloo.
    """
    if not callable(fn):
        fail(f"pipelined all-reduce: expected a function, got {fn!r}",
             "pass the function itself: check.pipelined_all_reduce(my_fn)")
    if pool is not None and world_size is not None:
        raise ValueError("check.pipelined_all_reduce: pass either pool= or world_size=, not both. HINT: the pool's "
                         "ranks already have a world size.")
    n = pool.world_size if pool is not None else (MIN_RANKS if world_size is None else world_size)
    if n < MIN_RANKS or (pool is not None and pool.backend != "gloo"):
        raise ValueError(f"check.pipelined_all_reduce runs on {MIN_RANKS} or more gloo ranks, not on {n} "
                         f"{pool.backend if pool is not None else 'gloo'!r} ranks. HINT: pass labutils.RankPool("
                         f"world_size={MIN_RANKS}, backend='gloo'), or leave pool out.")
    per_rank = run_ranks(_pipelined_rank, fn, world_size=None if pool is not None else n, backend="gloo",
                         pool=pool, timeout_s=timeout, hint="call it like fn(chunks, produce); in it, produce(i) "
                         "then dist.all_reduce(chunks[i], async_op=True) for each i, then wait for every work",
                         hang_hint="every rank must all-reduce the same chunks in the same order")
    if not per_rank[0]["attempted"]:
        say_not_attempted("your pipelined all-reduce (my_pipelined_all_reduce)")
        return None
    for r, res in enumerate(per_rank):
        for case in res["cases"]:
            _judge_pipeline(r, case)
    cases = ", ".join(c["case"] for c in per_rank[0]["cases"])
    passed(f"pipelined all-reduce: every chunk summed on every rank of {n} ({cases}); each chunk's all_reduce "
           "started right after it was produced, all of them waited for after the last one")
    return None
