"""Exceptions raised by labutils when ranks fail, hang or are configured wrongly.

Every message states the value, the rank(s) and the next step, e.g.::

    RankTimeout: ranks [0] did not finish within 10 s. HINT: a collective that not every rank
    calls never returns.

In IPython/Jupyter the exceptions render the *rank's* traceback (not labutils' own frames) through
IPython's ``_render_traceback_`` hook, the mechanism ipyparallel uses for remote errors; ``str(e)``
stays one short line so that nbval can compare it across machines.
"""
from __future__ import annotations

import signal


class LaunchConfigError(ValueError):
    """Bad arguments to ``launch``/``RankPool``, detected before any process is started."""


def _describe_exit(code: int | None) -> str:
    """Human-readable form of a child's exit status (negative = killed by that signal)."""
    if code is None:
        return "is still running"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with code {code}"


class RankError(RuntimeError):
    """A rank raised an exception, or died, before returning its result.

    Attributes:
        rank: the first rank that failed (the one the message is about).
        ranks: every rank that had failed when the launch was torn down, in rank order.
        exc_type: name of the exception class raised in the rank ('' if the process died).
        remote_message: ``str()`` of the rank's exception.
        traceback: the rank's formatted traceback (text), or the last lines it printed if it died.
        exit_code: the rank's exit status if it died without reporting (negative = signal).
    """

    def __init__(self, rank: int, *, exc_type: str = "", remote_message: str = "",
                 traceback: str = "", exit_code: int | None = None, ranks: list[int] | None = None,
                 hint: str = ""):
        self.rank = rank
        self.ranks = sorted(ranks) if ranks else [rank]
        self.exc_type = exc_type
        self.remote_message = remote_message
        self.traceback = traceback
        self.exit_code = exit_code
        if exc_type:
            head = f"rank {rank} raised {exc_type}: {remote_message}".rstrip(": ")
        else:
            head = f"rank {rank} {_describe_exit(exit_code)} before returning a result"
        others = [r for r in self.ranks if r != rank]
        if others:
            head += f" (ranks {others} failed too)"
        hint = hint or ("the rank's traceback is attached (.traceback); the other ranks were stopped.")
        super().__init__(f"{head}. HINT: {hint}")
        if traceback:  # shown by Python >= 3.11's default traceback printer, not part of str()
            self.__notes__ = [f"--- traceback of rank {rank} ---\n{traceback.rstrip()}"]

    def _render_traceback_(self) -> list[str]:  # IPython hook: show the rank's traceback
        lines = [f"\033[31m{type(self).__name__}\033[0m: {self}"]
        if self.traceback:
            lines += [f"--- traceback of rank {self.rank} ---", *self.traceback.rstrip().splitlines()]
        return lines


class RankTimeout(TimeoutError):
    """Some ranks did not finish within the timeout; every rank was killed.

    Attributes:
        ranks: the ranks that had not finished, in rank order.
        timeout_s: the timeout that expired, in seconds.
    """

    def __init__(self, ranks: list[int], timeout_s: float, hint: str = ""):
        self.ranks = sorted(ranks)
        self.timeout_s = timeout_s
        hint = hint or ("a collective that not every rank calls never returns; "
                        "look at the last line each rank printed above.")
        super().__init__(f"ranks {self.ranks} did not finish within {timeout_s:g} s. HINT: {hint}")

    def _render_traceback_(self) -> list[str]:
        return [f"\033[31m{type(self).__name__}\033[0m: {self}"]
