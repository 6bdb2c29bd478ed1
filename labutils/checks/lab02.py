"""Checkers for lab 02's exercises (tensor parallelism). Each prints ``✓ ...`` or raises
``ExerciseError`` with a HINT; a stub that raises NotImplementedError is "not attempted" and the
reference solution is checked instead. The launched checks always use gloo on CPU tensors with a
fixed world size, so their output is the same on every machine.
"""
from __future__ import annotations

import math

import torch

from . import fail, passed, say_not_attempted


def _not_attempted(reference) -> None:
    say_not_attempted(reference)


def _launch(rank_fn, fn, world_size: int) -> list:
    """Run ``rank_fn(rank, world_size, fn)`` on gloo ranks; rank failures become ExerciseError."""
    import labutils
    try:
        return labutils.launch(rank_fn, fn, world_size=world_size, backend="gloo", timeout=90)
    except labutils.RankTimeout:
        fail(f"your function did not return on {world_size} ranks within 90 s",
             "every rank must call the same collectives, in the same order, with matching sizes")
    except labutils.RankError as exc:
        what = (f"your function raised {exc.exc_type} on rank {exc.rank}: {exc.remote_message}"
                if exc.exc_type else f"{str(exc).split('. HINT')[0]} inside your function")
        fail(what,
             "run it by hand in a launched rank function and print the shapes; gloo refuses "
             "all_gather lists whose tensors differ in size")


# ----------------------------------------------------------------------------- exercise 1
_GATHER_CASES = ([3, 1, 2], [2, 0, 1], [4, 4, 4])


def _gather_rank(rank: int, world_size: int, fn) -> dict:
    from labutils.solutions import lab02 as solution
    used_reference, cases = False, []
    for counts in _GATHER_CASES:
        full = torch.arange(sum(counts) * 3, dtype=torch.float32).reshape(-1, 3)
        mine = full.split(counts)[rank].clone()
        try:
            got = fn(mine, None) if not used_reference else solution.gather_rows_uneven(mine, None)
        except NotImplementedError:
            used_reference = True
            got = solution.gather_rows_uneven(mine, None)
        cases.append({"counts": counts, "shape": list(got.shape), "expected": list(full.shape),
                      "equal": bool(got.shape == full.shape and torch.equal(got, full))})
    return {"used_reference": used_reference, "cases": cases}


def gather_rows_uneven(fn) -> None:
    """Exercise 1: ``fn(x, group)`` all-gathers row blocks of different lengths (rank order).

    Checked on 3 gloo ranks with row counts [3, 1, 2], [2, 0, 1] (a rank with no rows) and
    [4, 4, 4].
    """
    from labutils.solutions import lab02 as solution
    reports = _launch(_gather_rank, fn, world_size=3)
    if any(r["used_reference"] for r in reports):
        _not_attempted(solution.gather_rows_uneven)
    for rank, report in enumerate(reports):
        for case in report["cases"]:
            if case["equal"]:
                continue
            what = (f"rank {rank}, row counts {case['counts']}: got shape {case['shape']}, "
                    f"expected {case['expected']}")
            if case["shape"] != case["expected"]:
                longest = max(case["counts"])
                if case["shape"][0] == longest * len(case["counts"]):
                    fail(what, "the padding is still there: keep only the first rows_r rows of each "
                               "rank's block")
                fail(what, "the result has one row per row of all ranks together: sum of the counts")
            fail(f"rank {rank}, row counts {case['counts']}: right shape, wrong values",
                 "blocks must come in rank order, and each block is the *first* rows_r rows of "
                 "that rank's padded slot")
    passed("gather_rows_uneven: 3 ranks, row counts [3, 1, 2], [2, 0, 1], [4, 4, 4] gathered in order")


# ----------------------------------------------------------------------------- exercise 2
def _row_parallel_rank(rank: int, world_size: int, fn) -> dict:
    from labutils.solutions import lab02 as solution
    from labutils.labs.lab02_tensor_parallel.layers import shard
    gen = torch.Generator().manual_seed(2)
    tokens, fin, fout = 5, 8, 6
    x, w, b, dz = (torch.randn(*s, generator=gen, dtype=torch.float64)
                   for s in ((tokens, fin), (fout, fin), (fout,), (tokens, fout)))
    xr, wr, br = (t.clone().requires_grad_() for t in (x, w, b))
    z_ref = xr @ wr.T + br
    z_ref.backward(dz)
    xs, ws, bs = shard(x, 1).requires_grad_(), shard(w, 1).requires_grad_(), b.clone().requires_grad_()
    report = {"used_reference": False}
    try:
        z = fn(xs, ws, bs, None)
    except NotImplementedError:
        report["used_reference"] = True
        z = solution.row_parallel_forward(xs, ws, bs, None)
    if not isinstance(z, torch.Tensor) or z.shape != z_ref.shape:
        report["shape"] = list(z.shape) if isinstance(z, torch.Tensor) else type(z).__name__
        return report
    close = lambda a, e: bool(torch.allclose(a.detach(), e.detach()))  # noqa: E731
    partial = (xs @ ws.T).detach()
    report.update(forward=close(z, z_ref), partial_only=close(z, partial) or close(z, partial + b),
                  bias_n_times=world_size > 1 and close(z, z_ref + (world_size - 1) * b),
                  requires_grad=z.requires_grad)
    if z.requires_grad:
        z.backward(dz)
        report["grads"] = {name: got is not None and close(got, exp) for name, got, exp in
                           (("X_i", xs.grad, shard(xr.grad, 1)), ("B_i", ws.grad, shard(wr.grad, 1)),
                            ("b", bs.grad, br.grad))}
    return report


def row_parallel_forward(fn) -> None:
    """Exercise 2: ``fn(x_shard, weight_shard, bias, group)`` = ``sum_i X_i B_i^T + b`` with the
    right gradients; checked against a one-device ``x @ W.T + b`` on 2 gloo ranks (float64)."""
    from labutils.solutions import lab02 as solution
    reports = _launch(_row_parallel_rank, fn, world_size=2)
    if any(r["used_reference"] for r in reports):
        _not_attempted(solution.row_parallel_forward)
    for rank, r in enumerate(reports):
        if "shape" in r:
            fail(f"rank {rank}: returned {r['shape']}, expected a tensor of shape [5, 6]",
                 "return Z = X_i @ B_i.T summed over ranks, plus the bias: (tokens, out_features)")
        if not r["forward"]:
            if r["bias_n_times"]:
                fail(f"rank {rank}: Z is off by (world_size - 1) x bias",
                     "add the bias once, after the all-reduce, not on every rank before it")
            if r["partial_only"]:
                fail(f"rank {rank}: Z is this rank's partial sum X_i B_i^T only",
                     "sum the partial products over ranks: comm.reduce_from_tp_region (Megatron's g)")
            fail(f"rank {rank}: Z differs from x @ W.T + b", "Z = sum_i X_i @ B_i.T + b; B_i is weight_shard")
        if not r["requires_grad"]:
            fail(f"rank {rank}: Z is right but carries no gradient",
                 "do not detach or use .data; comm.reduce_from_tp_region is autograd-aware")
        bad = [k for k, ok in r["grads"].items() if not ok]
        if bad:
            fail(f"rank {rank}: wrong gradient of {', '.join(bad)}",
                 "the backward of the all-reduce (g) is the identity: do not all-reduce the gradient again")
    passed("row_parallel_forward: Z and the gradients of X_i, B_i and b match x @ W.T + b on 2 ranks")


# ----------------------------------------------------------------------------- exercise 3
_PREDICT_CASES = ((4096, 1024, 2), (4096, 16384, 2), (1, 8, 4), (8192, 8192, 4))


def predict_allreduce_ms(fn, fit) -> None:
    """Exercise 3: ``fn(tokens, hidden, bytes_per_element, fit)`` -> ms of the MLP's all-reduce
    predicted by the alpha-beta ``fit`` (any object with ``alpha_us`` and ``beta_gbps``)."""
    from labutils.solutions import lab02 as solution
    try:
        got = [fn(*case, fit) for case in _PREDICT_CASES]
    except NotImplementedError:
        _not_attempted(solution.predict_allreduce_ms)
        fn = solution.predict_allreduce_ms
        got = [fn(*case, fit) for case in _PREDICT_CASES]
    for case, g in zip(_PREDICT_CASES, got):  # the first wrong case gets a hint from its symptom
        expected = solution.predict_allreduce_ms(*case, fit)
        what = f"tokens={case[0]}, hidden={case[1]}, {case[2]} bytes/element"
        try:
            g = float(g)
        except (TypeError, ValueError):
            fail(f"{what}: expected a number of ms, got {g!r}", "return a float")
        if math.isfinite(g) and abs(g - expected) <= 1e-6 * abs(expected):
            continue
        near = lambda v: abs(g - v) <= 1e-6 * abs(v)  # noqa: E731
        size = case[0] * case[1] * case[2]
        hint = ("t_ms = alpha_us / 1e3 + S / (beta_gbps * 1e9) * 1e3 with S = tokens * hidden * "
                "bytes_per_element (the all-reduced Z)")
        if near(expected * 1e3) or near(expected * 1e-3):
            hint = "units: alpha is in microseconds, beta in GB/s (1e9 bytes/s); return milliseconds"
        elif any(near(solution.predict_allreduce_ms(1, 1, size * k, fit)) for k in (0.125, 0.25, 0.5, 2, 4, 8)):
            hint = "count the bytes: S = tokens * hidden * bytes_per_element"
        elif near(expected - fit.alpha_us * 1e-3):
            hint = "you left out alpha, the fixed cost of every all-reduce: t = alpha + S / beta"
        fail(f"{what}: got {g:.4g} ms, expected {expected:.4g} ms", hint)
    passed(f"predict_allreduce_ms agrees with the alpha-beta model on {len(_PREDICT_CASES)} cases")
