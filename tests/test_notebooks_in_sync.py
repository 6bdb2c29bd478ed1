"""Every notebook's cells match its percent-format source (tools/nbsync.py), and carries the course's
structure: a numbered title, a hardware setup cell whose output is ignored, and checked cells."""
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_sources_and_notebooks_agree():
    r = subprocess.run([sys.executable, "tools/nbsync.py", "--check"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_structure(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith(f"# {path.stem[:2]} · ")
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "nbval-ignore-output" in code[0].metadata.get("tags", []), "the setup cell's output is hardware"
    checked = [c for c in code if not {"nbval-ignore-output", "nbval-skip"} & set(c.metadata.get("tags", []))
               and c.get("outputs")]
    assert len(checked) >= 2, "each notebook keeps checked cells that prove correctness"
