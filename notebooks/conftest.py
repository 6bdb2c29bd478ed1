"""nbval over the lab notebooks: a kernel that fails to start is retried once, else one clear failure.

nbval starts one kernel per notebook in the notebook's set-up (``IPyNbFile.setup``). When that kernel
dies before it answers (a loaded machine, many pytest-xdist workers starting kernels at once), pytest
would report every cell of the notebook as an error of its own -- 28 errors that say nothing about
cells. Here a kernel that does not start is stopped and started once more; if the second one fails
too, the notebook's first cell fails with why, and the others are skipped, saying so.
"""
from __future__ import annotations

import psutil
import pytest

try:
    from nbval import plugin as nbval_plugin
    from nbval.kernel import RunningKernel
except ImportError:  # no nbval: nothing to hook
    nbval_plugin = None

START_ATTEMPTS = 2


class KernelStartError(RuntimeError):
    """The notebook's kernel did not start, after every attempt."""


def _kernels_below_us() -> set[int]:
    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if "ipykernel" in " ".join(proc.cmdline()):
                found.add(proc.pid)
        except psutil.Error:
            pass
    return found


def _kill(pids: set[int]) -> None:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
            procs[-1].kill()
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=5)


def start_kernel(*args, **kwargs) -> RunningKernel:
    """nbval's ``RunningKernel(...)``, tried ``START_ATTEMPTS`` times; what a failed attempt started is
    killed before the next. Raises KernelStartError with every attempt's reason."""
    reasons = []
    for attempt in range(1, START_ATTEMPTS + 1):
        before = _kernels_below_us()
        try:
            return RunningKernel(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - died, timed out, no IOPub: all mean "did not start"
            reasons.append(f"attempt {attempt}: {type(exc).__name__}: {exc}")
            _kill(_kernels_below_us() - before)
    raise KernelStartError(f"the notebook's kernel did not start ({START_ATTEMPTS} attempts; "
                           + "; ".join(reasons) + "). HINT: a loaded machine starts kernels slowly: run fewer "
                           "pytest-xdist workers (-n 2 or -n 0), or raise --nbval-kernel-startup-timeout.")


if nbval_plugin is not None:
    nbval_plugin.RunningKernel = start_kernel  # what IPyNbFile.setup calls
    _file_setup = nbval_plugin.IPyNbFile.setup
    _cell_runtest = nbval_plugin.IPyNbCell.runtest

    def _setup(self):
        self.kernel_start_error = None
        try:
            _file_setup(self)
        except KernelStartError as exc:  # reported once, by the first cell (below), not by every cell
            self.kernel, self.kernel_start_error = None, exc

    def _runtest(self):
        error = getattr(self.parent, "kernel_start_error", None)
        if error is None:
            return _cell_runtest(self)
        if not getattr(self.parent, "kernel_start_reported", False):
            self.parent.kernel_start_reported = True
            pytest.fail(str(error), pytrace=False)
        pytest.skip("the notebook's kernel did not start (the first cell's failure says why)")

    nbval_plugin.IPyNbFile.setup = _setup
    nbval_plugin.IPyNbCell.runtest = _runtest
