"""Run a standalone reproducer the way ``torchrun`` would, several variants at once, and classify each run.

A reproducer is a plain script (no labutils inside) that reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``, prints its steps, and ends each rank with a line containing
``COMPLETED`` or ``HANG`` (anything else -- a signal, a traceback, a non-zero exit -- is a crash)::

    from labutils.labs.lab03_async_p2p import repro
    runs = repro.start("exchange.py", {"as written": ("as_written", {}),
                                       "NCCL_CUMEM_ENABLE=0": ("as_written", {"NCCL_CUMEM_ENABLE": "0"})})
    ...                                   # the processes start up in the background meanwhile
    result = runs.wait()                  # {"variants": {name: {"status", "evidence", ...}}, ...}

Every variant gets its own processes (one per rank, each in its own session) and its own rendezvous port,
so the variants run concurrently and one that crashes or hangs cannot touch another -- nor the notebook's
own ranks. ``wait`` kills whatever is still running at the timeout (a host blocked in a CUDA call) and
leaves no process behind, also on Ctrl-C. ``classify`` (pure) turns what the processes left into a verdict.
"""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

from ...procs import free_loopback_port, kill_tree, torchrun_env

COMPLETED, HANG, CRASH = "COMPLETED", "HANG", "CRASH"
NOT_RECORDED = "NOT RECORDED"  # a placeholder recording: no GPU run yet (LABUTILS_RECORD=1 on 2 GPUs makes one)
# lines that say what went wrong, most telling first: CUDA's error, NCCL's own warning, a Python exception
_ERROR_PATTERNS = (r"illegal memory access", r"NCCL WARN", r"\w+Error\b.*", r"[Ee]rror", r"[Aa]bort")
# NCCL's own log lines ("NCCL version ...", "host:pid:tid [dev] file:line NCCL WARN ..."): NCCL writes them to
# standard output unless NCCL_DEBUG_FILE says otherwise, among the script's steps
_NCCL_LINE = re.compile(r"\bNCCL (?:WARN|INFO|TRACE|version)\b")


def _note_exit(proc: subprocess.Popen, ended_at: dict) -> None:
    """Wait for ``proc`` (in a thread) and note when it exited."""
    proc.wait()
    ended_at[proc.pid] = time.monotonic()


def _kill(procs: list, files: list) -> None:  # weakref.finalize: must not refer to the Runs object
    kill_tree(procs)
    for f in files:
        f.close()


class Runs:
    """Variants started by ``start``; ``wait()`` collects them (once)."""

    def __init__(self, script: str, variants: dict, world_size: int, timeout_s: float, env: dict):
        self.script, self.world_size, self.timeout_s = str(script), world_size, float(timeout_s)
        self.variants = {name: (arg, dict(extra)) for name, (arg, extra) in variants.items()}
        self._dir = Path(tempfile.mkdtemp(prefix="labutils-repro-"))
        self._procs: dict[str, list] = {}
        self._started_at: dict[str, float] = {}     # each variant's own start, for its own elapsed_s
        self._ended_at: dict[int, float] = {}       # pid -> when it exited, written by the watcher threads
        self._all: list = []
        self._files: list = []
        self._result: dict | None = None
        self._finalizer = weakref.finalize(self, _kill, self._all, self._files)
        self.started_at = time.monotonic()
        try:
            for k, (name, (arg, extra)) in enumerate(self.variants.items()):
                port, self._procs[name] = free_loopback_port(), []
                self._started_at[name] = time.monotonic()
                for r in range(world_size):
                    paths = (self._dir / f"{k}-{r}.out", self._dir / f"{k}-{r}.err")
                    self._files += [open(path, "wb") for path in paths]
                    p = subprocess.Popen([sys.executable, self.script, arg],
                                         env=torchrun_env(r, world_size, port, {**env, **extra}),
                                         stdin=subprocess.DEVNULL, stdout=self._files[-2], stderr=self._files[-1],
                                         start_new_session=True, close_fds=True)
                    self._procs[name].append((p, paths))
                    self._all.append(p)
                    # a run's end is seen when it happens, not when wait() is called (maybe much later)
                    threading.Thread(target=_note_exit, args=(p, self._ended_at), daemon=True).start()
        except BaseException:
            self._finalizer()
            shutil.rmtree(self._dir, ignore_errors=True)
            raise

    def wait(self) -> dict:
        """Wait until every process has ended or ``timeout_s`` (from ``start``) has passed; kill the rest.

        Returns:
            ``{"world_size", "timeout_s", "variants": {name: {"arg", "env", "elapsed_s",
            **classify(...)}}}`` (JSON types, recordable); the same dict on a second call.
        """
        if self._result is not None:
            return self._result
        deadline = self.started_at + self.timeout_s
        ended = self._ended_at
        try:
            while len(ended) < len(self._all) and time.monotonic() < deadline:
                time.sleep(0.05)
            killed = {name: [p.pid not in ended and p.returncode is None for p, _ in procs] for name, procs in self._procs.items()}
        finally:
            self._finalizer()  # kills what is left, reaps every process, closes the files
        try:
            out = {}
            for name, procs in self._procs.items():
                ranks = [{"rc": p.returncode, "killed": hung, "stdout": paths[0].read_text(errors="replace"),
                          "stderr": paths[1].read_text(errors="replace")}
                         for (p, paths), hung in zip(procs, killed[name])]
                arg, extra = self.variants[name]
                # from this variant's first Popen to the exit of its last rank (a killed rank: its kill)
                last = max(ended.get(p.pid, time.monotonic()) for p, _ in procs)
                out[name] = {"arg": arg, "env": extra, "elapsed_s": round(last - self._started_at[name], 1),
                             **classify(ranks, self.timeout_s)}
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._result = {"world_size": self.world_size, "timeout_s": self.timeout_s, "variants": out}
        return self._result


def start(script, variants: dict, *, world_size: int = 2, timeout_s: float = 60.0,
          env: dict | None = None) -> Runs:
    """Start every variant of ``script`` now, ``world_size`` processes each; returns at once.

    Args:
        script: path of the reproducer.
        variants: ``{name: (argument, extra environment)}``; the argument is the script's ``sys.argv[1]``.
        timeout_s: from now until ``wait`` kills what is still running (only a rank whose host is
            blocked should ever reach it: the script itself reports a hang).
        env: extra environment for every variant (e.g. ``{"NCCL_DEBUG": "WARN"}``).

    Raises:
        ValueError: no variants, a world size below 2, or a timeout that is not positive.
        FileNotFoundError: no such script.
    """
    if not variants:
        raise ValueError("no variants to run. HINT: pass {name: (argument, {ENV: value})}.")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int >= 2 (a point-to-point exchange needs a peer), got {world_size!r}.")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}.")
    if not Path(script).is_file():
        raise FileNotFoundError(f"no reproducer at {script}. HINT: run the cell that writes it first.")
    return Runs(script, variants, world_size, timeout_s, dict(env or {}))


def _signal_name(rc) -> str:
    try:
        return signal.Signals(-rc).name
    except (ValueError, TypeError):
        return f"signal {-rc}"


def clip(line: str, start: int = 0, stop: int | None = None) -> str:
    """``line[start:stop]`` widened or narrowed to whole words, with "…" where text was left out.

    The start moves forward to the beginning of a word and the end back to the end of one, so no word
    is cut; a slice with no whole word in it keeps the words it touches."""
    line = line.strip()
    stop = len(line) if stop is None else min(stop, len(line))
    start = max(0, start)
    if start >= stop:
        return ""
    if start > 0 and not line[start - 1].isspace():
        nxt = line.find(" ", start)
        start = nxt + 1 if 0 <= nxt < stop else line.rfind(" ", 0, start) + 1
    if stop < len(line) and not line[stop].isspace():
        prev = line.rfind(" ", start, stop)
        stop = prev if prev > start else (line.find(" ", stop) if line.find(" ", stop) >= 0 else len(line))
    return ("… " if start > 0 else "") + line[start:stop].strip() + (" …" if stop < len(line) else "")


def _error_line(text: str) -> str:
    """The most telling line of a crashed rank's output (see ``_ERROR_PATTERNS``), shortened at words."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for pattern in _ERROR_PATTERNS:
        for ln in lines:
            m = re.search(pattern, ln)
            if m:
                return clip(ln, m.start() - 60, m.start() + 160)
    return clip(lines[-1], 0, 200) if lines else ""


def _nccl_warning(text: str) -> str:
    """NCCL's first ``NCCL WARN`` line in ``text`` (from the words "NCCL WARN" on), shortened at words."""
    line = next((ln for ln in text.splitlines() if "NCCL WARN" in ln), "")
    return clip(line[line.find("NCCL WARN"):], 0, 200) if line else ""


def _steps(stdout: str) -> list[str]:
    """What the script printed, one step a line, without its "rank N:" prefix and without NCCL's own lines."""
    return [ln.split(":", 1)[1].strip() if ln.startswith("rank ") and ":" in ln else ln.strip()
            for ln in stdout.splitlines() if ln.strip() and not _NCCL_LINE.search(ln)]


def classify(ranks: list[dict], timeout_s: float) -> dict:
    """What happened to one variant, from each rank's ``{"rc", "killed", "stdout", "stderr"}``.

    A rank COMPLETED if it printed a COMPLETED line and exited 0; it HANG if it printed a HANG line (its
    host was free to see that the GPU never finished) or was still running at the timeout (its host was
    blocked); anything else is a CRASH. The variant is a CRASH if any rank crashed (a crash comes first:
    its peer is then left waiting), else a HANG if any rank hung, else COMPLETED.

    Returns:
        ``{"status", "evidence", "nccl_warning", "ranks": [{"outcome", "steps", "rc"}]}``; ``evidence`` is
        the line that decides the status, ``nccl_warning`` NCCL's first ``NCCL WARN`` line, from the first
        rank that printed one on standard output (NCCL's default) or standard error ('' if none did);
        ``steps`` are the script's own lines (NCCL's are left out).
    """
    per_rank, evidence = [], {CRASH: "", HANG: "", COMPLETED: ""}
    warning = ""
    for r, info in enumerate(ranks):
        steps = _steps(info.get("stdout", ""))
        text = info.get("stdout", "") + "\n" + info.get("stderr", "")
        warning = warning or _nccl_warning(text)  # stdout first: where NCCL writes by default
        rc, hung_line = info.get("rc"), next((s for s in steps if s.startswith(HANG)), "")
        if rc == 0 and any(s.startswith(COMPLETED) for s in steps):
            outcome, why = COMPLETED, f"rank {r}: {steps[-1]}"
        elif hung_line:
            outcome, why = HANG, f"rank {r}: {hung_line}"
        elif info.get("killed"):
            last = steps[-1] if steps else "before its first step"
            outcome, why = HANG, f"rank {r}: still running at the {timeout_s:g} s timeout (host blocked) after: {last}"
        else:
            ended = f"killed by {_signal_name(rc)}" if rc is not None and rc < 0 else f"exit code {rc}"
            outcome, why = CRASH, f"rank {r} ({ended}): {_error_line(text)}"
        evidence[outcome] = evidence[outcome] or why
        per_rank.append({"outcome": outcome, "steps": steps, "rc": rc})
    outcomes = {p["outcome"] for p in per_rank}
    status = CRASH if CRASH in outcomes else HANG if HANG in outcomes else COMPLETED
    return {"status": status, "evidence": evidence[status], "nccl_warning": warning, "ranks": per_rank}


def table(result: dict):
    """``wait()``'s result (live or recorded) as a DataFrame: one row per variant -- its outcome, the line
    that decided it, NCCL's first own warning, how far rank 0 got, and the seconds from the variant's start
    to the end of its last rank."""
    import pandas as pd
    rows = {name: {"outcome": v["status"], "evidence": v["evidence"], "NCCL WARN": v.get("nccl_warning", ""),
                   "rank 0's steps": " -> ".join(v["ranks"][0]["steps"]) if v.get("ranks") else "",
                   "seconds": v.get("elapsed_s")}
            for name, v in result["variants"].items()}
    return pd.DataFrame.from_dict(rows, orient="index")


def leftover_processes(script) -> list:
    """Processes below this one still running ``script`` (``[]`` once ``wait`` has returned)."""
    import psutil
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if str(script) in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            pass
    return found
