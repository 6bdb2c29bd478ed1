"""A pool started with wait=False and first used after its start deadline: ranks that came up in time are
read, not reported as a start timeout (lab 05's exercise pool, first used late on a slow machine)."""
from __future__ import annotations

import time

import labutils


def test_ranks_that_started_in_time_are_found_when_the_pool_is_first_used_late():
    t0 = time.monotonic()
    late = labutils.RankPool(world_size=2, backend="gloo", output="quiet", wait=False, start_timeout=600)
    with labutils.RankPool(world_size=2, backend="gloo", output="quiet"):   # a twin, started alongside: ready now
        took = time.monotonic() - t0
    try:
        time.sleep(took)                 # the late pool's ranks, which started at the same time, are up by now
        late.start_timeout = 0.001       # ... and its start deadline has long passed
        assert late.run(lambda rank, world_size: rank, timeout=30) == [0, 1]
    finally:
        late.close()
