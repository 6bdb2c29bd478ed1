"""Lab 02 (tensor parallelism) harness -- the teaching code (Megatron's f and g, the column- and
row-parallel layers, the TP MLP) lives in the notebook. Here: ``script`` (run a program as written, in
its own process), ``measure`` (collectives, tensors vs objects, partition imbalance), ``paths`` (the
same bytes by copy engine, NCCL send/recv and collectives with more or fewer channels), ``steps`` (the
TP MLP against one GPU, with the all-reduce kernels inside a step), ``verify`` (the notebook's classes
against one-device PyTorch), ``cost_model`` (the speedup model and lab 06's summary; pure) and
``claims`` (the verdicts)."""
