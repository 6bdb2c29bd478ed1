"""How many CUDA GPUs this machine has, and ``@needs_gpus(n)`` to skip a test without them.

A module of its own (not ``conftest``): a test that imports ``conftest`` gets whichever conftest pytest
loaded last (``tests/`` and ``notebooks/`` each have one), so helpers live here.
"""
from __future__ import annotations

import pytest


def gpu_count() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def needs_gpus(n: int):
    """``@needs_gpus(2)``: skip unless this machine has at least n CUDA GPUs."""
    return pytest.mark.skipif(gpu_count() < n, reason=f"needs {n} CUDA GPU(s), found {gpu_count()}")
