"""Reference solutions for lab 03 (async point-to-point). Peek only after trying!

Both rings post each step's send and receive *together* with ``dist.batch_isend_irecv``: under NCCL
an ``isend`` followed by an ``irecv`` on every rank can deadlock (lab 03, section 1), and under gloo
a blocking ``dist.send`` on every rank does. The implementations live in ``labutils.p2p`` (the lab
times them against NCCL there); read them with ``ring_all_gather??`` in a notebook.

* ``ring_all_gather(output, input, group=None)``: like ``dist.all_gather_into_tensor``.
* ``ring_all_reduce(tensor, group=None)``: like ``dist.all_reduce`` (sum), in place.
"""
from labutils.p2p import ring_all_gather, ring_all_reduce

__all__ = ["ring_all_gather", "ring_all_reduce"]
