"""Lab 06 (capstone: the benchmark, alpha-beta fits, where alpha goes, predicting labs 02 and 04).

* ``trace``    -- a ``torch.profiler`` run exported as a chrome trace, and the NCCL kernels / CPU ops in it.
* ``analysis`` -- pure: host vs device time of a small collective, the parts of an all_reduce inside a
  step (launch, waiting for the other rank, transfer), the fit each op of another lab is predicted with.
* ``claims``   -- verdicts from the recordings (``CLAIMS``), re-derived by ``tests/test_claims.py``.

The measurements themselves are the notebook's code (``notebooks/src/06_capstone.py``): it profiles,
captures a CUDA graph and times a step the learner reads; the benchmark is ``labutils.bench``.
"""
