"""Rank side of lab 08's exercise checkers: run the learner's function, diagnose what it did.

``labutils.checks.lab08`` runs these on ranks (the notebook's pool, or fresh gloo ranks) and turns
each diagnosis into a message with a HINT. A stub that raises ``NotImplementedError`` is replaced by
the reference (``fallback``) and reported as not attempted.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from labutils.config import rank_device
from labutils.instruments.compare import close

from . import model as M
from .reference import padded_flat, shard_of, split_batch, train_data_parallel
from .verify import DTYPE, PER_RANK, image_batches, train_one_device, weights


def _convnet():
    return M.build_convnet(device=rank_device(), dtype=DTYPE, seed=0)


def _gradient_diagnosis(got, expected, local, world_size) -> str:
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
    diagnosis = _gradient_diagnosis([p.grad for p in m.parameters()], [p.grad for p in one.parameters()],
                                    local, world_size)
    data = image_batches(world_size, steps, device)
    dp, ref = _convnet(), _convnet()
    train_data_parallel(dp, data, torch.optim.SGD(dp.parameters(), lr=0.1), used)
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


def run_zero_step(rank, world_size, fn, fallback, average_gradients, steps: int = 3) -> dict:
    """Exercise 2: ``fn(params, shards, optimizer)`` must be one ZeRO-1 step; compared, step by step,
    with data parallelism by hand and the same AdamW on the full parameters."""
    device = rank_device()
    data = image_batches(world_size, steps, device)
    ref = _convnet()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    m = _convnet()
    params = list(m.parameters())
    shards = [shard_of(p, world_size, rank) for p in params]
    opt = _SeenAdamW(shards, lr=1e-2)
    used, diagnosis, at = fn, "ok", 0
    mine = lambda ps: [padded_flat(p.detach(), world_size).chunk(world_size)[rank] for p in ps]  # noqa: E731
    for at, (images, labels) in enumerate(data):
        x, y = split_batch(images, labels)
        F.cross_entropy(ref(x), y).backward()
        average_gradients(ref)
        expected = mine([p.grad for p in ref.parameters()])
        ref_opt.step()
        ref_opt.zero_grad()
        F.cross_entropy(m(x), y).backward()
        local = [g.clone() for g in mine([p.grad for p in params])]
        before = len(opt.seen)
        try:
            used(params, shards, opt)
        except NotImplementedError:
            if at:
                raise
            used = fallback
            fallback(params, shards, opt)
        if len(opt.seen) != before + 1:
            diagnosis = "step_count"
            break
        diagnosis = _gradient_diagnosis(opt.seen[-1], expected, local, world_size)
        if diagnosis != "ok":
            break
        if not close(weights(m), weights(ref)):
            diagnosis = "not_gathered" if close(mine(params), mine(ref.parameters())) else "wrong_update"
            break
    return {"not_attempted": used is fallback, "diagnosis": diagnosis, "step": at + 1}
