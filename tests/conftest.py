"""Shared fixtures: GPU counts for skipping, a guard that no rank process outlives a test, and gloo pools
(2 and 3 CPU ranks, one of each per test module that asks)."""
from __future__ import annotations

import signal

import psutil
import pytest

import labutils
from labutils import procs


def pytest_configure(config):
    # A script's background job (`pytest &`, nohup) starts Python with SIGINT ignored, and then
    # neither SIGINT nor _thread.interrupt_main() raises KeyboardInterrupt. The interrupt tests
    # stand in for Jupyter's "interrupt kernel", and a Jupyter kernel always handles SIGINT.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves labutils rank/worker processes behind."""
    before = {p.pid for p in procs.leftover_ranks()}
    yield
    left = procs.leftover_ranks(ignore=before, wait_s=3.0)
    assert not left, f"leaked processes: {[_cmdline(p) for p in left]}"


def _cmdline(proc) -> str:
    try:
        return " ".join(proc.cmdline())
    except psutil.Error:  # gone meanwhile
        return f"pid {proc.pid}"


@pytest.fixture(scope="module")
def gloo2():
    """Two gloo ranks kept for the whole test module."""
    with labutils.RankPool(world_size=2, backend="gloo", output="quiet") as p:
        yield p


@pytest.fixture(scope="module")
def gloo3():
    """Three gloo ranks kept for the whole test module."""
    with labutils.RankPool(world_size=3, backend="gloo", output="quiet") as p:
        yield p
