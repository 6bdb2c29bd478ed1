"""Lab 01 (torch.cuda.comm): ``devices`` (the GPUs, or a CPU stand-in with the same API), ``verify``
(every call once, against plain-tensor references), ``measure`` (bandwidth, dtypes, many tensors,
redundant transfers, profiler kernels), ``analysis`` (fits, kernel names; pure), ``claims`` (the verdicts)."""
