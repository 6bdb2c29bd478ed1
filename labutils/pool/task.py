"""One task on one generation of ranks: the wait loop, output attribution and the fault rules.

Rules (``Task.run`` returns the outcome, ``RankPool._finish`` acts on it):

* every selected rank returns (some may have raised): ``"ok"`` -- the process group is sound;
* a rank raised while others are still busy: they get ``STRAGGLER_GRACE_S`` to finish, then
  SIGINT; a rank that still does not answer within ``INTERRUPT_GRACE_S`` is stuck (typically in a
  collective with the failed rank, where the wait is in C++ and SIGINT cannot reach Python):
  ``"stuck"`` -> restart;
* a rank's process ends: ``"dead"`` -> restart (a process group cannot lose a member);
* the timeout expires: ``"timeout"`` -> restart;
* KeyboardInterrupt in the notebook: SIGINT to the busy ranks; ``"interrupted"`` if they all stop
  in time, else ``"interrupted-stuck"`` -> restart.
"""
from __future__ import annotations

import collections
import pickle
import time

from ..errors import RankError
from ..procs import print_rank_lines
from .ranks import Ranks

STRAGGLER_GRACE_S = 2.0   # after a rank failed: time the others get to finish before SIGINT
INTERRUPT_GRACE_S = 2.0   # after SIGINT: time to stop before a rank counts as stuck
RESTARTED = "the pool was restarted: fresh ranks, variables kept on the ranks are gone"


class RanksInterrupted(KeyboardInterrupt):
    """The notebook was interrupted (Ctrl-C, the kernel's Interrupt) while the pool's ranks ran a task.

    Still a ``KeyboardInterrupt`` (code that stops on Ctrl-C keeps doing so); the message says what
    became of the ranks. In IPython it is shown as that one message: the frames of labutils'
    wait loop, where the interrupt happened to land, say nothing about the learner's code.

    Attributes:
        ranks: the ranks that were running the task.
        stuck: those that did not stop (the pool was then restarted).
    """

    def __init__(self, ranks: list[int], stuck: list[int]):
        self.ranks, self.stuck = sorted(ranks), sorted(stuck)
        if stuck:
            msg = (f"interrupted while ranks {self.ranks} ran a task; ranks {self.stuck} did not stop "
                   f"(stuck in a collective or in native code, where SIGINT cannot reach Python), so "
                   f"{RESTARTED}. HINT: a collective that not every rank calls never returns; give "
                   "such cells a --timeout (or timeout=) and read the RankTimeout.")
        else:
            msg = (f"interrupted while ranks {self.ranks} ran a task; they stopped it and the pool "
                   "keeps running with its state. HINT: what the ranks assigned before the interrupt "
                   "is still there; run the cell again to redo the task.")
        super().__init__(msg)

    def _render_traceback_(self) -> list[str]:  # IPython hook: the message, not our frames
        return [f"\033[31m{type(self).__name__}\033[0m: {self}"]


class Task:
    """One task on one generation of ranks: the wait loop and its fault rules."""

    def __init__(self, ranks: Ranks, task_id: int, selected: list[int], output: str):
        self.ranks, self.task_id, self.selected, self.output = ranks, task_id, selected, output
        self.pending = set(selected)   # no result yet
        self.unended = set(selected)   # end-of-output mark not seen yet
        self.results: dict = {}
        self.failures: dict = {}
        self.dead: dict = {}
        self.interrupted: list[int] = []  # ranks we sent SIGINT to
        self.stuck: list[int] = []
        self.lines: list[tuple[int, str]] = []  # to print at the end ("grouped")
        self.tails = collections.defaultdict(lambda: collections.deque(maxlen=20))  # for errors
        self.timeout = 0.0

    def run(self, msg: bytes, timeout: float) -> str:
        """Send ``msg`` and wait; returns ``"ok"``, ``"dead"``, ``"stuck"``, ``"timeout"``,
        ``"interrupted"`` or ``"interrupted-stuck"`` (``RankPool._finish`` acts on it)."""
        self.timeout = timeout
        self._take_output()  # what the ranks printed while idle goes first
        deadline = time.monotonic() + timeout
        grace_until = None
        try:
            for r in self.selected:
                self.ranks.send(r, msg)  # a dead rank shows up as "eof" below
            while self.pending or self.unended:
                self._step(0.1)
                if self.dead:
                    return "dead"
                now = time.monotonic()
                if self.failures and self.pending:  # the others may be stuck with the failed rank
                    if grace_until is None:
                        grace_until = now + STRAGGLER_GRACE_S
                    elif now > grace_until or now > deadline:
                        if self.interrupted:
                            self.stuck = sorted(self.pending)
                            return "stuck"
                        self.interrupted = sorted(self.pending)
                        self.ranks.interrupt(self.interrupted)
                        grace_until = now + INTERRUPT_GRACE_S
                elif now > deadline:
                    return "timeout"
            return "ok"
        except KeyboardInterrupt:
            return self._on_interrupt()

    def _on_interrupt(self) -> str:
        self.interrupted = sorted(self.pending)
        self.ranks.interrupt(self.interrupted)
        until = time.monotonic() + INTERRUPT_GRACE_S
        try:
            while (self.pending or self.unended) and not self.dead and time.monotonic() < until:
                self._step(0.1)
        except KeyboardInterrupt:  # pressed again: do not wait any longer
            return "interrupted-stuck"
        return "interrupted-stuck" if (self.pending or self.dead) else "interrupted"

    def _step(self, timeout_s: float) -> None:
        for rank, kind, task_id, body in self.ranks.pump(timeout_s):
            if kind == "done" and task_id == self.task_id and rank in self.pending:
                self.pending.discard(rank)
                status, payload = pickle.loads(body)
                if status == "ok":
                    try:
                        self.results[rank] = pickle.loads(payload)
                    except Exception as exc:  # noqa: BLE001
                        self.failures[rank] = {
                            "exc_type": type(exc).__name__, "traceback": "",
                            "message": f"its result could not be unpickled in the notebook: {exc}",
                            "hint": "return plain data (tensors, numbers, lists, dicts); classes "
                                    "defined on the ranks cannot come back."}
                else:
                    self.failures[rank] = payload
            elif kind == "eof" and rank in self.selected:
                self.dead[rank] = self.ranks.exit_code(rank)
                self.pending.discard(rank)
                self.unended.discard(rank)
        self._take_output()

    def _take_output(self) -> None:
        for event in self.ranks.take_events():
            if event[0] == "end":
                if event[2] == self.task_id:
                    self.unended.discard(event[1])
                continue
            self.tails[event[1]].append(event[2])
            if self.output == "live":
                print_rank_lines([event[1:]], False)
            elif self.output == "grouped":
                self.lines.append(event[1:])

    def collect_output(self) -> None:
        """Take what the ranks printed but was not read yet (everything, for ranks that died)."""
        self.ranks.read_output()
        self._take_output()

    def print_output(self) -> None:
        """Print what the ranks said during this task (grouped by rank, in rank order)."""
        if self.output == "grouped":
            print_rank_lines(self.lines, True)
        self.lines = []

    def error(self, outcome: str) -> RankError:
        if self.dead:
            r = min(self.dead)
            return RankError(r, exit_code=self.dead[r], traceback="".join(self.tails[r]).rstrip(),
                             ranks=sorted(set(self.dead) | set(self.failures)), hint=(
                                 "a rank that dies without an exception was killed (SIGKILL: often "
                                 "the out-of-memory killer), called os._exit, or crashed in native "
                                 f"code; its last output is in .traceback; {RESTARTED}."))
        first = [r for r in sorted(self.failures) if r not in self.interrupted] or sorted(self.failures)
        r = first[0]
        info = self.failures[r]
        if outcome == "stuck":
            state = (f"ranks {self.stuck} were still waiting (in a collective with rank {r}?) "
                     f"and did not stop, so {RESTARTED}.")
        elif self.interrupted:
            state = (f"ranks {self.interrupted} were still running and were interrupted; "
                     "the pool keeps running with its state.")
        else:
            state = "every other rank returned, so the pool keeps running with its state."
        hint = f"{info['hint']} {state}" if info.get("hint") else state
        return RankError(r, exc_type=info["exc_type"], remote_message=info["message"],
                         traceback=info["traceback"], ranks=sorted(self.failures), hint=hint,
                         exc_types={q: f.get("exc_type", "") for q, f in self.failures.items()})
