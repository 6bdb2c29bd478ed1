"""Lab 08 (data parallelism): the harness around what the notebook teaches. The lesson's code (by hand,
ZeRO, FSDP2 wrapping) is the notebook's, defined in its cells; outside the notebook the tests and ``record``
take it from ``notebooks/src/08_data_parallel.py`` (``labutils.notebook_source``).

* ``model``   -- the workloads: a small CNN for the source's images, a stack of transformer blocks.
* ``ledger``  -- count the bytes every collective moves (DDP, hand-written ZeRO, FSDP2 alike).
* ``trace``   -- ``torch.profiler`` traces of steps -> compute / NCCL spans, their overlap, the tail before
  the optimizer, GPU idle (CUDA activity only for figures; CPU activity too for a picture of the host).
* ``memory``  -- bytes per parameter each scheme keeps (the ZeRO paper's formula), measured bytes, and
  ``settle`` (NCCL lets go of finished collectives' tensors before memory is read).
* ``verify``  -- correctness runs on ranks (gloo or NCCL) against one device / DDP.
* ``exercises`` -- the rank side of the exercise checkers (``labutils.checks.lab08``).
* ``build``   -- the rank side of the "build your DDP" checkers: the learner's naive / overlapped / bucketed
  gradient reduction beside torch's DDP, what each issued during backward and finish(), DDP's bucket rule.
* ``build_measure`` -- the 2-GPU recording ``08_build_ddp``: those three steps against no_sync and DDP on a
  communication-heavy workload.
* ``steps``   -- one training step (forward, backward, AdamW; ``no_sync`` on request) and its pieces.
* ``ddp_sweep`` -- the rank side of ``08_ddp``: plain model, bucket caps x NCCL CTAs, paired step / no_sync
  timings, kernel timelines.
* ``measure`` -- the 2xH200 measurements, one function per recording.
* ``overlap`` -- what ``08_ddp`` says: exposed time, overlap on the timeline, stretch and tail, best
  configuration (pure).
* ``claims``  -- verdicts from the recordings.
* ``record``  -- ``python -m labutils.labs.lab08_data_parallel.record``: all recordings in one pool, of the
  notebook's code.
"""
