"""The code a lab teaches, taken from its notebook source (``notebooks/src/<stem>.py``), so that tests and
recording scripts run exactly what the learner reads -- the lesson's code exists once, in the notebook.

    from labutils.notebook_source import load_definitions
    nb = load_definitions("09_all_to_all_and_sequence_parallel")
    nb.MoE, nb.ParallelBlock, ...

Every code cell of ``notebooks/src/<stem>.py`` contributes its top-level imports, functions and classes
(nothing else runs: no pools, no measurements); a cell that starts with an IPython cell magic (``%%writefile``:
not Python for this kernel) contributes nothing -- ``cell_magic_body`` returns its text. The namespace is a module that is not importable, so
cloudpickle sends its functions and classes to rank processes by value, as it does for a notebook's.
"""
from __future__ import annotations

import ast
import types
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent  # the repository: notebooks/src/ beside labutils/
_KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)


def source_path(stem: str) -> Path:
    """``notebooks/src/<stem>.py``; a clear error when this checkout has no such notebook source."""
    path = ROOT / "notebooks" / "src" / f"{stem}.py"
    if not path.is_file():
        known = sorted(p.stem for p in path.parent.glob("*.py"))
        raise FileNotFoundError(f"no notebook source {path.name} in {path.parent}. HINT: the stem is one of "
                                f"{', '.join(known) or '(none: run from a checkout of the course)'}")
    return path


def _read(stem: str):
    try:
        import jupytext  # the notebook sources' own format (percent cells); a course requirement
    except ImportError as exc:
        raise ImportError("reading a notebook source needs jupytext. HINT: pip install -r requirements.txt "
                          "(or pip install 'jupytext>=1.16')") from exc
    return jupytext.read(source_path(stem))


def load_definitions(stem: str) -> types.SimpleNamespace:
    """Execute the imports, ``def``s and ``class``es of every code cell of the notebook source ``stem``."""
    nb = _read(stem)
    namespace: dict = {"__name__": f"notebook_{stem}"}
    for cell in nb.cells:
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
            continue
        tree = ast.parse(cell.source)
        kept = ast.Module(body=[node for node in tree.body if isinstance(node, _KEEP)], type_ignores=[])
        exec(compile(kept, f"<{stem}>", "exec"), namespace)  # noqa: S102 - our own notebook's source
    return types.SimpleNamespace(**{k: v for k, v in namespace.items() if not k.startswith("__")})


def cell_magic_body(stem: str, magic: str) -> str:
    """The body (the lines after the magic's own line) of the first cell of ``notebooks/src/<stem>.py`` that
    starts with the cell magic ``%%<magic>``, e.g. the script a ``%%writefile`` cell writes.

    Raises:
        LookupError: no such cell.
    """
    nb = _read(stem)
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith(f"%%{magic}"):
            return cell.source.lstrip().split("\n", 1)[1]
    raise LookupError(f"no %%{magic} cell in notebooks/src/{stem}.py")
