"""Lab 04 (pipelining): ``schedule`` (stage splitting, bubble math, schedule orders and their
simulation, the GPipe loop), ``model`` (the residual MLP blocks), ``pipelining`` (torch's
``ScheduleGPipe`` / ``Schedule1F1B`` behind the same contract), ``verify`` (pipelined == one
device), ``measure`` (naive model parallelism, the GPipe sweep, P2P, memory, torch's schedules)."""
