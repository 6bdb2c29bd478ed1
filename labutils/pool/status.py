"""``PoolStatus``: what ``RankPool.status()`` reports, as plain data (no I/O)."""
from __future__ import annotations

import dataclasses


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclasses.dataclass
class PoolStatus:
    """What ``RankPool.status()`` reports (plain data)."""
    world_size: int
    backend: str
    running: bool
    alive: list
    dead: dict
    pids: list
    devices: list
    tasks_run: int
    restarts: int
    uptime_s: float
    starting: bool = False

    def __str__(self) -> str:
        if not self.running:
            return f"RankPool: not running ({self.world_size} ranks, backend {self.backend})"
        if self.starting:
            return (f"RankPool: {self.world_size} ranks, backend {self.backend}, starting (fresh "
                    f"ranks: the next task waits for them); pids {self.pids}; {_count(self.tasks_run, 'task')} "
                    f"run, {_count(self.restarts, 'restart')}")
        state = "all alive" if not self.dead else f"DEAD ranks {sorted(self.dead)}"
        return (f"RankPool: {self.world_size} ranks, backend {self.backend}, {state}; "
                f"devices {self.devices}; pids {self.pids}; {_count(self.tasks_run, 'task')} run, "
                f"{_count(self.restarts, 'restart')}, up {self.uptime_s:.0f} s")
