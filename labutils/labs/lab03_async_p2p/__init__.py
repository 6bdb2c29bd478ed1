"""Lab 03 (async point-to-point): ``exchange`` (the source's isend/irecv program and three fixes),
``hang`` (the same exchange under NCCL, observed with a step log that survives the kill), ``wait``
(what ``wait()`` guarantees), ``overlap`` (communication hidden behind compute, measured),
``measure`` (a ring against NCCL's all-gather). The rings themselves are the exercises' reference
solutions, in ``labutils.solutions.lab03``."""
