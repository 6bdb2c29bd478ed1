"""The code a lab teaches, taken from its notebook source, so tests check exactly what the learner reads.

    from notebook_defs import load_definitions
    nb = load_definitions("09_all_to_all_and_sequence_parallel")
    nb.MoE, nb.ParallelBlock, ...

Every code cell of ``notebooks/src/<stem>.py`` contributes its top-level imports, functions and classes
(nothing else runs: no pools, no measurements). The namespace is a module that is not importable, so
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
        if cell.cell_type != "code":
            continue
        tree = ast.parse(cell.source)
        kept = ast.Module(body=[node for node in tree.body if isinstance(node, _KEEP)], type_ignores=[])
        exec(compile(kept, f"<{stem}>", "exec"), namespace)  # noqa: S102 - our own notebook's source
    return types.SimpleNamespace(**{k: v for k, v in namespace.items() if not k.startswith("__")})
