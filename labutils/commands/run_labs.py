"""``python -m labutils run-labs``: execute every lab notebook headless and print a summary table.

    python -m labutils run-labs                    # all notebooks/NN_*.ipynb, outputs discarded
    python -m labutils run-labs 00 02 --inplace    # selected labs, outputs saved into the notebooks
    python -m labutils run-labs --record           # on the reference GPUs: refresh notebooks/recorded/

Each notebook runs in a fresh kernel (nbclient) with the notebook's folder as working directory;
a failure is reported with the failing cell and does not stop the other labs. Exit status 1 if
any lab failed. Columns: lab, mode (multi-gpu / single-gpu / cpu), status, seconds.
"""
from __future__ import annotations

import os
import re
import sys
import time
import traceback
from pathlib import Path


def notebooks_dir() -> Path:
    """``./notebooks`` if it exists, else the one beside the installed package."""
    here = Path.cwd() / "notebooks"
    return here if here.is_dir() else Path(__file__).resolve().parents[2] / "notebooks"


def find_labs(directory: Path, selected: list[str]) -> list[Path]:
    """Notebooks ``NN_*.ipynb`` in ``directory``, filtered by prefixes/stems in ``selected``.

    Raises:
        FileNotFoundError: a selected lab matches no notebook.
    """
    labs = sorted(p for p in directory.glob("[0-9][0-9]_*.ipynb"))
    if not selected:
        return labs
    chosen = []
    for key in selected:
        hits = [p for p in labs if p.stem == key or p.stem.startswith(f"{key}_") or p.name == key]
        if not hits:
            raise FileNotFoundError(f"no lab matches {key!r} in {directory}. "
                                    f"HINT: one of {', '.join(p.stem for p in labs)}.")
        chosen += [h for h in hits if h not in chosen]
    return chosen


def format_table(rows: list[tuple[str, str, str, float]]) -> str:
    """Render ``(lab, mode, status, seconds)`` rows as a fixed-width table (pure)."""
    head = ("lab", "mode", "status", "seconds")
    cells = [head] + [(lab, mode, status, f"{secs:.1f}") for lab, mode, status, secs in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(4)]
    line = lambda r: "  ".join(str(v).ljust(w) if i < 3 else str(v).rjust(w)  # noqa: E731
                               for i, (v, w) in enumerate(zip(r, widths)))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), sep] + [line(r) for r in cells[1:]])


def execute(path: Path, timeout_s: float, inplace: bool) -> tuple[str, float]:
    """Execute one notebook; returns (status, seconds). Status is 'ok' or 'FAILED: <reason>'."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=timeout_s, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    t0 = time.perf_counter()
    detail = ""
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
    if detail:  # the table keeps one line; the whole story goes to stderr
        print(f"--- {path.stem}: {status}\n{detail}", file=sys.stderr, flush=True)
    secs = time.perf_counter() - t0
    if inplace:
        nbformat.write(nb, path)
    return status, secs


def add_arguments(parser) -> None:
    parser.add_argument("labs", nargs="*", help="lab numbers or stems (default: all)")
    parser.add_argument("--inplace", action="store_true", help="save the outputs into the notebooks")
    parser.add_argument("--record", action="store_true",
                        help="set LABUTILS_RECORD=1: live measurements replace notebooks/recorded/*.json")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per cell (default 900)")
    parser.add_argument("--dir", type=Path, default=None, help="notebooks folder (default ./notebooks)")


def run(args) -> int:
    from tqdm.auto import tqdm
    from ..hw import detect_mode
    directory = args.dir or notebooks_dir()
    labs = find_labs(directory, args.labs)
    if args.record:
        os.environ["LABUTILS_RECORD"] = "1"
    mode = detect_mode()
    rows = []
    for path in tqdm(labs, desc="labs", unit="lab"):
        status, secs = execute(path, args.timeout, args.inplace)
        rows.append((path.stem, mode, status, secs))
        tqdm.write(f"{path.stem}: {status} ({secs:.1f} s)")
    print(format_table(rows))
    return 0 if all(r[2] == "ok" for r in rows) else 1
