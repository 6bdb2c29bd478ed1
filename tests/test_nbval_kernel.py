"""nbval with a kernel that dies at start-up (notebooks/conftest.py): retried once, else one clear failure.

A sitecustomize on the kernel's PYTHONPATH makes the first N kernels exit before they answer; pytest runs
in a subprocess on a three-cell notebook with the project's hook copied beside it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
DIE_FIRST = """
import os, sys
if "ipykernel" in " ".join(getattr(sys, "orig_argv", sys.argv)):
    counter = os.environ["KERNEL_STARTS"]
    with open(counter, "a") as f:
        f.write("x")
    if os.path.getsize(counter) <= int(os.environ["KERNELS_THAT_DIE"]):
        os._exit(3)
"""


def _run(tmp_path: Path, die: int) -> tuple[subprocess.CompletedProcess, int]:
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(DIE_FIRST)
    shutil.copy(ROOT / "notebooks" / "conftest.py", tmp_path / "conftest.py")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src, outputs=[]) for src in ("x = 2", "y = x * 3", "z = y")]
    nbformat.write(nb, tmp_path / "lab.ipynb")
    env = {**os.environ, "KERNEL_STARTS": str(tmp_path / "starts"), "KERNELS_THAT_DIE": str(die),
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "site"), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-p", "no:cacheprovider",
                          "-p", "no:randomly", "-p", "no:xdist", "--nbval", "--nbval-current-env", "-rA",
                          "lab.ipynb"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    starts = (tmp_path / "starts").stat().st_size if (tmp_path / "starts").exists() else 0
    return out, starts


def test_a_kernel_that_dies_at_start_is_retried(tmp_path):
    out, starts = _run(tmp_path, die=1)
    assert out.returncode == 0, out.stdout[-3000:]
    assert "3 passed" in out.stdout and starts == 2


def test_a_kernel_that_never_starts_is_one_failure(tmp_path):
    out, starts = _run(tmp_path, die=99)
    assert out.returncode == 1 and starts == 2, out.stdout[-3000:]
    assert "1 failed, 2 skipped" in out.stdout and "error" not in out.stdout.splitlines()[-1]
    assert "the notebook's kernel did not start (2 attempts; attempt 1:" in out.stdout and "HINT" in out.stdout
