"""Exceptions raised by labutils when ranks fail, hang or are configured wrongly.

Every message states the value, the rank(s) and the next step, e.g.::

    RankTimeout: ranks [0] did not finish within 10 s. HINT: a collective that not every rank
    calls never returns.

In IPython/Jupyter the exceptions render the *rank's* traceback (not labutils' own frames) through
IPython's ``_render_traceback_`` hook, the mechanism ipyparallel uses for remote errors; ``str(e)``
stays one short line so that nbval can compare it across machines.

``failure_error`` and ``hang_error`` turn what the ranks left behind (reports, exit codes, output,
the stacks of hanging ranks) into these exceptions: they pick the rank that *caused* a failure
(not one that merely lost its peer) and add a HINT for the classic mistakes.
"""
from __future__ import annotations

import linecache
import os
import re
import signal

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


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
        rank: the rank the message is about (the first one that failed by itself).
        ranks: every rank that had failed when the launch was torn down, in rank order.
        exc_type: name of the exception class raised in the rank ('' if the process died).
        remote_message: ``str()`` of the rank's exception ('' if it died).
        traceback: the rank's formatted traceback (text), or the last lines it printed if it died.
        exit_code: the rank's exit status if it died without reporting (negative = signal).
        finished: ranks that had returned their result before the failure.
        detail: for a rank that died, its last words (e.g. the C++ ``what():`` line), else ''.
        exc_types: ``{rank: exception class name}`` of every rank that raised (a pool task's), else {}.
    """

    def __init__(self, rank: int, *, exc_type: str = "", remote_message: str = "",
                 traceback: str = "", exit_code: int | None = None, ranks: list[int] | None = None,
                 hint: str = "", finished: list[int] | None = None, detail: str = "",
                 others: list[int] | None = None, exc_types: dict[int, str] | None = None):
        self.rank = rank
        self.exc_types = dict(exc_types or {})
        self.ranks = sorted(ranks) if ranks else [rank]
        self.exc_type = exc_type
        self.remote_message = remote_message
        self.traceback = traceback
        self.exit_code = exit_code
        self.finished = sorted(finished or [])
        self.detail = detail
        if exc_type:
            head = f"rank {rank} raised {exc_type}: {remote_message}".rstrip(": ")
        else:
            head = f"rank {rank} {_describe_exit(exit_code)} before returning a result"
            if detail:
                head += f" ({detail})"
        others = [r for r in self.ranks if r != rank] if others is None else others
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
        finished: ranks that had returned their result.
        where: ``{rank: "file:line in function: source"}`` -- where each live rank was when the
            timeout expired (the innermost line of user code; empty if it could not be asked).
        stacks: ``{rank: formatted Python stack}`` of each live rank's main thread.
        flight: ``{rank: flight-recorder summary}`` (``labutils.debugging.flight.flight_record``), where
            the installed torch records collectives; read it with ``debugging.first_divergence``.
    """

    def __init__(self, ranks: list[int], timeout_s: float, hint: str = "", *,
                 finished: list[int] | None = None, where: dict | None = None,
                 stacks: dict | None = None, flight: dict | None = None):
        self.ranks = sorted(ranks)
        self.timeout_s = timeout_s
        self.finished = sorted(finished or [])
        self.where = dict(sorted((where or {}).items()))
        self.stacks = dict(sorted((stacks or {}).items()))
        self.flight = dict(sorted((flight or {}).items()))
        hint = hint or ("a collective that not every rank calls never returns; "
                        "look at the last line each rank printed above.")
        super().__init__(f"ranks {self.ranks} did not finish within {timeout_s:g} s. HINT: {hint}")
        if self.where:
            self.__notes__ = ["where each rank was:", *(f"  rank {r}: {w}" for r, w in self.where.items())]

    def _render_traceback_(self) -> list[str]:
        lines = [f"\033[31m{type(self).__name__}\033[0m: {self}"]
        if self.where:
            lines += ["where each rank was when the timeout expired:",
                      *(f"  rank {r}: {w}" for r, w in self.where.items())]
        return lines


# ----------------------------------------------------------------------------------------------
# Turning what failed ranks left behind into one clear error.

# A rank whose error says only "my peer went away" or "my collective timed out" is a consequence.
PEER_LOST = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|remote process exited|"
    r"NCCL communicator was aborted|ncclRemoteError|failed to recv, got 0 bytes|"
    r"Socket Timeout|Connection refused", re.IGNORECASE)
TIMED_OUT = re.compile(
    r"Watchdog caught collective operation timeout|collective timeout from|"
    r"dump signal from another rank|timed out in blocking wait|Timed out waiting \d+ ?ms")
WATCHDOG = re.compile(r"Watchdog caught collective operation timeout: (\S+\([^)]*\))"
                      r"(?: ran for (\d+) milliseconds)?")

# (pattern on "ExcType: message" or a dead rank's output, hint): the classic mistakes.
HINTS = [
    (r"No backend type associated with device type cpu|Tensors must be CUDA|"
     r"Expected.*(?:cuda|CUDA).*(?:cpu|CPU)",
     "NCCL moves CUDA tensors only: create the tensors on the rank's GPU "
     "(device=f'cuda:{rank}' or .cuda()), or use backend='gloo' for CPU tensors."),
    (r"EADDRINUSE|[Aa]ddress already in use",
     "that port is taken (by another program, or by an earlier run still alive). Don't hard-code "
     "ports: let launch() initialise the process group (init='eager'), or use "
     "init_method='env://' with the free MASTER_PORT labutils sets."),
    (r"OutOfMemoryError|out of memory|can't allocate memory|Cannot allocate memory|MemoryError",
     "the rank ran out of memory: allocate less (check the sizes: bytes = numel x element size), "
     "free what you no longer need (del, torch.cuda.empty_cache()), see torch.cuda.memory_summary()."),
    (r"Detected mismatch between collectives|collective mismatch|"
     r"size doesn't match|[Mm]ismatch.*(?:shape|size|dtype)",
     "the ranks called different collectives, or the same one with different shapes/dtypes, at the "
     "same step. Every rank must call the same collectives in the same order with matching tensors "
     "(TORCH_DISTRIBUTED_DEBUG=DETAIL names both sides)."),
    (r"invalid device ordinal",
     "the rank asked for a GPU that does not exist: use one GPU per rank, cuda:0..cuda:<world_size-1>."),
    (r"Duplicate GPU detected",
     "two ranks of one NCCL communicator are on the same GPU, which NCCL refuses: give each rank its own "
     "GPU (torch.cuda.set_device(local_rank) before the first collective), or use backend='gloo' for "
     "more ranks than GPUs."),
]


def hint_for(text: str) -> str:
    """The HINT for the first classic mistake recognised in ``text``, or ''."""
    for pattern, hint in HINTS:
        if re.search(pattern, text):
            return hint
    return ""


def last_words(output: str) -> str:
    """What a rank that died said last: C++ ``what():``, the NCCL watchdog line, or ''."""
    m = re.findall(r"what\(\):\s*(.+)", output)
    if m:
        return m[-1].strip()
    m = WATCHDOG.search(output)
    if m:
        return m.group(0).strip()
    return ""


def _is_consequence(info: dict, output: str) -> bool:
    """True if this failure only says that a peer disappeared or a collective timed out."""
    text = f"{info.get('message', '')}" if "exc_type" in info else output
    return bool(PEER_LOST.search(text) or TIMED_OUT.search(text))


def failure_error(failures: dict[int, dict], outputs: dict[int, str],
                  finished: list[int] | None = None) -> RankError:
    """Build the ``RankError`` for a failed launch.

    Args:
        failures: ``{rank: info}``; info is the rank's report (``exc_type``, ``message``,
            ``traceback``, optional ``hint``) or ``{"exit_code": code}`` for a rank that died.
        outputs: ``{rank: everything it printed}`` (used for ranks that died).
        finished: ranks that had returned normally.

    The rank named is the lowest one that failed *by itself*; ranks that only lost their peers
    (gloo "Connection closed by peer", NCCL watchdog aborts) are named only if nothing else failed.
    """
    finished = sorted(finished or [])
    causes = [r for r in sorted(failures) if not _is_consequence(failures[r], outputs.get(r, ""))]
    rank = (causes or sorted(failures))[0]
    info, out = failures[rank], outputs.get(rank, "")
    others = [r for r in causes if r != rank]
    if "exc_type" in info:
        hint = info.get("hint") or hint_for(f"{info['exc_type']}: {info['message']}")
        if not causes:
            hint = _consequence_hint(rank, finished, info["message"])
        return RankError(rank, exc_type=info["exc_type"], remote_message=info["message"],
                         traceback=info["traceback"], ranks=list(failures), hint=hint,
                         finished=finished, others=others)
    code, words = info.get("exit_code"), last_words(out)
    tail = "\n".join(out.splitlines()[-20:])
    hint = hint_for(out)
    if not causes:
        hint = _consequence_hint(rank, finished, out)
    elif not hint and code is not None and code < 0 and -code == signal.SIGKILL:
        hint = ("SIGKILL comes from outside the rank: often the out-of-memory killer (host RAM; "
                "see `dmesg`) or a kill command. Its last output is in .traceback.")
    elif not hint and code is not None and code >= 0:
        hint = ("the rank exited without returning (os._exit, or a crash in native code); "
                "every rank must return from the function.")
    elif not hint:
        hint = ("the rank crashed in native code (C++/CUDA); its last output is in .traceback. "
                "Re-run with env={'TORCH_SHOW_CPP_STACKTRACES': '1'} for more.")
    return RankError(rank, exit_code=code, traceback=tail, ranks=list(failures), hint=hint,
                     finished=finished, detail=words, others=others)


def _consequence_hint(rank: int, finished: list[int], text: str) -> str:
    """HINT for a rank that failed only because of the others (lost peer, torch's timeout)."""
    why = (f"ranks {finished} had already returned" if finished else
           "another rank never called it, called a different one, or died")
    if TIMED_OUT.search(text):
        nccl = (" NCCL's watchdog then aborts the process (TORCH_NCCL_ASYNC_ERROR_HANDLING); the "
                "[rank r] lines above name the operation and its sequence number, and "
                "TORCH_NCCL_DUMP_ON_TIMEOUT=1 writes the flight recorder (lab 05).") if "NCCL" in text else ""
        return (f"torch's own process-group timeout expired in rank {rank}: a collective did not "
                f"complete because {why}.{nccl}")
    return (f"rank {rank} lost its connection to the other ranks: {why}. Every rank must call "
            "the same collectives in the same order before returning.")


# What a rank with no user frame on its stack is doing, by the label its bootstrap marks the
# innermost of its own frames with (``_rank.serve_diagnostics(states=...)``: matched by code object).
RANK_STATES = {
    "starting": "still starting: joining the process group (is the timeout long enough?)",
    "returning": ("returned, but copying its result to the CPU waits for GPU work that never "
                  "finishes (a collective the other ranks did not call)"),
    "returned": "returned; waiting for the other ranks",
    "idle": "returned; waiting for the next task",
}


def hang_error(pending: list[int], timeout_s: float, finished: list[int],
               diagnostics: dict[int, dict], then: str = "") -> RankTimeout:
    """Build the ``RankTimeout`` for ranks that did not finish in time.

    Args:
        pending: ranks without a result.
        finished: ranks that had returned.
        diagnostics: ``{rank: {"frames": [(file, line, function), ...], "user_from": i, "state":
            label, "flight": ...}}`` as reported by the live ranks when asked
            (``procs.request_diagnostics``).
        then: what happened next, added to the HINT (the pool: "the pool was restarted ...").
    """
    where, stacks, flight, inside = {}, {}, {}, []
    for r in sorted(set(diagnostics) | set(pending)):
        d = diagnostics.get(r, {})
        frames = d.get("frames") or []
        if not frames:
            where[r] = "did not answer (busy in native code that holds the GIL?)"
            continue
        where[r] = describe_frames(frames, d.get("state", ""))
        frames = frames[min(d.get("user_from", 0), len(frames) - 1):]  # from the call of the user's code
        stacks[r] = "".join(f'  File "{f}", line {n}, in {fn}\n'
                            f"    {linecache.getline(f, n).strip()}\n" for f, n, fn in frames)
        if r in pending and any(_in_distributed(f) for f, _, _ in frames):
            inside.append(r)
        if d.get("flight"):
            flight[r] = d["flight"]
    outside = [r for r in pending if r in where and r not in inside]
    if finished:
        hint = (f"ranks {finished} returned while ranks {sorted(pending)} were still running: "
                "a collective that not every rank calls never returns.")
    elif inside and outside:
        hint = (f"ranks {inside} are waiting inside torch.distributed for ranks {outside}, which "
                "never arrived (see where each rank was, below).")
    elif inside:
        hint = (f"ranks {inside} are all waiting inside torch.distributed: they called different "
                "collectives, in a different order, or with different sizes (see below).")
    else:
        hint = ""
    if then:
        hint = (f"{hint.rstrip('.')}; {then}." if hint else
                f"a collective that not every rank calls never returns; look at the last line each "
                f"rank printed above; {then}.")
    return RankTimeout(pending, timeout_s, hint, finished=finished, where=where, stacks=stacks,
                       flight=flight)


def _in_distributed(filename: str) -> bool:
    return f"{os.sep}torch{os.sep}distributed{os.sep}" in filename


def _is_user_frame(filename: str) -> bool:
    if filename.startswith("<frozen") or filename.startswith(_PKG_DIR + os.sep):
        return False
    return f"{os.sep}site-packages{os.sep}" not in filename and \
        f"{os.sep}lib{os.sep}python3" not in filename


def describe_frames(frames: list[tuple[str, int, str]], state: str = "") -> str:
    """``file:line in function: source`` of the innermost user frame (outermost first input).

    A rank with no user frame is described by ``state``, the label its bootstrap gave the frame it
    was in (``RANK_STATES``): so a rank stuck copying a result off the GPU (NCCL work that never
    finishes) is told apart from one that returned, or one still joining the process group.
    """
    users = [fr for fr in frames if _is_user_frame(fr[0])]
    if not users:
        if state in RANK_STATES:
            return RANK_STATES[state]
        if any("importlib" in f for f, _, _ in frames):
            return "still starting: importing modules (is the timeout long enough?)"
        f, n, fn = frames[-1]
        return f"{f}:{n} in {fn}"
    f, n, fn = users[-1]
    src = linecache.getline(f, n).strip()
    inner = frames[frames.index(users[-1]) + 1:]
    call = " (inside torch.distributed)" if any(_in_distributed(x[0]) for x in inner) else ""
    return f"{f}:{n} in {fn}: {src}{call}" if src else f"{f}:{n} in {fn}{call}"
