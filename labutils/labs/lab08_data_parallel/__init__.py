"""Lab 08 (data parallelism): the harness around what the notebook teaches.

* ``reference`` -- the code the notebook teaches (by hand, ZeRO, FSDP2 wrapping), for use outside it.
* ``model``   -- the workloads: a small CNN for the source's images, a stack of transformer blocks.
* ``ledger``  -- count the bytes every collective moves (DDP, hand-written ZeRO, FSDP2 alike).
* ``trace``   -- a ``torch.profiler`` trace of one step -> compute / NCCL spans and their overlap.
* ``memory``  -- bytes per parameter each scheme keeps (the ZeRO paper's formula), measured bytes.
* ``verify``  -- correctness runs on ranks (gloo or NCCL) against one device / DDP.
* ``exercises`` -- the rank side of the exercise checkers (``labutils.checks.lab08``).
* ``measure`` -- the 2xH200 measurements, one function per recording.
* ``claims``  -- verdicts from the recordings.
* ``record``  -- ``python -m labutils.labs.lab08_data_parallel.record``: all recordings in one pool.
"""
