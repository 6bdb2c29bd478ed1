"""Lab 10's harness (scaling out). The algorithms themselves are code in the notebook; here: ``model``
(alpha-beta costs of ring, tree and direct all-reduce, the hierarchical all-reduce, predictions, the
communication roofline; pure), ``tuning`` (NCCL's algorithm/protocol choice read from its
``NCCL_DEBUG=INFO`` tuning lines; pure), ``measure`` (the sweeps behind the recordings), ``verify``
(the 2-D mesh against one device) and ``claims`` (the verdicts)."""
