"""Build the lab notebooks from their percent-format sources, keeping outputs of unchanged cells.

Sources live in ``notebooks/src/NN_topic.py`` (jupytext "percent" format: ``# %%`` code cells,
``# %% [markdown]`` text cells, tags as ``# %% tags=["nbval-ignore-output"]``, an exercise's nbgrader
cell metadata as ``# %% nbgrader={"solution": true, ...}``, carried into the notebook); the executed
notebooks ``notebooks/NN_topic.ipynb`` are what learners open and what nbval checks.

    python tools/nbsync.py              # rebuild every notebook whose source changed
    python tools/nbsync.py 02_tensor_parallel
    python tools/nbsync.py --check      # exit 1 if a notebook's cells differ from its source

A rebuilt cell loses its output: re-execute the notebook on 2xH200 afterwards (README,
"Contributing"). The notebook's own metadata survives a rebuild: the kernel it opens with
(``kernelspec``: JupyterLab starts ``python3`` without asking), ``language_info``, and the saved
widget state (``widgets``, pruned to the widgets that kept outputs still show), so sliders render
before the notebook is run.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
NB = ROOT / "notebooks"


# What JupyterLab needs to start the kernel without a "Select Kernel" dialog: the kernel's name (its
# display name and language for the kernel picker), and the language for highlighting before a run.
KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}
LANGUAGE_INFO = {"name": "python", "codemirror_mode": {"name": "ipython", "version": 3},
                 "file_extension": ".py", "mimetype": "text/x-python", "nbconvert_exporter": "python",
                 "pygments_lexer": "ipython3"}
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


def _key(cell) -> tuple:
    """What makes a cell the same cell: its type, source, tags and nbgrader metadata (an exercise's
    solution or autograded test cell: ``# %% nbgrader={"grade": true, "grade_id": ..., "points": 2, ...}``
    in the source), so a changed nbgrader cell is rebuilt and ``--check`` sees it."""
    meta = cell.get("metadata", {})
    return (cell.cell_type, cell.source.strip(), tuple(meta.get("tags", [])),
            json.dumps(meta.get("nbgrader", {}), sort_keys=True))


def _cells(nb) -> list[tuple]:
    return [_key(c) for c in nb.cells]


def kernelspec_ok(nb) -> bool:
    """The notebook names the course's kernel, with the display name and language JupyterLab shows."""
    spec = nb.metadata.get("kernelspec", {})
    return spec.get("name") == KERNELSPEC["name"] and all(spec.get(k) for k in KERNELSPEC)


def build(src: Path) -> bool:
    """Write ``notebooks/<stem>.ipynb`` from ``src``; returns True if it changed.

    Outputs of unchanged cells and the notebook's metadata (``language_info``, widget state) are
    kept from the existing notebook; ``kernelspec`` and ``language_info`` are filled in if missing.
    """
    new = jupytext.read(src)
    new.metadata.pop("jupytext", None)
    dst = NB / f"{src.stem}.ipynb"
    old = nbformat.read(dst, as_version=4) if dst.exists() else None
    if old is not None:
        if _cells(old) == _cells(new) and kernelspec_ok(old):
            return False
        _keep_outputs(new, old)
        new.metadata = nbformat.from_dict(_keep_metadata(new, old))
    if not kernelspec_ok(new):  # none, or a foreign kernel: the course's own
        new.metadata["kernelspec"] = dict(KERNELSPEC)
    new.metadata.setdefault("language_info", dict(LANGUAGE_INFO))  # executing replaces it
    nbformat.write(new, dst)
    return True


def _keep_metadata(new, old) -> dict:
    """``old``'s notebook metadata for ``new``: everything but jupytext's, with the widget state
    pruned to the widgets that ``new``'s outputs still show (and the widgets those contain)."""
    meta = {k: v for k, v in old.metadata.items() if k != "jupytext"}
    state = meta.get("widgets", {}).get(WIDGET_STATE, {}).get("state")
    if state is None:
        meta.pop("widgets", None)
        return meta
    todo = [o["data"][WIDGET_VIEW].get("model_id") for c in new.cells if c.cell_type == "code"
            for o in c.get("outputs", []) if WIDGET_VIEW in o.get("data", {})]
    keep: set = set()
    while todo:  # a widget's state names its children as "IPY_MODEL_<id>"
        mid = todo.pop()
        if mid in state and mid not in keep:
            keep.add(mid)
            todo += re.findall(r"IPY_MODEL_([0-9a-f]+)", json.dumps(state[mid]))
    if keep:
        meta["widgets"][WIDGET_STATE]["state"] = {k: v for k, v in state.items() if k in keep}
    else:
        meta.pop("widgets")
    return meta


def _keep_outputs(new, old) -> None:
    """Give each unchanged code cell of ``new`` the outputs it had in ``old`` (matched in order by
    source and tags), so editing one cell does not wipe the notebook's executed outputs."""
    pool = [c for c in old.cells if c.cell_type == "code"]
    for cell in new.cells:
        if cell.cell_type != "code":
            continue
        for k, prev in enumerate(pool):
            if _key(prev) == _key(cell):
                cell.outputs, cell.execution_count = prev.outputs, prev.execution_count
                del pool[: k + 1]
                break


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="notebook stems (default: all)")
    ap.add_argument("--check", action="store_true", help="only verify that notebooks match sources")
    args = ap.parse_args(argv)
    srcs = sorted(SRC.glob("*.py"))
    if args.names:
        srcs = [s for s in srcs if s.stem in args.names]
    bad = 0
    for src in srcs:
        dst = NB / f"{src.stem}.ipynb"
        if args.check:
            nb = nbformat.read(dst, as_version=4) if dst.exists() else None
            if nb is None or _cells(nb) != _cells(jupytext.read(src)):
                print(f"out of sync: {dst.relative_to(ROOT)} vs {src.relative_to(ROOT)}")
                bad += 1
            elif not kernelspec_ok(nb):
                print(f"no kernelspec {KERNELSPEC['name']!r} in {dst.relative_to(ROOT)} (JupyterLab would "
                      f"ask for a kernel): python tools/nbsync.py {src.stem}")
                bad += 1
        elif build(src):
            print(f"rebuilt {dst.relative_to(ROOT)} (changed cells have no outputs: re-execute on GPUs)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
