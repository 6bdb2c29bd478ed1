"""Build the lab notebooks from their percent-format sources, keeping outputs of unchanged cells.

Sources live in ``notebooks/src/NN_topic.py`` (jupytext "percent" format: ``# %%`` code cells,
``# %% [markdown]`` text cells, tags as ``# %% tags=["nbval-ignore-output"]``); the executed
notebooks ``notebooks/NN_topic.ipynb`` are what learners open and what nbval checks.

    python tools/nbsync.py              # rebuild every notebook whose source changed
    python tools/nbsync.py 02_tensor_parallel
    python tools/nbsync.py --check      # exit 1 if a notebook's cells differ from its source

A rebuilt cell loses its output: re-execute the notebook on 2xH200 afterwards (README,
"Contributing").
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "notebooks" / "src"
NB = ROOT / "notebooks"


def _cells(nb) -> list[tuple[str, str, tuple]]:
    return [(c.cell_type, c.source.strip(), tuple(c.get("metadata", {}).get("tags", []))) for c in nb.cells]


def build(src: Path) -> bool:
    """Write ``notebooks/<stem>.ipynb`` from ``src``; returns True if it changed."""
    new = jupytext.read(src)
    new.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    new.metadata.pop("jupytext", None)
    dst = NB / f"{src.stem}.ipynb"
    if dst.exists():
        old = nbformat.read(dst, as_version=4)
        if _cells(old) == _cells(new):
            return False
        _keep_outputs(new, old)
    nbformat.write(new, dst)
    return True


def _keep_outputs(new, old) -> None:
    """Give each unchanged code cell of ``new`` the outputs it had in ``old`` (matched in order by
    source and tags), so editing one cell does not wipe the notebook's executed outputs."""
    pool = [c for c in old.cells if c.cell_type == "code"]
    for cell in new.cells:
        if cell.cell_type != "code":
            continue
        key = (cell.source.strip(), tuple(cell.metadata.get("tags", [])))
        for k, prev in enumerate(pool):
            if (prev.source.strip(), tuple(prev.metadata.get("tags", []))) == key:
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
            if not dst.exists() or _cells(nbformat.read(dst, as_version=4)) != _cells(jupytext.read(src)):
                print(f"out of sync: {dst.relative_to(ROOT)} vs {src.relative_to(ROOT)}")
                bad += 1
        elif build(src):
            print(f"rebuilt {dst.relative_to(ROOT)} (changed cells have no outputs: re-execute on GPUs)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
