"""Reference solutions for lab 04 (model parallelism and pipelining)."""
from __future__ import annotations


def one_f_one_b_order(p, m):
    """Per stage, the 1F1B order of forwards ("F", i) and backwards ("B", i) for p stages, m micro-batches.

    Stage s runs w = min(m, p - s) forwards (warm-up: as many as the last stage needs to reach its first
    backward, and no more), then one backward and one forward in turn, the backward always the oldest
    micro-batch it holds, then the w backwards left (cool-down). It never holds more than p - s.
    """
    order = []
    for s in range(p):
        warm = min(m, p - s)
        ops = [("F", i) for i in range(warm)]
        for i in range(m - warm):
            ops += [("B", i), ("F", warm + i)]
        ops += [("B", i) for i in range(m - warm, m)]
        order.append(ops)
    return order


def one_f_one_b_step(stage, x, target, loss_fn, n_microbatches, act_shape):
    """One 1F1B training step on this rank's stage (stage s = rank s, p = world size), with the
    contract of the notebook's ``gpipe_step``: the full output on the last rank, None elsewhere.

    Stage s runs min(m, p - s) forwards, then alternates one backward and one forward, then runs the
    backwards left -- so it never holds more than p - s micro-batches' activations (GPipe: all m).
    Every send is an ``isend`` (its tensor kept until ``wait``): a blocking send waits until the
    receiver takes the data, and in 1F1B the receiver may itself be waiting for this rank.
    """
    import torch
    import torch.distributed as dist
    rank, p, m = dist.get_rank(), dist.get_world_size(), n_microbatches
    first, last = rank == 0, rank == p - 1
    w = next(stage.parameters())
    xs = x.chunk(m) if first else None
    ys = target.chunk(m) if last else None
    inputs, outputs, results, sends = {}, {}, [], []

    def forward(i):
        if first:
            h = xs[i]
        else:
            h = torch.empty(act_shape, device=w.device, dtype=w.dtype)
            dist.recv(h, src=rank - 1)
            h.requires_grad_()
        out = stage(h)
        if last:
            results.append(out.detach())
            out = loss_fn(out, ys[i]) / m
        else:
            act = out.detach()
            sends.append((dist.isend(act, dst=rank + 1), act))
        inputs[i], outputs[i] = h, out

    def backward(i):
        grad = None
        if not last:
            grad = torch.empty_like(outputs[i])
            dist.recv(grad, src=rank + 1)
        torch.autograd.backward(outputs.pop(i), grad_tensors=grad)
        h = inputs.pop(i)  # this micro-batch's activations can go now
        if not first:
            sends.append((dist.isend(h.grad, dst=rank - 1), h.grad))

    warm = min(m, p - rank)
    for i in range(warm):            # fill: p - s forwards
        forward(i)
    for i in range(m - warm):        # steady state: one backward, one forward
        backward(i)
        forward(warm + i)
    for i in range(m - warm, m):     # drain: the backwards left
        backward(i)
    for work, _ in sends:
        work.wait()
    return torch.cat(results) if last else None
