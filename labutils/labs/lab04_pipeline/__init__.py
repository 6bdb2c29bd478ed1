"""Lab 04 (pipelining): ``schedule`` (stage splitting, bubble math, schedule orders and their
simulation), ``model`` (the residual MLP blocks), ``pipelining`` (torch's ``ScheduleGPipe`` /
``Schedule1F1B`` behind the notebook loop's contract), ``verify`` (pipelined == one device),
``naive`` (one GPU vs the split in one process), ``gpu_clock`` (SM clock and power while a GPU
works), ``measure`` (the GPipe sweep, P2P, memory, torch's schedules on ranks), ``analysis`` (where
the bubble and the memory go), ``claims`` (the lab's verdicts). The GPipe loop itself is in the
notebook."""
