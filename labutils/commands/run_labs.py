"""``python -m labutils run-labs``: execute every lab notebook headless and print a summary table.

    python -m labutils run-labs                    # all notebooks/NN_*.ipynb, outputs discarded
    python -m labutils run-labs 0 7 setup          # selected labs: number, topic or file name
    python -m labutils run-labs 00 02 --inplace    # outputs (and widget state) saved into the notebooks
    python -m labutils run-labs --record           # on the reference GPUs: refresh notebooks/recorded/
    python -m labutils run-labs --summary course.txt   # the table, total and fingerprint to a file

Each notebook runs in a fresh kernel (nbclient) with the notebook's folder as working directory;
the kernel talks to this process over Unix sockets (ZeroMQ's ``ipc`` transport) where the platform
has them, so no TCP port is opened for it. The next lab's kernel is started while a lab runs (it is
idle until its lab begins; ``--no-prestart`` starts each with its lab). A failure is reported with the
failing cell and does not stop the other labs. Exit status 1 if any lab failed, 2 if a selected lab
does not exist. Columns: lab, mode (multi-gpu / single-gpu / cpu), status, seconds (from the lab's
first request to its kernel's shutdown).
"""
from __future__ import annotations

import datetime
import os
import re
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import seconds


class UnknownLab(LookupError):
    """A lab given on the command line matches no notebook (the message lists the labs)."""


def notebooks_dir() -> Path:
    """``./notebooks`` if it exists, else the one beside the installed package."""
    here = Path.cwd() / "notebooks"
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "notebooks"


def _matches(key: str, labs: list[Path]) -> list[Path]:
    """Labs that ``key`` names: a number (``7``, ``07``), a stem (``00_setup``, also with ``.ipynb``
    or a folder in front), a topic (``setup``), or the start of exactly one topic (``cuda``).

    Raises:
        UnknownLab: ``key`` starts several topics.
    """
    key = Path(key).name.removesuffix(".ipynb")
    if key.isdigit():
        return [p for p in labs if int(p.stem[:2]) == int(key)]
    exact = [p for p in labs if key in (p.stem, p.stem[3:])]
    if exact:
        return exact
    prefixed = [p for p in labs if p.stem[3:].startswith(key)] if key else []
    if len(prefixed) > 1:
        raise UnknownLab(f"{key!r} could be any of {', '.join(p.stem for p in prefixed)}. "
                         "HINT: give more of the name, or the number.")
    return prefixed


def find_labs(directory: Path, selected: list[str]) -> list[Path]:
    """Notebooks ``NN_*.ipynb`` in ``directory``, in the order ``selected`` names them (all if empty).

    Raises:
        UnknownLab: there is no lab notebook in ``directory``, or a selected lab matches none.
    """
    labs = sorted(directory.glob("[0-9][0-9]_*.ipynb"))
    if not labs:
        raise UnknownLab(f"no lab notebooks (NN_topic.ipynb) in {directory}. "
                         "HINT: run from the course folder, or pass --dir NOTEBOOKS_FOLDER.")
    if not selected:
        return labs
    chosen = []
    for key in selected:
        hits = _matches(key, labs)
        if not hits:
            raise UnknownLab(f"no lab {key!r}. Labs: {', '.join(p.stem for p in labs)}. "
                             "HINT: give a number such as 7, a topic such as setup, or a file name.")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def format_table(rows: list[tuple[str, str, str, float]]) -> str:
    """Render ``(lab, mode, status, seconds)`` rows as a fixed-width table with a total line (pure)."""
    import pandas as pd
    head = ["lab", "mode", "status", "seconds"]
    total = ("total", "", f"{sum(r[2] == 'ok' for r in rows)}/{len(rows)} ok", sum(r[3] for r in rows))
    df = pd.DataFrame([*rows, total], columns=head)
    df["seconds"] = df["seconds"].map("{:.1f}".format)
    for col in head:  # words read from the left, numbers from the right
        width = max(len(col), int(df[col].str.len().max()))
        df[col] = df[col].str.rjust(width) if col == "seconds" else df[col].str.ljust(width)
    header, *body = [line.rstrip() for line in df.to_string(index=False, justify="left",
                                                                          max_colwidth=None).splitlines()]
    sep = " ".join("-" * len(v) for v in df.iloc[0])
    return "\n".join([header, sep, *body[:-1], sep, body[-1]])


def conditions(prestart: bool, environ=os.environ) -> str:
    """How the seconds were counted, for the summary (pure): kernels started ahead or not, and whether
    Python's bytecode was cached in a folder of its own (``PYTHONPYCACHEPREFIX``: for an installation that
    ships no ``.pyc`` files, where every interpreter would otherwise compile torch's modules again)."""
    kernels = ("each lab's kernel started while the lab before it ran" if prestart
               else "each lab's kernel started with the lab")
    cache = environ.get("PYTHONPYCACHEPREFIX")
    bytecode = f"bytecode cached in PYTHONPYCACHEPREFIX={cache}" if cache else "bytecode as installed"
    return f"conditions: {kernels}; {bytecode}"


def summary_text(table: str, fingerprint: str, when: datetime.datetime, args_line: str, wall_s: float,
                 conditions_line: str = "") -> str:
    """The text ``--summary`` writes: what ran, where, when, how, the table, and the wall time (pure)."""
    return (f"python -m labutils {args_line}\n"
            f"machine: {fingerprint}\n"
            f"date: {when.isoformat(timespec='seconds')}\n"
            + (f"{conditions_line}\n" if conditions_line else "")
            + f"\n{table}\n\n"
            f"wall time of run-labs: {wall_s:.1f} s (the labs plus run-labs' own set-up)\n")


def kernel_config(sockets_dir: str):
    """nbclient configuration for a kernel that listens on Unix sockets in ``sockets_dir`` (no TCP
    port, so ipykernel has no plain-text TCP traffic to warn about); TCP where ZeroMQ has no ``ipc``."""
    import zmq
    from traitlets.config import Config
    if not zmq.has("ipc"):
        return Config()
    return Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(sockets_dir, "kernel")}})


class Kernel:
    """A ``python3`` kernel for one notebook, started when constructed -- ahead of its notebook with
    ``--prestart``, so that it boots (interpreter, ipykernel) while the lab before it runs. Its Unix sockets
    live in a folder of its own."""

    def __init__(self, cwd: Path):
        from jupyter_client.manager import AsyncKernelManager
        from jupyter_core.utils import run_sync
        self._sockets = tempfile.TemporaryDirectory(prefix="labutils-kernel-")
        self.km = AsyncKernelManager(kernel_name="python3", config=kernel_config(self._sockets.name))
        # as nbclient starts its own kernels: an in-memory IPython history, the notebook's folder as cwd
        run_sync(self.km.start_kernel)(cwd=str(cwd), extra_arguments=["--HistoryManager.hist_file=:memory:"])

    def shutdown(self) -> None:
        """Ask the kernel to exit (its atexit handlers stop any ranks it started), then remove its sockets."""
        from jupyter_core.utils import run_sync
        try:
            if run_sync(self.km.is_alive)():
                run_sync(self.km.shutdown_kernel)(now=False)
        finally:
            self._sockets.cleanup()


def execute(path: Path, timeout_s: float, inplace: bool, kernel: Kernel | None = None) -> tuple[str, float]:
    """Execute one notebook; returns (status, seconds). Status is 'ok' or 'FAILED: <reason>'.

    ``kernel``: one started ahead for this notebook; without it, one is started now. Either is shut down
    here when the notebook is done. With ``inplace`` the notebook is written back with its outputs and with
    the state of its widgets (``metadata.widgets``), so that saved sliders render before anyone runs it.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
    nb = nbformat.read(path, as_version=4)
    t0 = time.perf_counter()
    detail = ""
    kernel = kernel or Kernel(path.parent)
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3", km=kernel.km,
                            store_widget_state=True, resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
        status = "ok"
    except CellTimeoutError as exc:
        status = f"FAILED: cell timed out after {timeout_s:g} s ({str(exc).splitlines()[0][:80]})"
        detail = str(exc)
    except CellExecutionError as exc:
        detail = re.sub(r"\x1b\[[0-9;]*m", "", str(exc))  # tracebacks come coloured
        last = [ln for ln in detail.splitlines() if ln.strip()][-1:]
        status = f"FAILED: {last[0][:120] if last else 'cell error'}"
    except Exception as exc:  # noqa: BLE001 - kernel died, etc.
        status = f"FAILED: {type(exc).__name__}: {exc}"[:140]
        detail = traceback.format_exc()
    finally:  # nbclient leaves running a kernel it did not start
        if client.kc is not None:
            client.kc.stop_channels()
        kernel.shutdown()
    if status != "ok":
        client.set_widgets_metadata()  # execute() does it only when every cell ran
    if detail:  # the table keeps one line; the whole story goes to stderr
        print(f"--- {path.stem}: {status}\n{detail}", file=sys.stderr, flush=True)
    secs = time.perf_counter() - t0
    if inplace:
        nbformat.write(nb, path)
    return status, secs


def add_arguments(parser) -> None:
    parser.add_argument("labs", nargs="*",
                        help="labs to run: number (7 or 07), topic (setup) or file (00_setup.ipynb); default all")
    parser.add_argument("--inplace", action="store_true",
                        help="save the outputs and widget state into the notebooks")
    parser.add_argument("--record", action="store_true",
                        help="set LABUTILS_RECORD=1: live measurements replace notebooks/recorded/*.json")
    parser.add_argument("--timeout", type=seconds, default=900.0, help="seconds per cell (default 900)")
    parser.add_argument("--dir", type=Path, default=None, help="notebooks folder (default ./notebooks)")
    parser.add_argument("--no-prestart", dest="prestart", action="store_false",
                        help="start each lab's kernel when the lab starts (default: while the lab before runs)")
    parser.add_argument("--summary", type=Path, default=None, metavar="FILE",
                        help="also write the table, the total, the machine's fingerprint and the date to FILE")


def run(args) -> int:
    t0 = time.perf_counter()
    from tqdm.auto import tqdm
    from ..hw import describe, detect_mode
    directory = args.dir or notebooks_dir()
    try:
        labs = find_labs(directory, args.labs)
    except UnknownLab as exc:
        print(f"python -m labutils run-labs: {exc}", file=sys.stderr)
        return 2
    if args.record:
        os.environ["LABUTILS_RECORD"] = "1"
    mode = detect_mode()
    rows = []
    ahead: Kernel | None = None
    try:
        # disable=None: a bar only on a terminal, never in a log or a pipe
        for i, path in enumerate(tqdm(labs, desc="labs", unit="lab", disable=None)):
            kernel, ahead = ahead, None
            if args.prestart and i + 1 < len(labs):  # the next lab's kernel boots while this one runs
                ahead = Kernel(labs[i + 1].parent)
            status, secs = execute(path, args.timeout, args.inplace, kernel)
            rows.append((path.stem, mode, status, secs))
            tqdm.write(f"{path.stem}: {status} ({secs:.1f} s)")
    finally:
        if ahead is not None:  # interrupted: the kernel started for a lab that will not run
            ahead.shutdown()
    table = format_table(rows)
    wall_s = time.perf_counter() - t0
    print(f"{table}\nwall time: {wall_s:.1f} s")
    if args.summary is not None:
        argv = " ".join(["run-labs", *args.labs, *(["--record"] if args.record else []),
                         *([] if args.prestart else ["--no-prestart"])])
        args.summary.parent.mkdir(parents=True, exist_ok=True)
        fingerprint = describe(peer_access=False).fingerprint()
        args.summary.write_text(summary_text(table, fingerprint,
                                             datetime.datetime.now(datetime.timezone.utc), argv, wall_s,
                                             conditions(args.prestart)))
        print(f"summary written to {args.summary}")
    return 0 if all(r[2] == "ok" for r in rows) else 1
