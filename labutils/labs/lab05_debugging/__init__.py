"""Lab 05 (debugging): ``demos`` (run deliberate failures side by side, or in the background while
the notebook goes on), ``topology`` (what the figures in NCCL's topology lines are), ``claims``
(the lab's verdicts)."""
