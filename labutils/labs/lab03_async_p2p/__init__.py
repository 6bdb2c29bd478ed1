"""Lab 03's harness (async point-to-point). The fixed exchanges themselves are code in the notebook; here:
``exchange`` (the source's isend/irecv program, and the checks of the notebook's fixes), ``repro`` (runs
and classifies the standalone reproducer of the exchange on GPUs), ``wait`` (what ``wait()`` guarantees),
``overlap`` (the sweep around the notebook's overlapped step: communication hidden behind compute, measured),
``copies`` (the bare ``cudaMemcpyAsync`` between GPUs, and a profile of what a copy ran), ``streams``
(copies beside a matmul on one GPU's side stream, and the race a missing ``wait_stream`` leaves), ``measure``
(a ring against NCCL's all-gather and against gloo through host memory) and ``claims`` (their verdicts).
The rings of the exercises are in ``labutils.solutions.lab03``."""
