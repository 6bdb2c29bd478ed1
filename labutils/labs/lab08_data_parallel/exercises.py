"""Rank side of lab 08's exercise checkers: run the learner's function, diagnose what it did.

``labutils.checks.lab08`` runs these on ranks (the notebook's pool, or fresh gloo ranks) and turns
each diagnosis into a message with a HINT. A stub that raises ``NotImplementedError`` is replaced by
the checker's ``fallback`` and reported as not attempted.

What a learner's function is judged against is torch's own code and the invariants of the scheme, never
a second copy of the answer: one device on the whole batch (exercise 1), and DDP with the same AdamW on
the full model (exercise 2), whose averaged gradients and weights a ZeRO-1 step must reproduce while each
rank's optimizer holds, and its collectives hand over, only its shard.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from labutils.config import rank_device
from labutils.instruments.compare import close
from labutils.instruments.ledger import Ledger

from . import model as M
from .steps import wrap_ddp
from .verify import DTYPE, PER_RANK, adam_state_numel, image_batches, split_batch, train_one_device, weights


def _convnet():
    return M.build_convnet(device=rank_device(), dtype=DTYPE, seed=0)


def gradient_diagnosis(got, expected, local, world_size) -> str:
    if any(g is None for g in got):
        return "none"
    if close(got, expected):
        return "ok"
    if world_size > 1 and close(got, [e * world_size for e in expected]):
        return "sum"
    if close(got, local):
        return "local"
    return "wrong"


def run_average(rank, world_size, fn, fallback, steps: int = 3) -> dict:
    """Exercise 1: ``fn(model)`` must turn each rank's gradient into the whole batch's (the mean)."""
    device = rank_device()
    images, labels = M.image_batch(PER_RANK * world_size, seed=0, device=device, dtype=DTYPE)
    one = _convnet()
    F.cross_entropy(one(images), labels).backward()
    m = _convnet()
    x, y = split_batch(images, labels)
    F.cross_entropy(m(x), y).backward()  # the gradient of the mean over this rank's images
    local = [p.grad.clone() for p in m.parameters()]
    used = fn
    try:
        fn(m)
    except NotImplementedError:
        used = fallback
        fallback(m)
    diagnosis = gradient_diagnosis([p.grad for p in m.parameters()], [p.grad for p in one.parameters()],
                                    local, world_size)
    data = image_batches(world_size, steps, device)
    dp, ref = _convnet(), _convnet()
    optimizer = torch.optim.SGD(dp.parameters(), lr=0.1)
    for images, labels in data:  # SGD with the learner's reduction on this rank's share of each batch
        x, y = split_batch(images, labels)
        optimizer.zero_grad()
        F.cross_entropy(dp(x), y).backward()
        used(dp)
        optimizer.step()
    train_one_device(ref, data, torch.optim.SGD(ref.parameters(), lr=0.1))
    return {"not_attempted": used is fallback, "gradients": diagnosis, "training": close(weights(dp), weights(ref))}


class _SeenAdamW(torch.optim.AdamW):
    """AdamW that keeps a copy of the gradients it was given at each step."""

    def __init__(self, params, **kwargs):
        super().__init__(params, **kwargs)
        self.seen = []

    def step(self, closure=None):
        self.seen.append([None if p.grad is None else p.grad.detach().clone()
                          for g in self.param_groups for p in g["params"]])
        return super().step(closure)


def my_piece(t, world_size: int, rank: int):
    """The layout the exercise states: rank r's shard of ``t`` is the r-th of world_size equal pieces of
    ``t`` flattened and zero-padded to a multiple of world_size (a copy)."""
    flat = t.detach().reshape(-1)
    return F.pad(flat, (0, -flat.numel() % world_size)).chunk(world_size)[rank].clone()


def wire(book: Ledger) -> dict:
    """Bytes this rank put on the wire per op (the ledger's ring model), rounded to whole bytes."""
    return {r["op"]: round(r["wire_bytes"]) for r in book.summary(by=("op",))}


def sharded_wire(shard_numel: int, world_size: int, itemsize: int) -> int:
    """What one reduce-scatter (or all-gather) of every padded gradient sends per rank: (N-1)/N S."""
    return round(shard_numel * (world_size - 1) * itemsize)


def _sharded(book: Ledger, shard_numel: int, world_size: int, itemsize: int, ops=("reduce_scatter", "all_gather")) -> bool:
    """ZeRO's communication, judged on the wire: no all-reduce of full gradients; each of ``ops`` sends
    (N-1)/N of the padded gradients (or weights) from every rank, and nothing else is sent."""
    want = sharded_wire(shard_numel, world_size, itemsize)
    return wire(book) == {op: want for op in ops}


def run_zero_step(rank, world_size, fn, fallback, average_gradients=None, steps: int = 3) -> dict:
    """Exercise 2: ``fn(params, shards, optimizer)`` must be one ZeRO-1 step. Judged, step by step, against
    torch's DDP with the same AdamW (lr 1e-2) on the full model: the gradients the optimizer is handed
    are this rank's piece of DDP's averaged ones, the weights after the step are DDP's, no full gradient
    is kept, the optimizer's state is that of the shards only, and the collectives are a reduce-scatter
    and an all-gather of the padded gradients and weights (no all-reduce). ``average_gradients`` is
    accepted for the checkers' call and not used: the averaging is DDP's."""
    device = rank_device()
    data = image_batches(world_size, steps, device)
    ref = wrap_ddp(_convnet(), device)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    m = _convnet()
    params = list(m.parameters())
    shards = [nn.Parameter(my_piece(p, world_size, rank)) for p in params]
    opt = _SeenAdamW(shards, lr=1e-2)
    shard_numel = sum(s.numel() for s in shards)
    used, diagnosis, at = fn, "ok", 0
    mine = lambda ps: [my_piece(p, world_size, rank) for p in ps]  # noqa: E731
    for at, (images, labels) in enumerate(data):
        x, y = split_batch(images, labels)
        F.cross_entropy(ref(x), y).backward()  # DDP: every p.grad is the average over the ranks
        expected = mine([p.grad for p in ref.parameters()])
        ref_opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        local = mine([p.grad for p in params])
        before = len(opt.seen)
        try:
            with Ledger() as book:
                used(params, shards, opt)
        except NotImplementedError:
            if at:
                raise
            used = fallback
            fallback(params, shards, opt)
        if used is fn and "all_reduce" in book.counts():
            return {"not_attempted": False, "diagnosis": "all_reduce", "step": at + 1, "wire": wire(book),
                    "sharded_wire": sharded_wire(shard_numel, world_size, params[0].element_size())}
        if len(opt.seen) != before + 1:
            diagnosis = "step_count"
            break
        diagnosis = gradient_diagnosis(opt.seen[-1], expected, local, world_size)
        if diagnosis != "ok":
            break
        if not close(weights(m), weights(ref.module)):
            diagnosis = "not_gathered" if close([s.detach() for s in shards], mine(ref.parameters())) else "wrong_update"
            break
        if used is fn and not (_sharded(book, shard_numel, world_size, params[0].element_size())
                               and all(p.grad is None for p in params)
                               and adam_state_numel(opt) == 2 * shard_numel):
            diagnosis = "not_sharded"
            break
    return {"not_attempted": used is fallback, "diagnosis": diagnosis, "step": at + 1,
            "sharded_wire": sharded_wire(shard_numel, world_size, params[0].element_size())}


def gather_shards(params, shards, world_size: int) -> None:
    """The checker's own all-gather of every rank's updated shard into the full parameters."""
    from labutils.compat import all_gather_into_tensor
    for p, s in zip(params, shards):
        whole = torch.empty(world_size * s.numel(), dtype=s.dtype, device=s.device)
        all_gather_into_tensor(whole, s.detach().reshape(-1).contiguous())
        with torch.no_grad():
            p.copy_(whole[: p.numel()].view_as(p))


def run_zero2(rank, world_size, fn, fallback, steps: int = 3) -> dict:
    """ZeRO-2's hook: ``fn(params, shards)`` registers, on every parameter, what turns its gradient into this
    rank's averaged shard gradient during backward and frees the full gradient; returns the hook handles.
    Judged per step against torch's DDP with the same AdamW: the shards' gradients after backward are this
    rank's pieces of DDP's averaged ones, no ``p.grad`` is left after backward, and the collectives issued
    during backward are one reduce-scatter per parameter sending (N-1)/N of the padded gradient from each
    rank (no all-reduce); then the checker steps the shards, gathers them, and compares the weights."""
    device = rank_device()
    data = image_batches(world_size, steps, device)
    ref = wrap_ddp(_convnet(), device)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    m, plain = _convnet(), _convnet()
    params = list(m.parameters())
    shards = [nn.Parameter(my_piece(p, world_size, rank)) for p in params]
    opt = torch.optim.AdamW(shards, lr=1e-2)
    shard_numel = sum(s.numel() for s in shards)
    want_wire = sharded_wire(shard_numel, world_size, params[0].element_size())
    mine = lambda ps: [my_piece(p, world_size, rank) for p in ps]  # noqa: E731
    out = {"not_attempted": False, "diagnosis": "ok", "step": 0, "wire": {}, "sharded_wire": want_wire,
           "calls": {}, "n_params": len(params)}
    try:
        handles = fn(params, shards)
    except NotImplementedError:
        out["not_attempted"] = True
        handles = fallback(params, shards)
    for at, (images, labels) in enumerate(data):
        out["step"] = at + 1
        x, y = split_batch(images, labels)
        F.cross_entropy(ref(x), y).backward()
        expected = mine([p.grad for p in ref.parameters()])
        ref_opt.step()
        ref_opt.zero_grad()
        plain.load_state_dict(m.state_dict())
        local = mine(torch.autograd.grad(F.cross_entropy(plain(x), y), list(plain.parameters())))
        with Ledger("backward") as book:
            F.cross_entropy(m(x), y).backward()
        out["wire"], out["calls"] = wire(book), book.counts()
        if out["not_attempted"]:
            pass
        elif "all_reduce" in out["calls"]:
            out["diagnosis"] = "all_reduce"
        elif not book.records:
            out["diagnosis"] = "not_during_backward"
        else:
            out["diagnosis"] = gradient_diagnosis([s.grad for s in shards], expected, local, world_size)
            if out["diagnosis"] == "ok" and any(p.grad is not None for p in params):
                out["diagnosis"] = "kept_full"
            elif out["diagnosis"] == "ok" and not (out["calls"] == {"reduce_scatter": len(params)}
                                                   and _sharded(book, shard_numel, world_size,
                                                                params[0].element_size(), ops=("reduce_scatter",))):
                out["diagnosis"] = "count"
        if out["diagnosis"] != "ok":
            break
        opt.step()
        opt.zero_grad()
        for p in params:
            p.grad = None
        gather_shards(params, shards, world_size)
        if not close(weights(m), weights(ref.module)):
            out["diagnosis"] = "wrong_update"
            break
    for h in handles or []:
        h.remove()
    return out
