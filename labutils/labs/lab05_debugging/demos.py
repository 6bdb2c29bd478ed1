"""Lab 05's failures take time on purpose (a hang lasts its timeout, torch's watchdog waits before it
aborts); independent ones need not wait for each other::

    outcomes = demos.side_by_side({"order": (launch, (mistake, "order"), {"timeout": 10}),
                                   "shapes": (launch, (mistake, "shapes"), {"timeout": 10})})
    outcomes["order"].error        # the RankTimeout / RankError it ended with, or None
    outcomes["order"].seconds      # from its start to its end

    BACKGROUND.start("watchdog", torch_timeout_demo, "nccl")   # returns at once
    ...                                                        # other cells run meanwhile
    BACKGROUND.outcome("watchdog")                             # waits for it, if still running

Each demonstration runs in a thread of the notebook's process; what it starts (``labutils.launch``:
fresh rank processes, a rendezvous on a free port) is its own, so they do not disturb each other.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import time

from ...errors import LaunchConfigError, RankError, RankTimeout


@dataclasses.dataclass
class Outcome:
    """How one demonstration ended: its return value, or the labutils error it raised, and when."""
    value: object = None
    error: Exception | None = None
    seconds: float = 0.0


def timed(fn, *args, **kwargs) -> Outcome:
    """Run ``fn(*args, **kwargs)``; a ``RankError``/``RankTimeout``/``LaunchConfigError`` becomes the
    outcome's ``error`` (any other exception is a bug and propagates)."""
    t0 = time.perf_counter()
    try:
        value, error = fn(*args, **kwargs), None
    except (RankError, RankTimeout, LaunchConfigError) as exc:
        value, error = None, exc
    return Outcome(value, error, time.perf_counter() - t0)


class Background:
    """Demonstrations started now and read later; ``start`` returns at once."""

    def __init__(self, max_workers: int = 8):
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=max_workers,
                                                               thread_name_prefix="lab05-demo")
        self._futures: dict[str, concurrent.futures.Future] = {}

    def start(self, name: str, fn, *args, **kwargs) -> None:
        """Run ``timed(fn, *args, **kwargs)`` in a thread, under ``name``.

        Raises:
            ValueError: a demonstration of that name is still running.
        """
        if name in self._futures and not self._futures[name].done():
            raise ValueError(f"{name!r} is still running. HINT: read it with outcome({name!r}) first.")
        self._futures[name] = self._executor.submit(timed, fn, *args, **kwargs)

    def outcome(self, name: str, timeout: float | None = None) -> Outcome:
        """The outcome of ``name``, waiting for it if it is still running.

        Raises:
            KeyError: nothing of that name was started.
            TimeoutError: still running after ``timeout`` seconds.
        """
        if name not in self._futures:
            raise KeyError(f"no demonstration {name!r} was started. HINT: started: {sorted(self._futures)}.")
        try:
            return self._futures[name].result(timeout=timeout)
        except concurrent.futures.TimeoutError as exc:
            raise TimeoutError(f"{name!r} is still running after {timeout:g} s.") from exc

    def running(self) -> list[str]:
        """Names of the demonstrations not finished yet."""
        return sorted(n for n, f in self._futures.items() if not f.done())


def side_by_side(tasks: dict) -> dict[str, Outcome]:
    """Start every ``{name: (fn, args, kwargs)}`` at once and wait for all; ``{name: Outcome}`` in the
    order given."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(tasks))) as executor:
        futures = {name: executor.submit(timed, fn, *args, **kwargs) for name, (fn, args, kwargs) in tasks.items()}
        return {name: f.result() for name, f in futures.items()}
