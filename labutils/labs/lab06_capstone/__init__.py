"""Lab 06 (capstone: the benchmark, alpha-beta fits, where alpha goes, predicting labs 02 and 04).

* ``trace``    -- a ``torch.profiler`` run exported as a chrome trace, and the NCCL kernels / CPU ops in it.
* ``analysis`` -- pure: host vs device time of a small collective (transfer vs waiting in NCCL's kernels),
  the fit each op of another lab is predicted with, and the recorded time it is compared with.
* ``p2p_channels`` -- NCCL's rules for one send/recv: how many channels a message gets and how a block
  splits its warps between a send and a receive (from NCCL's source; parameters from its start-up log).
* ``claims``   -- verdicts from the recordings (``CLAIMS``), re-derived by ``tests/test_claims.py``.
* ``record``   -- live, recorded, or (for a recording not made yet) a message instead of an error.

The measurements themselves are the notebook's code (``notebooks/src/06_capstone.py``): it profiles a
small collective and captures one in a CUDA graph, in cells the learner reads; the benchmark is
``labutils.bench``.
"""
