"""The code a lab teaches, taken from its notebook source, so tests check exactly what the learner reads.

    from notebook_defs import load_definitions
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

import jupytext

ROOT = Path(__file__).resolve().parent.parent
_KEEP = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)


def load_definitions(stem: str) -> types.SimpleNamespace:
    """Execute the imports, ``def``s and ``class``es of every code cell of the notebook source ``stem``."""
    nb = jupytext.read(ROOT / "notebooks" / "src" / f"{stem}.py")
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
    nb = jupytext.read(ROOT / "notebooks" / "src" / f"{stem}.py")
    for cell in nb.cells:
        if cell.cell_type == "code" and cell.source.lstrip().startswith(f"%%{magic}"):
            return cell.source.lstrip().split("\n", 1)[1]
    raise LookupError(f"no %%{magic} cell in notebooks/src/{stem}.py")
