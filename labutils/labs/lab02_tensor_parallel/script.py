"""Run a program exactly as a tutorial wrote it: its own file, its own ``python`` process, its own launcher.

A program that starts its ranks with ``torch.multiprocessing.spawn`` cannot run inside a notebook:
``spawn`` starts fresh interpreters that import ``__main__`` to find the function, and a notebook's
``__main__`` is not a file. So the program is written to a temporary folder and run as a script, with
a timeout, its output captured::

    from labutils.labs.lab02_tensor_parallel import script
    out = script.run_program(SOURCE_PROGRAM, timeout_s=120)
    out["returncode"], out["exc_type"], out["message"], out["output_tail"]

Paths in the captured output are shortened (the temporary folder becomes ``<tmp>``, an installed
package's path starts at the package), so a recording names no machine's folders.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ...procs import kill_tree

# "RuntimeError: message", "torch.distributed.DistNetworkError: message": the line a traceback ends with
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.*)$")


def last_exception(text: str) -> tuple[str | None, str | None]:
    """``(type, message)`` of the last exception line of a traceback in ``text`` (the innermost one a
    launcher re-raised last), or ``(None, None)`` when there is none. The type is the bare class name."""
    for line in reversed(text.splitlines()):
        m = _EXCEPTION_LINE.match(line.strip())
        if m:
            return m.group(1).rsplit(".", 1)[-1], m.group(2).strip()
    return None, None


def shorten_paths(text: str, folder: str) -> str:
    """``folder`` -> ``<tmp>``; ``.../site-packages/torch/x.py`` -> ``torch/x.py``."""
    text = text.replace(folder, "<tmp>")
    return re.sub(r'File "[^"]*?[/\\](?:site|dist)-packages[/\\]', 'File "', text)


def run_program(source: str, *, timeout_s: float = 120.0, tail_lines: int = 25,
                filename: str = "program.py") -> dict:
    """Write ``source`` to a temporary folder and run ``python <file>`` there (this interpreter, this
    environment), at most ``timeout_s`` seconds.

    Returns:
        ``{"raised": bool (exit code != 0 or timed out), "returncode": int | None (None: killed at the
        timeout), "timed_out": bool, "seconds": float, "exc_type": str | None, "message": str | None,
        "printed_lines": int (lines on stdout), "output_tail": str (last ``tail_lines`` lines of
        stderr, else stdout)}``.

    Raises:
        ValueError: ``timeout_s`` is not positive.
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}. HINT: a program as written may hang; "
                         "give it a bounded time, e.g. 120.")
    with tempfile.TemporaryDirectory(prefix="labutils-program-") as folder:
        path = Path(folder) / filename
        path.write_text(source)
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        start = time.perf_counter()
        proc = subprocess.Popen([sys.executable, str(path)], cwd=folder, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", start_new_session=True)
        try:
            stdout, stderr = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:  # the program's own children (mp.spawn's ranks) go with it, in every case
            kill_tree([proc])
        if timed_out:
            stdout, stderr = proc.communicate()
        returncode = None if timed_out else proc.returncode
        seconds = time.perf_counter() - start
        stdout, stderr = shorten_paths(stdout, folder), shorten_paths(stderr, folder)
    exc_type, message = last_exception(stderr)
    shown = stderr if stderr.strip() else stdout
    return {"raised": timed_out or returncode != 0, "returncode": returncode, "timed_out": timed_out,
            "seconds": seconds, "exc_type": exc_type, "message": message,
            "printed_lines": len(stdout.splitlines()),
            "output_tail": "\n".join(shown.splitlines()[-tail_lines:])}
