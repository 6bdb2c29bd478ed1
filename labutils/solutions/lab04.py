"""Reference solutions for lab 04 (model parallelism and pipelining)."""
from __future__ import annotations


def bubble_fraction(p, m):
    """Idle share of a GPipe step with p stages and m micro-batches: (p - 1) / (m + p - 1).

    The step lasts m + p - 1 slots (m to push every micro-batch through, plus p - 1 to fill and
    drain the pipe); each stage works in m of them.
    """
    return (p - 1) / (m + p - 1)


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
