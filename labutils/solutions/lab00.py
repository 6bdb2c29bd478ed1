"""Reference solutions for lab 00."""
import statistics

import torch
import torch.distributed as dist


def time_collective(op, clock, *, warmup, iters, repeat):
    """The slowest rank's median time of one ``op()`` call, in ms (every rank calls it)."""
    for _ in range(warmup):            # untimed: first calls pay set-up
        op()
    clock.synchronize()
    samples = []
    for _ in range(repeat):
        dist.barrier()                 # the ranks start each sample together
        start = clock.mark()
        for _ in range(iters):         # back to back: one pair of marks for iters calls
            op()
        stop = clock.mark()
        clock.synchronize()            # the device has reached both marks
        samples.append(clock.elapsed_ms(start, stop) / iters)
    t = torch.tensor(samples, dtype=torch.float64, device=clock.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)   # sample by sample, the slowest rank's
    return statistics.median(t.tolist())


def fit_alpha_beta(size_bytes, time_ms):
    """Least squares of the relative error: rows [1/t, S/t] x [alpha, 1/beta] = 1. Returns (alpha_us, beta_gbps)."""
    t = torch.tensor(time_ms, dtype=torch.float64)
    s = torch.tensor(size_bytes, dtype=torch.float64)
    a = torch.stack([1 / t, s / t], dim=1)
    alpha_ms, ms_per_byte = torch.linalg.lstsq(a, torch.ones_like(t).unsqueeze(1)).solution.flatten().tolist()
    return alpha_ms * 1e3, 1.0 / (ms_per_byte * 1e-3) / 1e9
