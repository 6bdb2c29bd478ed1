"""Lab 07's verdicts: the round trip from the recording (``CLAIMS``), the pool's fault rules from what
the notebook's own cells observe (checked by nbval on every run, on CPU and on GPUs alike).

Thresholds (the notebook says why):

* ``SPEEDUP_MIN``: a pool keeps state between calls -- stale variables, a broken process group -- and
  that price is worth paying only for a gain of orders of magnitude over a fresh launch;
* ``BREAK_EVEN_MAX``: starting the pool does what one launch does (processes, ``import torch``, the
  process group), so it should have paid for itself by the second experiment.

Which of a ``%%ranks`` cell (text) and ``pool.run(fn)`` (a function by value) travels faster is no claim of a
source, so it is shown in the measurement's table, not judged.
"""
from __future__ import annotations

from ... import claims
from .measure import medians

SPEEDUP_MIN = 100.0
BREAK_EVEN_MAX = 2.0


def roundtrip_verdicts(data: dict) -> list[claims.Verdict]:
    """From ``07_roundtrip``; a recording made before the pool's start was timed (no ``start_s``) gives the
    first verdict only."""
    m = medians(data)
    run_ms, launch_ms = m["pool_ms"], m["launch_ms"]
    out = [claims.at_least(
        "a pool round trip costs a small fraction of a fresh launch", launch_ms / run_ms, SPEEDUP_MIN,
        figure=f"launch {launch_ms / 1e3:.2f} s / pool.run {run_ms:.2f} ms = {launch_ms / run_ms:,.0f}x")]
    if data.get("start_s"):
        calls = data["start_s"] * 1e3 / (launch_ms - run_ms)
        out.append(claims.at_most(
            "the pool is cheaper than fresh launches from the second experiment on", calls, BREAK_EVEN_MAX,
            figure=f"break-even after start / (launch - round trip) = {data['start_s']:.2f} s / "
                   f"{(launch_ms - run_ms) / 1e3:.2f} s = {calls:.2f} experiments"))
    return out


def observed(claim: str, ok: bool, *, figure: str, rule: str) -> claims.Verdict:
    """A verdict on a behaviour the notebook just observed (``ok`` computed by the caller's cell)."""
    return claims.Verdict(claim, figure, rule, claims.TRUE if ok else claims.FALSE)


def state_kept(values: list, expected) -> claims.Verdict:
    """``%%ranks`` keeps each rank's variables between cells: ``values`` fetched from the ranks."""
    return observed("%%ranks keeps each rank's variables between cells", values == [expected] * len(values),
                    figure=f"steps, set in one cell and incremented in the next, fetched: {values}",
                    rule=f"TRUE if it is {expected} on every rank")


def pool_kept(what: str, pids_before: list, pids_after: list, values: list, expected) -> claims.Verdict:
    """After ``what`` the same rank processes still hold a variable set before it."""
    same = pids_before == pids_after
    return observed(f"after {what} the pool keeps its ranks and their variables",
                    same and values == [expected] * len(values),
                    figure=f"same processes: {same}; a variable set before: {values}",
                    rule=f"TRUE if the processes are the same and it is {expected!r} on every rank")


def pool_restarted(restarts_before: int, restarts_after: int) -> claims.Verdict:
    """A hang costs the ranks, not the kernel: the pool restarted once, and the cell asking runs."""
    return observed("a hang is recovered from without restarting the kernel",
                    restarts_after == restarts_before + 1,
                    figure=f"pool restarts {restarts_before} -> {restarts_after}; the kernel runs this cell",
                    rule="TRUE if the pool restarted exactly once")


# 07_roundtrip: the 2-GPU reference; 07_roundtrip_here: the same measurement on the machine that ran the lab
CLAIMS = {"07_roundtrip": roundtrip_verdicts, "07_roundtrip_here": roundtrip_verdicts}
