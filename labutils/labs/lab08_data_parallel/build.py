"""Rank side of the "build your DDP" checkers: run the learner's gradient reduction, record what it issued
and when, and diagnose it against torch's ``DistributedDataParallel`` on the same model and data.

    results = pool.run(build.run_reduction, "overlapped", MyOverlappedGradients, standin)

Three designs, one protocol: ``obj = cls(model)`` (``cls(model, bucket_cap_bytes)`` for buckets) before
training, then in every step ``loss.backward(); obj.finish(); optimizer.step()``. The naive design is a
function ``fn(model)`` called after backward; ``run_reduction`` wraps it as that protocol.

What is recorded, inside each rank: the collectives issued during ``backward()`` and during ``finish()``
(two ``instruments.ledger.Ledger`` phases), and, for every parameter, how many collectives had been
issued when its gradient was accumulated (a ``register_post_accumulate_grad_hook`` registered before the
learner's, so it runs first). From these: whether the all-reduces ran during backward, whether any
started before the gradients it carries existed, and whether the buckets are DDP's.
"""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from labutils.config import rank_device
from labutils.instruments.compare import close
from labutils.instruments.ledger import Ledger

from .exercises import gradient_diagnosis
from .steps import wrap_ddp

WIDTHS = (6, 24, 20, 16, 3)   # a 4-layer MLP: 8 parameters of 8 different sizes (float64)
BUCKET_CAP_BYTES = 2048       # with WIDTHS: 3 buckets of 3096, 4000 and 1344 bytes (the last one partial)
PER_RANK = 4                  # samples per rank and step
STEPS = 2                     # two steps: the second one shows whether finish() leaves the object reusable
DESIGNS = ("naive", "overlapped", "bucketed")


def mlp(widths=WIDTHS, device=None, dtype=torch.float64, seed: int = 0) -> nn.Sequential:
    """Linear layers with Tanh between them; the same weights on every rank for a given seed."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        layers += [nn.Linear(a, b)] + ([nn.Tanh()] if i < len(widths) - 2 else [])
    return nn.Sequential(*layers).to(device=device, dtype=dtype)


def bucket_layout(sizes_bytes: list[int], cap_bytes: int) -> list[list[int]]:
    """DDP's rule, on parameter indices: walk the parameters in reverse order, add each to the current
    bucket, and close the bucket once it holds >= ``cap_bytes``; the last bucket may hold less."""
    buckets, current, size = [], [], 0
    for i in reversed(range(len(sizes_bytes))):
        current.append(i)
        size += sizes_bytes[i]
        if size >= cap_bytes:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


@contextlib.contextmanager
def blocking_all_reduces():
    """Count the calls of ``dist.all_reduce`` made without ``async_op=True`` while the context is active
    (the ledger sees the collective, not whether its caller waited for it): yields a list, one entry a
    blocking call. ``torch.distributed.all_reduce`` is wrapped for the duration, then restored."""
    from torch.distributed import distributed_c10d
    original, calls = dist.all_reduce, []

    def all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        if not async_op:
            calls.append(tuple(tensor.shape))
        return original(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = distributed_c10d.all_reduce = all_reduce
    try:
        yield calls
    finally:
        dist.all_reduce = distributed_c10d.all_reduce = original


class AfterBackward:
    """The naive design as the protocol: ``finish()`` calls ``fn(model)``."""

    def __init__(self, fn, model):
        self.fn, self.model = fn, model

    def finish(self):
        self.fn(self.model)


def _batches(world_size: int, device, steps: int = STEPS):
    g = torch.Generator().manual_seed(1)
    n = PER_RANK * world_size
    return [(torch.randn(n, WIDTHS[0], generator=g, dtype=torch.float64).to(device),
             torch.randn(n, WIDTHS[-1], generator=g, dtype=torch.float64).to(device)) for _ in range(steps)]


def _mine(t, rank: int, world_size: int):
    return t.chunk(world_size)[rank]


def _ops(book: Ledger) -> list[tuple[int, str, int]]:
    """(index among the phase's collectives, op, size_bytes) of every recorded collective."""
    return [(i, r.op, r.size_bytes) for i, r in enumerate(book.records)]


def run_reduction(rank, world_size, design: str, impl, fallback, bucket_cap_bytes: int = BUCKET_CAP_BYTES) -> dict:
    """Train ``STEPS`` SGD steps with the learner's reduction ``impl`` and with torch's DDP side by side;
    return what each step issued and whether its gradients were DDP's (see the module docstring)."""
    if design not in DESIGNS:
        raise ValueError(f"design must be one of {DESIGNS}, got {design!r}.")
    device = rank_device()
    ref = wrap_ddp(mlp(device=device), device, bucket_cap_mb=bucket_cap_bytes / 2**20)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    m, plain = mlp(device=device), mlp(device=device)
    params = list(m.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    sizes = [p.numel() * p.element_size() for p in params]
    phase = {"book": None}
    ready: dict[int, int] = {}

    def mark(i):
        def hook(_p):
            if phase["book"] is not None:
                ready.setdefault(i, len(phase["book"].records))
        return hook

    for i, p in enumerate(params):  # registered before the learner's hooks: they run first
        p.register_post_accumulate_grad_hook(mark(i))
    args = (m, bucket_cap_bytes) if design == "bucketed" else (m,)
    switched = False
    try:
        obj = AfterBackward(impl, m) if design == "naive" else impl(*args)
    except NotImplementedError:  # the stub: its finish() is the fallback's, below
        obj = None
    out = {"not_attempted": False, "sizes": sizes, "steps": []}
    for step, (images, targets) in enumerate(_batches(world_size, device)):
        x, y = _mine(images, rank, world_size), _mine(targets, rank, world_size)
        F.mse_loss(ref(x), y).backward()  # DDP: every p.grad is the mean over the ranks
        expected = [p.grad.detach().clone() for p in ref.parameters()]
        ref_opt.step()
        ref_opt.zero_grad()
        plain.load_state_dict(m.state_dict())
        local = torch.autograd.grad(F.mse_loss(plain(x), y), list(plain.parameters()))
        ready.clear()
        with Ledger("backward") as during, blocking_all_reduces() as blocking:
            phase["book"] = during
            F.mse_loss(m(x), y).backward()
            phase["book"] = None
        try:
            with Ledger("finish") as after:
                if obj is None:
                    raise NotImplementedError
                obj.finish()
        except NotImplementedError:
            if step or switched:
                raise
            switched = True
            obj = AfterBackward(fallback, m) if design == "naive" else fallback(*args)
            with Ledger("finish") as after:
                obj.finish()
        grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
        out["steps"].append({"during": _ops(during), "after": _ops(after), "ready": dict(ready),
                             "blocking": len(blocking),
                             "gradients": gradient_diagnosis(grads, expected, list(local), world_size)})
        opt.step()
        opt.zero_grad()
    out["not_attempted"] = switched
    out["weights_equal_ddp"] = close([p.detach() for p in params], [p.detach() for p in ref.module.parameters()])
    return out


# ---- judging the communication (pure: runs on the checker's side) --------------------------------
def all_reduces(ops) -> list[tuple[int, int]]:
    """(index, size_bytes) of the all-reduces among a phase's recorded collectives."""
    return [(i, size) for i, op, size in ops if op == "all_reduce"]


def diagnose_communication(design: str, step: dict, sizes: list[int], cap_bytes: int = BUCKET_CAP_BYTES) -> tuple:
    """``("ok", facts)`` or ``(problem, facts)`` for one step: problem is "extra_ops" (collectives other
    than all-reduces), "nothing" (no all-reduce at all), "blocking" (an
    all-reduce during backward called without ``async_op=True``: backward waited for it), "count" (the all-reduces do not hand over every gradient exactly once -- for the naive design -- or
    not one per parameter), "after_backward" (nothing
    during backward), "early" (an all-reduce issued before the last gradient it carries was accumulated),
    "layout" (buckets that are not DDP's, or in another order). ``facts`` fills the message."""
    during, after = all_reduces(step["during"]), all_reduces(step["after"])
    others = sorted({op for i, op, s in step["during"] + step["after"] if op != "all_reduce"})
    issued = [s for _, s in during] + [s for _, s in after]
    facts = {"during": len(during), "after": len(after), "others": others, "issued": issued,
             "n_params": len(sizes)}
    if others:
        return "extra_ops", facts
    if not issued:
        return "nothing", facts
    facts["blocking"] = step.get("blocking", 0)
    if design != "naive" and facts["blocking"]:
        return "blocking", facts
    if design == "naive":  # every gradient handed over exactly once (per parameter, or flattened together)
        if sum(issued) != sum(sizes):
            return "count", facts
        return "ok", facts
    if design == "overlapped":
        if not during and after:
            return "after_backward", facts
        if len(issued) != len(sizes) or sorted(issued) != sorted(sizes) or after:
            return ("after_backward" if after else "count"), facts
        for k, (index, _) in enumerate(during):  # the k-th all-reduce needs k+1 gradients to exist
            if sum(1 for v in step["ready"].values() if v <= index) < k + 1:
                return "early", facts
        return "ok", facts
    layout = bucket_layout(sizes, cap_bytes)
    want = [sum(sizes[i] for i in bucket) for bucket in layout]
    facts.update(want=want, n_buckets=len(layout))
    if not during and after:
        return "after_backward", facts
    for k, (index, size) in enumerate(during):
        if k < len(layout) and size == want[k]:
            if any(step["ready"].get(i, index + 1) > index for i in layout[k]):
                return "early", facts
    if issued != want:
        if len(issued) == len(sizes) and sorted(issued) == sorted(sizes):
            return "per_parameter", facts
        return "layout", facts
    if len(during) < len(layout) - 1:  # every full bucket starts during backward; the last may wait
        return "after_backward", facts
    return "ok", facts
