"""Reference solutions for lab 05 (debugging distributed programs)."""
from __future__ import annotations


def checked_all_reduce(t):
    """``dist.all_reduce(t)`` that fails loudly -- on every rank, naming the odd ranks -- when the
    ranks' tensors disagree in shape or dtype, instead of hanging or returning garbage.

    The same idea as ``TORCH_DISTRIBUTED_DEBUG=DETAIL``: exchange a fingerprint of the call first
    (``all_gather_object``), compare, and only then run the collective. It costs one extra
    collective per call, which is why DETAIL is a debugging mode and not the default.
    """
    import torch.distributed as dist
    mine = (tuple(t.shape), str(t.dtype).replace("torch.", ""))
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    odd = [r for r, fp in enumerate(everyone) if fp != everyone[0]]
    if odd:
        raise ValueError(f"all_reduce mismatch: rank 0 has {everyone[0]}, "
                         + ", ".join(f"rank {r} has {everyone[r]}" for r in odd))
    dist.all_reduce(t)
    return t


def guarded_step(rank, world_size, loss, grad):
    """Average ``grad`` over the ranks, unless *any* rank's ``loss`` is not finite: then every rank
    skips the step and returns None.

    The buggy version branches on the rank's own loss, so a rank with a NaN skips the all_reduce
    the others wait in. The fix makes the decision collective first: an all_reduce of a 0/1 flag
    with MIN (is every loss finite?), then every rank takes the same branch.
    """
    import torch
    import torch.distributed as dist
    ok = torch.isfinite(loss).to(torch.int32).reshape(1)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    if ok.item() == 0:
        return None
    grad = grad.clone()
    dist.all_reduce(grad)
    return grad / world_size
