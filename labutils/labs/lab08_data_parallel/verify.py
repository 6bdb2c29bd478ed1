"""Correctness runs for lab 08 on any ranks: gloo with CPU tensors, or NCCL with one GPU per rank.

    results = pool.run(verify.check_by_hand, replicate, train_data_parallel, {"average": avg, "sum": s})
    verify.show(results)            # one "statement: value" line each, identical on CPU and GPUs

Each ``check_*`` is a rank function returning ``{statement: value}`` (booleans, small ints, rounded
figures); ``show`` prints them once every rank agrees. The code under test is passed in -- the
notebook's own functions -- and compared with a one-device run or with DDP. Everything is float64,
so "==" means equal to rounding: ``torch.testing.assert_close``'s float64 defaults, rtol = atol = 1e-7.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from labutils.config import rank_device
from labutils.instruments.compare import close
from labutils.instruments.ledger import Ledger

from . import model as M
from .ledger import volume_in_params
from .steps import wrap_ddp
from .reference import require_fsdp2, split_batch

DTYPE = torch.float64
PER_RANK = 4  # images per rank in every batch
STEPS = 5
LR = 0.1
TOLERANCE = "float64, torch.testing.assert_close defaults: rtol 1e-07, atol 1e-07"


def weights(model) -> list:
    """The model's parameters, as plain local tensors (DTensors gathered: a collective)."""
    return [p.full_tensor() if hasattr(p, "full_tensor") else p.detach() for p in model.parameters()]


def same_on_every_rank(tensors) -> bool:
    """True on every rank iff every rank holds bit-identical ``tensors`` (a collective)."""
    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    ref = flat.clone()
    dist.broadcast(ref, src=0)
    ok = torch.tensor([float(torch.equal(flat, ref))], device=flat.device)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def image_batches(world_size: int, steps: int, device) -> list:
    """``steps`` global batches of ``PER_RANK * world_size`` images, the same on every rank."""
    return [M.image_batch(PER_RANK * world_size, seed=s, device=device, dtype=DTYPE) for s in range(steps)]


def train_one_device(model, batches, optimizer):
    """The reference: the whole batch on one device, one step per batch."""
    for images, labels in batches:
        optimizer.zero_grad()
        F.cross_entropy(model(images), labels).backward()
        optimizer.step()
    return model


def _convnet(seed: int = 0):
    return M.build_convnet(device=rank_device(), dtype=DTYPE, seed=seed)


# ---- part 1 ---------------------------------------------------------------------------------------
def check_by_hand(rank, world_size, replicate, train_data_parallel, reduce_fns: dict) -> dict:
    """Replication, then data parallelism by hand with each of ``reduce_fns`` against one device."""
    device = rank_device()
    out = {}
    m = _convnet(seed=rank)  # a different initialisation on every rank, on purpose
    out["before replicate: the ranks' weights differ"] = not same_on_every_rank(weights(m))
    replicate(m)
    out["after replicate: every rank holds rank 0's weights"] = (
        same_on_every_rank(weights(m)) and close(weights(m), weights(_convnet(seed=0))))
    data = image_batches(world_size, STEPS, device)
    one = {}
    for factor in (1, world_size):
        ref = _convnet()
        one[factor] = weights(train_one_device(ref, data, torch.optim.SGD(ref.parameters(), lr=LR * factor)))
    for name, fn in reduce_fns.items():
        m = _convnet()
        train_data_parallel(m, data, torch.optim.SGD(m.parameters(), lr=LR), fn)
        out[f"{name}, SGD with lr: same weights on every rank"] = same_on_every_rank(weights(m))
        out[f"{name}, SGD with lr: == one device with lr"] = close(weights(m), one[1])
        out[f"{name}, SGD with lr: == one device with N x lr"] = close(weights(m), one[world_size])
    adam = {}
    for name, fn in reduce_fns.items():
        m = _convnet()
        adam[name] = weights(train_data_parallel(m, data, torch.optim.Adam(m.parameters(), lr=1e-3), fn))
    if {"sum", "average"} <= set(adam):
        out["Adam: sum and average give the same weights (rtol 1e-05)"] = close(
            adam["sum"], adam["average"], rtol=1e-5, atol=1e-8)
    return out


# ---- part 2 ---------------------------------------------------------------------------------------
def check_ddp(rank, world_size, train_ddp, train_data_parallel, accumulate, average_gradients,
              micro_batches: int = 4) -> dict:
    """``train_ddp(rank, world_size, batches)`` against data parallelism by hand and one device; then
    ``accumulate`` with and without ``no_sync``; then where ``gradient_as_bucket_view`` puts p.grad."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    device = rank_device()
    out = {}
    data = image_batches(world_size, STEPS, device)
    ddp = train_ddp(rank, world_size, data)
    by_hand = _convnet()
    train_data_parallel(by_hand, data, torch.optim.SGD(by_hand.parameters(), lr=LR), average_gradients)
    one = _convnet()
    train_one_device(one, data, torch.optim.SGD(one.parameters(), lr=LR))
    out["DDP: every rank ends with the same weights"] = same_on_every_rank(weights(ddp.module))
    out["DDP == data parallelism by hand (SGD)"] = close(weights(ddp.module), weights(by_hand))
    out["DDP == one device on the whole batch (SGD)"] = close(weights(ddp.module), weights(one))

    images, labels = M.image_batch(PER_RANK * world_size * micro_batches, seed=99, device=device, dtype=DTYPE)
    x, y = split_batch(images, labels)
    micro = list(zip(x.chunk(micro_batches), y.chunk(micro_batches)))
    ddp = wrap_ddp(_convnet(), rank_device())
    grads, calls = {}, {}
    for use_no_sync in (False, True):
        ddp.zero_grad(set_to_none=True)
        with Ledger() as book:
            accumulate(ddp, micro, use_no_sync)
        calls[use_no_sync] = book.counts().get("all_reduce", 0)
        grads[use_no_sync] = [p.grad.clone() for p in ddp.parameters()]
    one = _convnet()
    F.cross_entropy(one(images), labels).backward()
    out[f"{micro_batches} micro-batches: all-reduce calls without no_sync"] = calls[False]
    out[f"{micro_batches} micro-batches: all-reduce calls with no_sync"] = calls[True]
    out["no_sync: same accumulated gradients"] = close(grads[True], grads[False])
    out["no_sync: == one device's gradient on the whole batch"] = close(grads[True], [p.grad for p in one.parameters()])

    for as_view in (False, True):
        buffers = []

        def keep_bucket(state, bucket, buffers=buffers):
            buffers.append(bucket.buffer())
            return default_hooks.allreduce_hook(None, bucket)

        ddp = wrap_ddp(_convnet(), rank_device(), gradient_as_bucket_view=as_view)
        ddp.register_comm_hook(None, keep_bucket)
        for _ in range(2):  # grads become views of the buckets after the first iteration
            buffers.clear()
            ddp.zero_grad(set_to_none=True)
            F.cross_entropy(ddp(x), y).backward()
        inside = all(any(_inside(p.grad, b) for b in buffers) for p in ddp.parameters())
        out[f"gradient_as_bucket_view={as_view}: every p.grad is a view into DDP's bucket"] = inside
    return out


def _inside(t, buffer) -> bool:
    lo = buffer.data_ptr()
    return lo <= t.data_ptr() < lo + buffer.numel() * buffer.element_size()


# ---- part 3 ---------------------------------------------------------------------------------------
def adam_state_numel(optimizer) -> int:
    """Elements of the optimizer's state tensors (the scalar step counters aside)."""
    return sum(v.numel() for st in optimizer.state.values() for v in st.values()
               if torch.is_tensor(v) and v.dim() > 0)


def check_zero(rank, world_size, shard_of, zero1_step, zero2_attach, zero2_step, average_gradients,
               steps: int = 3) -> dict:
    """ZeRO-1 and ZeRO-2 against data parallelism by hand with the same Adam: weights, state, volume."""
    device = rank_device()
    data = image_batches(world_size, steps, device)
    runs = {}
    for scheme in ("DDP by hand", "ZeRO-1", "ZeRO-2"):
        m = _convnet()
        params = list(m.parameters())
        shards = params if scheme == "DDP by hand" else [shard_of(p, world_size, rank) for p in params]
        opt = torch.optim.AdamW(shards, lr=1e-2)
        hooks = zero2_attach(params, shards) if scheme == "ZeRO-2" else []
        freed = True
        with Ledger() as book:
            for images, labels in data:
                x, y = split_batch(images, labels)
                F.cross_entropy(m(x), y).backward()
                freed &= all(p.grad is None for p in params)
                if scheme == "DDP by hand":
                    average_gradients(m)
                    opt.step()
                    opt.zero_grad()
                elif scheme == "ZeRO-1":
                    zero1_step(params, shards, opt)
                else:
                    zero2_step(params, shards, opt)
        for h in hooks:
            h.remove()
        runs[scheme] = {"weights": weights(m), "state": adam_state_numel(opt), "freed": freed,
                        "volume": volume_in_params(book, sum(p.numel() for p in params)) / steps}
    base = runs["DDP by hand"]
    out = {}
    for scheme in ("ZeRO-1", "ZeRO-2"):
        out[f"{scheme} == data parallelism by hand with Adam ({steps} steps)"] = close(runs[scheme]["weights"], base["weights"])
        share = runs[scheme]["state"] * world_size / base["state"]
        out[f"{scheme}: Adam state on this rank x N / DDP's (1.00 = a 1/N share)"] = f"{share:.2f}"
    out["ZeRO-2: no rank holds a full gradient after backward"] = runs["ZeRO-2"]["freed"]
    out["communication per step in Ψ: DDP by hand, ZeRO-1, ZeRO-2"] = ", ".join(
        f"{runs[s]['volume']:.2f}" for s in ("DDP by hand", "ZeRO-1", "ZeRO-2"))
    return out


# ---- part 4 ---------------------------------------------------------------------------------------
FSDP_VARIANTS = {"FSDP2": {}, "FSDP2, reshard_after_forward=False": {"reshard_after_forward": False},
                 "FSDP2, prefetch 2 blocks": {"prefetch": 2}}


def check_fsdp(rank, world_size, shard_transformer, steps: int = 3, cfg: dict | None = None) -> dict:
    """FSDP2 (each variant) against DDP on a small transformer: losses, weights, volume per step."""
    require_fsdp2()
    cfg = cfg or M.SMALL_TF
    device = rank_device()
    x, y = M.token_batch(cfg, cfg["batch_per_rank"], seed=rank, device=device, dtype=DTYPE)
    psi = M.n_params(cfg)

    def run(wrap):
        m = M.build_transformer(cfg, device=device, dtype=DTYPE)
        wrapped = wrap(m)
        opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
        losses = []
        with Ledger() as book:
            for _ in range(steps):
                opt.zero_grad()
                loss = F.mse_loss(wrapped(x), y)
                loss.backward()
                opt.step()
                losses.append(loss.detach())
        return losses, weights(m), volume_in_params(book, psi) / steps

    ddp = run(lambda m: wrap_ddp(m, device))
    out = {"DDP: communication per step in Ψ": f"{ddp[2]:.1f}"}
    for name, kwargs in FSDP_VARIANTS.items():
        losses, w, volume = run(lambda m, kw=kwargs: shard_transformer(m, **kw))
        out[f"{name}: losses == DDP's, {steps} Adam steps"] = close(losses, ddp[0])
        out[f"{name}: weights == DDP's"] = close(w, ddp[1])
        out[f"{name}: communication per step in Ψ"] = f"{volume:.1f}"
    return out


def show(results: list[dict]) -> None:
    """Print ``statement: value`` once if every rank agrees, else each rank's value (and say so)."""
    keys = list(results[0])
    for key in keys:
        values = [r.get(key) for r in results]
        if all(v == values[0] for v in values):
            print(f"{key}: {values[0]}")
        else:
            print(f"{key}: ranks disagree: " + ", ".join(f"rank {i} {v}" for i, v in enumerate(values)))
