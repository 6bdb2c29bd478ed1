"""Measuring instruments that every lab shares, below the labs and above the core.

* ``ledger`` -- ``Ledger``: the communication a rank issues (collectives and point-to-point), with
  each call's size and the bytes it puts on the wire.
* ``profiler`` -- ``profile(fn)``: a callable run under ``torch.profiler``; ``kernels(doc)``: the GPU's
  spans in its trace (NCCL and compute, per device and stream).
* ``memory`` -- ``Probe(device)``: the bytes the CUDA allocator holds for a piece of work, and its peak.
* ``compare`` -- ``close`` / ``mismatch``: a result against its reference (``torch.testing.assert_close``).

Import the module you need (``from labutils.instruments.ledger import Ledger``); this package
re-exports nothing, so each name has one home.
"""
