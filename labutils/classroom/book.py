"""Who holds which GPU slice, in the hub (``classroom/jupyterhub_config.py``'s spawn hooks).

    book = SliceBook(slices.plan_slices(topo, 2), "STATE/slices.json")
    gpus = book.acquire("ada")     # the first free slice; the same one while ada holds it
    book.release("ada")            # ada's server stopped: the slice is free again
"""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from .slices import SliceError


class SliceBook:
    """Which learner holds which slice: a learner keeps its slice across restarts of its
    server while it holds it; a stopped server gives it back. Saved to ``state_path`` (JSON
    ``{"slices": [[0, 1], ...], "holders": {"ada": 0}}``) so that a restarted hub, and
    ``classroom check --hub-state``, know the assignment."""

    def __init__(self, slices: list[tuple], state_path: str | os.PathLike | None = None):
        self.slices = [tuple(s) for s in slices]
        self.state_path = Path(state_path) if state_path else None
        self.holders: dict[str, int] = {}
        self._lock = threading.Lock()
        if self.state_path and self.state_path.exists():
            saved = json.loads(self.state_path.read_text())
            if [tuple(s) for s in saved.get("slices", [])] == self.slices:
                self.holders = {u: int(k) for u, k in saved.get("holders", {}).items()}

    def acquire(self, user: str) -> tuple:
        with self._lock:
            if user not in self.holders:
                taken = set(self.holders.values())
                free = [k for k in range(len(self.slices)) if k not in taken]
                if not free:
                    raise SliceError(
                        f"all {len(self.slices)} GPU slices are in use ({', '.join(sorted(self.holders))}); "
                        f"{user!r} gets none. HINT: stop an idle server (the culler does after its timeout), "
                        f"or use a smaller slice size.")
                self.holders[user] = free[0]
                self._save()
            return self.slices[self.holders[user]]

    def release(self, user: str) -> None:
        with self._lock:
            if self.holders.pop(user, None) is not None:
                self._save()

    def _save(self) -> None:
        if self.state_path is None:
            return
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"slices": [list(s) for s in self.slices], "holders": self.holders},
                                  indent=1))
        os.replace(tmp, self.state_path)


def load_state(path: str | os.PathLike) -> dict[str, tuple]:
    """``{learner: slice}`` from a SliceBook's state file."""
    saved = json.loads(Path(path).read_text())
    return {u: tuple(saved["slices"][k]) for u, k in saved.get("holders", {}).items()}
