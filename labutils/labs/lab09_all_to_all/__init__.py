"""Lab 09's harness (all-to-all, expert and sequence parallelism, DTensor). The layers themselves are code
in the notebook; here: ``wire`` (bytes on the wire and activations kept for backward, counted and
predicted), ``verify`` (the notebook's layers against one device), ``measure`` (the GPU sweeps behind the
recordings) and ``claims`` (their verdicts)."""
