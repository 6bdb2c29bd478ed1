"""``python -m labutils classroom check`` on real GPUs: each slice's GPUs seen by its ranks, a NCCL
all_reduce through the ranks' private FileStore with the right sum, free memory read. No timing.

Run: pytest tests/gpu/test_classroom_gpu.py -q     (>= 1 GPU; the pair case needs >= 2)
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)

pytestmark = pytest.mark.gpu


def _check(*args):
    env = {k: v for k, v in os.environ.items() if k not in ("LABUTILS_FAKE_GPUS", "CUDA_VISIBLE_DEVICES")}
    return subprocess.run([sys.executable, "-m", "labutils", "classroom", "check", "--min-free-gib", "1", *args],
                          capture_output=True, text=True, timeout=600, env=env)


@needs_gpus(1)
def test_every_one_gpu_slice_passes():
    r = _check("--slice-size", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    rows = [line for line in r.stdout.splitlines() if line.startswith("slice ")]
    assert rows and all("  OK  " in row and "visible 1/1" in row and "all_reduce 1 (want 1)" in row for row in rows)


@needs_gpus(2)
def test_pairs_pass_and_the_mine_mode_checks_one_slice():
    r = _check("--slice-size", "2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "visible 2/2" in r.stdout and "all_reduce 3 (want 3)" in r.stdout
    env_pair = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    env_pair.pop("LABUTILS_FAKE_GPUS", None)
    r = subprocess.run([sys.executable, "-m", "labutils", "classroom", "check", "--mine", "--min-free-gib", "1"],
                       capture_output=True, text=True, timeout=600, env=env_pair)
    assert r.returncode == 0 and "1/1 slices OK" in r.stdout, r.stdout + r.stderr
