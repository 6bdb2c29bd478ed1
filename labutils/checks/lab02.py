"""Checkers for lab 02's exercises (tensor parallelism).

Each prints ``✓ ...`` or raises ``ExerciseError`` with a HINT chosen from the symptom. A stub that raises
NotImplementedError is "not attempted": the checker says so (nothing is checked) and the notebook goes
on; ``usable_transfer_and_wait`` gives None for a stub, and the cell that needs it says what it skips. The
launched checks run on 3 gloo ranks with CPU tensors (3, because on 2 ranks "mine and the other one" can pass
for "every rank in rank order"), so their output is the same on every machine, and judge the result *and* the
communication issued (``instruments.ledger.Ledger`` inside the ranks: which collectives, how many, how many
bytes). Pass ``pool=`` a 3-rank gloo ``labutils.RankPool`` to reuse its ranks, otherwise each check launches
its own.
"""
from __future__ import annotations

import statistics

import torch

from ..bandwidth import format_size
from . import attempted, fail, passed, run_ranks, say_not_attempted

WORLD_SIZE = 3
TIMEOUT_S = 90   # a learner's function that hangs is stopped after this long
SMALL_BYTES = 16  # a collective this small per rank (a row count) is bookkeeping, not the data


def _run(pool, rank_fn, *args) -> list:
    return run_ranks(rank_fn, *args, pool=pool, world_size=WORLD_SIZE, timeout_s=TIMEOUT_S,
                     hint="run it by hand in a rank function (pool.run) and print the shapes; gloo refuses "
                          "all_gather lists whose tensors differ in size",
                     hints={"invalid gradient": "backward must return one gradient per input of forward, each "
                                                "shaped like that input: this rank's slice for y_shard, None for "
                                                "group"})


def _calls(book) -> list[dict]:
    return [{"op": r.op, "size_bytes": r.size_bytes, "wire_bytes": r.wire_bytes} for r in book.records]


def _said(calls) -> str:
    return ", ".join(f"{c['op']} of {format_size(c['size_bytes'])}" for c in calls) or "nothing"


# ----------------------------------------------------------------------------- exercise 1
_PATTERNS = ([3, 1, 2], [0, 2, 1], [4, 4, 4])   # row counts per rank (cycled over the ranks); a rank may have none
_COLS = 64   # wide rows, so that the data is never as small as the row counts


def _gather_rank(rank: int, world_size: int, fn) -> dict:
    from ..instruments.ledger import Ledger
    cases = []
    for pattern in _PATTERNS:
        counts = [pattern[r % len(pattern)] for r in range(world_size)]
        full = torch.arange(sum(counts) * _COLS, dtype=torch.float32).reshape(-1, _COLS)
        mine = full.split(counts)[rank].clone()
        try:
            with Ledger() as book:
                got = fn(mine, None)
        except NotImplementedError:
            if cases:
                raise
            return {"attempted": False, "cases": []}
        cases.append({"counts": counts, "shape": list(got.shape), "expected": list(full.shape),
                      "equal": bool(got.shape == full.shape and torch.equal(got, full)), "calls": _calls(book)})
    return {"attempted": True, "cases": cases}


def _gather_traffic(case: dict, n: int) -> tuple[str, str] | None:
    """What is wrong with the communication one rank issued for one case, as (what, hint), or None."""
    padded = n * max(case["counts"]) * _COLS * 4      # float32: every block padded to the longest, gathered
    calls = sorted(case["calls"], key=lambda c: -c["size_bytes"])
    if not calls:
        return "nothing was communicated", "every rank needs the others' rows: use all_gather_into_tensor"
    data, rest = calls[0], calls[1:]
    what = f"row counts {case['counts']}: your function issued {_said(case['calls'])}"
    if data["op"] == "all_reduce":
        return what, (f"an all-reduce of a zero-filled buffer holding every rank's rows gets the right rows, but "
                      f"each rank sends 2(n-1)/n of the buffer and adds zeros: one all_gather_into_tensor of the "
                      f"blocks padded to the longest sends (n-1)/n of {format_size(padded)}, half as much")
    if data["op"] != "all_gather" or sum(1 for c in calls if c["size_bytes"] > n * SMALL_BYTES) > 1:
        return what, ("move the data in one all_gather_into_tensor (after one small collective for the row "
                      "counts): one call per rank or per block pays a collective's fixed cost each time")
    if data["size_bytes"] > padded:
        return what, (f"the gathered buffer is larger than every block padded to the longest ({format_size(padded)}):"
                      " pad each block to max(counts) rows, no more (pickling through all_gather_object also "
                      "sends more than the rows)")
    if any(c["size_bytes"] > n * SMALL_BYTES for c in rest):
        return what, "one small collective for the row counts is all the exchange needs besides the data"
    return None


def gather_rows_uneven(fn, pool=None) -> None:
    """Exercise 1: ``fn(x, group)`` all-gathers row blocks of lengths no rank knows in advance, in rank order.

    Checked on 3 gloo ranks with row counts [3, 1, 2], [0, 2, 1] (a rank with no rows) and [4, 4, 4], and by
    what each rank issued: the rows in one all-gather of the blocks padded to the longest, plus small
    collectives for the counts.
    """
    reports = _run(pool, _gather_rank, fn)
    n = len(reports)
    if not all(r["attempted"] for r in reports):
        say_not_attempted("my_gather_rows_uneven")
        return
    for rank, report in enumerate(reports):
        for case in report["cases"]:
            if case["equal"]:
                continue
            what = f"rank {rank}, row counts {case['counts']}: got shape {case['shape']}, expected {case['expected']}"
            if case["shape"] != case["expected"]:
                if case["shape"][0] == max(case["counts"]) * len(case["counts"]):
                    fail(what, "the padding is still there: keep only the first rows_r rows of each rank's block")
                fail(what, "the result has one row per row of all ranks together: the sum of the counts, "
                           "which every rank learns only by exchanging them first")
            fail(f"rank {rank}, row counts {case['counts']}: right shape, wrong values",
                 "blocks must come in rank order, and each block is the *first* rows_r rows of that rank's "
                 "padded slot")
    for rank, report in enumerate(reports):
        for case in report["cases"]:
            problem = _gather_traffic(case, n)
            if problem:
                fail(f"rank {rank}, {problem[0]}", problem[1])
    shown = ", ".join(str(c["counts"]) for c in reports[0]["cases"])
    passed(f"gather_rows_uneven: {n} ranks, row counts {shown} gathered in order, the rows in one all-gather "
           "of the blocks padded to the longest")


# ----------------------------------------------------------------------------- exercise 2
_TOKENS, _FIN, _FOUT_PER_RANK = 5, 4, 2


def _gather_from_tp_rank(rank: int, world_size: int, fn, ColumnParallelLinear) -> dict:
    from labutils.labs.lab02_tensor_parallel import verify

    from ..instruments.ledger import Ledger
    gen = torch.Generator().manual_seed(8)
    tokens, fin, fout = _TOKENS, _FIN, _FOUT_PER_RANK * world_size
    x, dy = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((tokens, fin), (tokens, fout)))
    ref = verify.reference_linear(fin, fout, seed=9)
    layer = ColumnParallelLinear(ref)
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_ref = ref(x_ref)
    y_ref.backward(dy)
    report = {"attempted": True}
    apply = getattr(fn, "apply", fn)
    try:
        with Ledger("forward") as fwd:
            y = apply(layer(x_tp), None)
    except NotImplementedError:
        return {"attempted": False}
    report["forward_calls"] = _calls(fwd)
    if not isinstance(y, torch.Tensor) or y.shape != y_ref.shape:
        report["shape"] = list(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__
        return report
    close = lambda a, e: a is not None and bool(torch.allclose(a.detach(), e.detach()))  # noqa: E731
    report["forward"] = close(y, y_ref)
    report["rank_order_reversed"] = close(y, torch.cat(list(y_ref.chunk(world_size, -1))[::-1], -1))
    report["requires_grad"] = y.requires_grad
    if y.requires_grad:
        with Ledger("backward") as bwd:
            y.backward(dy)
        report["backward_calls"] = _calls(bwd)
        report["grad_x"] = close(x_tp.grad, x_ref.grad)
        report["grad_x_times_n"] = close(x_tp.grad, world_size * x_ref.grad)
        report["grad_w"] = close(layer.weight.grad, verify.shard(ref.weight.grad, 0))
    return report


def _tp_traffic(r: dict, n: int) -> tuple[str, str] | None:
    """The communication Megatron's design needs around a gathered column-parallel layer: forward one
    all-gather of Y (tokens x out_features); backward one all-reduce of dL/dX (f's), nothing of the gather's."""
    y_bytes, x_bytes = _TOKENS * _FOUT_PER_RANK * n * 8, _TOKENS * _FIN * 8
    fwd, bwd = r["forward_calls"], r["backward_calls"]
    if [(c["op"], c["size_bytes"]) for c in fwd] != [("all_gather", y_bytes)]:
        hint = ("an all-reduce of a zero-padded Y gets the right numbers but sends 2(n-1)/n of Y per rank and adds "
                "zeros; one all-gather sends (n-1)/n" if any(c["op"] == "all_reduce" for c in fwd) else
                "the forward needs exactly one all-gather of every rank's columns, nothing else")
        return f"forward issued {_said(fwd)}; expected one all_gather of Y ({format_size(y_bytes)})", hint
    extra = [c for c in bwd if (c["op"], c["size_bytes"]) != ("all_reduce", x_bytes)]
    if extra or len(bwd) != 1:
        return (f"backward issued {_said(bwd)}; expected only f's all_reduce of dL/dX ({format_size(x_bytes)})",
                "every rank already holds the whole dL/dY, so the gather's backward needs no communication: "
                "slice this rank's columns (an all-reduce then a division by world_size gets the same numbers "
                f"and sends 2(n-1)/n of dL/dY, {format_size(y_bytes)}, for nothing)")
    return None


def gather_from_tp(fn, ColumnParallelLinear, pool=None) -> None:
    """Exercise 2: ``fn.apply(y_shard, group)`` (an autograd Function, or a plain function) all-gathers the
    column-parallel layer's output along the last dim, so ``fn.apply(ColumnParallelLinear(linear)(x), None)``
    equals ``linear(x)`` on every rank, with the gradients of ``x`` and of the weight shard right. Checked on
    3 gloo ranks in float64, and by the communication issued: forward one all-gather of Y, backward only the
    all-reduce of dL/dX that f in front of the layer makes."""
    reports = _run(pool, _gather_from_tp_rank, fn, ColumnParallelLinear)
    n = len(reports)
    expected = [_TOKENS, _FOUT_PER_RANK * n]
    if not all(r["attempted"] for r in reports):
        say_not_attempted("MyGatherFromTP")
        return
    for rank, r in enumerate(reports):
        if "shape" in r:
            hint = ("all_gather_into_tensor stacks the blocks along dim 0; put them side by side along the last "
                    "dim (torch.cat(blocks, dim=-1))" if r["shape"] == [_TOKENS * n, _FOUT_PER_RANK]
                    else "return every rank's columns side by side: shape (tokens, out_features)")
            fail(f"rank {rank}: returned {r['shape']}, expected a tensor of shape {expected}", hint)
        if not r["forward"]:
            if r["rank_order_reversed"]:
                fail(f"rank {rank}: the column blocks are in the wrong order", "block r comes from rank r")
            fail(f"rank {rank}: the output differs from nn.Linear's", "concatenate every rank's y_shard, in rank "
                                                                    "order, along the last dim")
        if not r["requires_grad"]:
            fail(f"rank {rank}: the output is right but carries no gradient",
                 "do the gathering inside a torch.autograd.Function's forward and return the gradient in backward")
        if not r["grad_x"] or not r["grad_w"]:
            if r["grad_x_times_n"]:
                fail(f"rank {rank}: the gradient of X is {n} x too large",
                     "every rank already holds the whole dL/dY; backward keeps only this rank's columns -- do not "
                     "sum over ranks (f in front of the layer already sums dL/dX)")
            fail(f"rank {rank}: wrong gradients (X: {r['grad_x']}, weight shard: {r['grad_w']})",
                 "backward returns this rank's columns of the incoming gradient: grad.chunk(world_size, "
                 "dim=-1)[rank]")
    for rank, r in enumerate(reports):
        problem = _tp_traffic(r, n)
        if problem:
            fail(f"rank {rank}: {problem[0]}", problem[1])
    passed(f"gather_from_tp: output and the gradients of X and of the weight shard match nn.Linear on {n} ranks; "
           "forward one all-gather of Y, backward only f's all-reduce of dL/dX")


# ----------------------------------------------------------------------------- exercise 3
# calls_ms[rank][i]: NCCL kernel time of call i on each rank. In the first case the ranks take turns
# arriving first, so per-rank medians are wrong; the second has 3 ranks and an odd number of calls.
_SPLIT_CASES = ([[1.0, 5.0, 1.2, 5.1, 1.1, 4.9], [5.0, 1.0, 5.2, 1.0, 5.0, 1.1]],
                [[0.30, 0.50, 0.31], [0.90, 0.30, 0.30], [0.31, 0.31, 0.70]],
                [[2.0], [2.5]])


def _expected_split(calls_ms) -> tuple[float, float]:
    """The definition, call by call: (median of the fastest rank's time, median of slowest - fastest)."""
    fastest = [sorted(call)[0] for call in zip(*calls_ms)]
    slowest = [sorted(call)[-1] for call in zip(*calls_ms)]
    return statistics.median(fastest), statistics.median(s - f for s, f in zip(slowest, fastest))


def usable_transfer_and_wait(fn):
    """``fn`` once written, else None (saying so): the cell that splits recorded calls then skips the split."""
    if attempted(fn, lambda f: f([[1.0], [1.0]])):
        return fn
    say_not_attempted("my_transfer_and_wait", "no split (the recorded step times are shown alone)")
    return None


def transfer_and_wait(fn) -> None:
    """Exercise 3: ``fn(calls_ms) -> (transfer_ms, wait_ms)``: per call the min over ranks (the transfer) and
    max - min (the wait for the slower rank), each the median over calls."""
    if not attempted(fn, lambda f: f(_SPLIT_CASES[0])):
        say_not_attempted("my_transfer_and_wait")
        return
    got = [fn(case) for case in _SPLIT_CASES]
    for case, g in zip(_SPLIT_CASES, got):
        expected = _expected_split(case)
        what = f"calls_ms = {case}"
        try:
            transfer, wait = (float(v) for v in g)
        except (TypeError, ValueError):
            fail(f"{what}: expected (transfer_ms, wait_ms), got {g!r}", "return a tuple of two numbers")
        near = lambda a, b: abs(a - b) <= 1e-9 + 1e-9 * abs(b)  # noqa: E731
        if near(transfer, expected[0]) and near(wait, expected[1]):
            continue
        medians = [statistics.median(r) for r in case]
        per_call = list(zip(*case))
        if near(transfer, expected[1]) and near(wait, expected[0]):
            hint = "the order is (transfer, wait): the transfer is the min over ranks"
        elif near(transfer, min(medians)):
            hint = ("pair the calls first: call i is the same all-reduce on every rank, so take min and max "
                    "over ranks call by call, then the median over calls (zip(*calls_ms))")
        elif near(transfer, statistics.mean(min(c) for c in per_call)):
            hint = "take the median over calls, not the mean: one slow call must not move the answer"
        else:
            hint = "per call i: transfer = min over ranks, wait = max - min; then the median of each over calls"
        fail(f"{what}: got ({transfer:.4g}, {wait:.4g}), expected ({expected[0]:.4g}, {expected[1]:.4g})", hint)
    passed(f"transfer_and_wait: {len(_SPLIT_CASES)} cases, 2 and 3 ranks, calls paired across ranks")
