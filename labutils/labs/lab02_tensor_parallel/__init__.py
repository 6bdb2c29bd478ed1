"""Lab 02 (tensor parallelism): ``comm`` (Megatron's f/g operators, ``CommTimer``, an uneven
all-gather), ``layers`` (column/row-parallel linear layers and the TP MLP), ``cost_model`` (the
speedup model; pure), ``verify`` (against one-device references), ``measure`` (collectives,
all_gather_object vs tensors, partition imbalance, the TP MLP)."""
