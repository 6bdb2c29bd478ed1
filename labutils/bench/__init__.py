"""The collective benchmark behind ``python -m labutils bench``, measured the way nccl-tests measures.

* ``config``: what to sweep (``BenchConfig``, nccl-tests' options), buffer layouts, the correctness
  check's input pattern -- pure, no GPU;
* ``ops``: one collective's buffers and op callables on a rank, a bare loop of the same torch call,
  and its correctness check (``verify_case``, ``verify_one``);
* ``graph``: the CUDA-graph mode (nccl-tests' ``-G``): capture, replay, verify;
* ``sweep``: the rank side of a run (every collective, every size: timed, then verified);
* ``run``: the driver (ranks started by ``labutils.launch``, or this process under ``torchrun``),
  progress, files;
* ``report``: the nccl-tests table, latency lines and summary of a result;
* ``files``: JSON and CSV; ``analysis``: alpha-beta fits, interpolated times, the busbw plot.

The command line is ``labutils.commands.bench``.
"""
