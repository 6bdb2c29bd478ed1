"""Lab 03's deadlock, observed: the source's exchange under NCCL, a step log that survives the kill, the verdict.

``hang_demo`` launches ``source_exchange_traced`` (the source's send-all-then-receive-all on CUDA
tensors) once per init mode under a short labutils timeout; every rank logs each step to its own
file (``StepLog``), so what it reached is known even when labutils kills it::

    from labutils import procs
    from labutils.labs.lab03_async_p2p import hang
    for init, outcome in hang.hang_demo(timeout_s=15).items():
        print(hang.hang_verdict(outcome))
        print("\n".join(hang.describe_steps(outcome)))
    assert procs.leftover_ranks() == []

* ``StepLog`` / ``read_steps``: one file per rank, one line per step, written through at once.
* ``try_launch``: ``labutils.launch`` that returns what happened (JSON types, recordable) instead
  of raising.
* ``describe_steps`` / ``hang_verdict``: the outcome in words, formatted from its data only.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import warnings

import torch
import torch.distributed as dist

from ...config import rank_device, resolve
from ...errors import RankError, RankTimeout
from ...launch import launch
from .exchange import SOURCE_COLS, SOURCE_ROWS, chunk_rows


class StepLog:
    """One file per rank, one line per step, written through at once, so that what a rank reached
    survives its being killed (a RankTimeout carries no output of its own)."""

    def __init__(self, directory: str, rank: int):
        self.path = os.path.join(directory, f"rank-{rank}.log")
        self._t0 = time.monotonic()

    def mark(self, step: str, detail: str = "") -> None:
        detail = " ".join(str(detail).split())  # one line, no tabs
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"{time.monotonic() - self._t0:.3f}\t{step}\t{detail}\n")


def read_steps(directory: str) -> dict[int, list[dict]]:
    """``{rank: [{"t_s", "step", "detail"}, ...]}`` from the ``StepLog`` files in ``directory``."""
    out = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("rank-") and name.endswith(".log"):
            with open(os.path.join(directory, name), encoding="utf-8") as f:
                rows = [line.rstrip("\n").split("\t") for line in f if line.count("\t") == 2]
            out[int(name[5:-4])] = [{"t_s": float(t), "step": s, "detail": d} for t, s, d in rows]
    return dict(sorted(out.items()))


def _poll(works, seconds: float) -> int:
    """How many of ``works`` report ``is_completed()`` within ``seconds`` (never blocks longer)."""
    deadline = time.monotonic() + seconds
    while True:
        done = sum(bool(w.is_completed()) for w in works)
        if done == len(works) or time.monotonic() >= deadline:
            return done
        time.sleep(0.02)


def source_exchange_traced(rank: int, world_size: int, log_dir: str, poll_s: float = 1.0) -> bool:
    """The source's exchange (every isend, then every irecv, then wait) on this rank's device,
    logging each step; then an all_reduce, then ``torch.cuda.synchronize()`` (what the source's
    ``print(final_result)`` would need). ``wait()`` and the completion polls never block the host
    under NCCL, so the log shows whether the host or the GPU is stuck.

    Returns:
        True if every request completed within ``poll_s`` (the exchange did not hang).
    """
    log, dev = StepLog(log_dir, rank), rank_device()
    result = torch.full((chunk_rows(SOURCE_ROWS, world_size)[rank], SOURCE_COLS), 2.0 * rank + 2.0,
                        device=dev)
    received_results = [torch.empty_like(result) for _ in range(world_size)]
    reqs = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        log.mark("start", f"{dist.get_backend()} on {dev}")
        for i in range(world_size):
            if i != rank:
                reqs.append(dist.isend(result, dst=i))
        log.mark("isend")
        for i in range(world_size):
            if i != rank:
                reqs.append(dist.irecv(received_results[i], src=i))
        log.mark("irecv")
        for req in reqs:
            req.wait()
        log.mark("wait")
    for w in caught:
        log.mark("warning", str(w.message)[:400])
    done = _poll(reqs, poll_s)
    log.mark("p2p_done", f"{done}/{len(reqs)}")
    work = dist.all_reduce(torch.ones(1, device=dev), async_op=True)
    log.mark("all_reduce")
    log.mark("all_reduce_done", str(_poll([work], poll_s) == 1))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    log.mark("synchronized")
    return done == len(reqs)


def try_launch(fn, *args, **launch_kwargs) -> dict:
    """``labutils.launch`` that reports instead of raising.

    Returns:
        ``{"status": "completed" | "RankTimeout" | "RankError", "elapsed_s", "message",
        "value"}``, plus ``"rank", "exc_type", "exit_code", "tail"`` (last lines of the failed
        rank's traceback or output) for a RankError. JSON types only (recordable).
    """
    t0, info = time.monotonic(), {"status": "completed", "message": "", "value": None}
    try:
        value = launch(fn, *args, **launch_kwargs)
        info["value"] = json.loads(json.dumps(value, default=lambda x: None))
    except RankTimeout as exc:
        info.update(status="RankTimeout", message=str(exc),
                    where={str(r): w for r, w in getattr(exc, "where", {}).items()})
    except RankError as exc:
        info.update(status="RankError", message=str(exc), rank=exc.rank, exc_type=exc.exc_type,
                    exit_code=exc.exit_code, tail=exc.traceback.strip().splitlines()[-6:])
    info["elapsed_s"] = round(time.monotonic() - t0, 1)
    return info


def hang_demo(timeout_s: float = 15.0, inits=("eager", "lazy"), poll_s: float = 1.0,
              backend: str = "nccl", rank_fn=None) -> dict:
    """Run ``rank_fn`` (default ``source_exchange_traced``) once per init mode under ``timeout_s``.

    Each launch costs at most ``timeout_s`` (process start included) and leaves no process behind
    (``launch`` kills every rank and its children on a timeout).

    Returns:
        ``{init: try_launch(...) + {"init", "timeout_s", "poll_s", "world_size",
        "steps": {"rank": [...]}}}``.
    """
    out, n = {}, resolve(None, backend).world_size
    for init in inits:
        log_dir = tempfile.mkdtemp(prefix="labutils-steps-")
        try:
            # quiet: a crashing NCCL rank prints pages of C++ frames; the verdict keeps the what() line
            res = try_launch(rank_fn or source_exchange_traced, log_dir, poll_s, backend=backend,
                             init=init, timeout=timeout_s, output="quiet")
            res["steps"] = {str(r): s for r, s in read_steps(log_dir).items()}
        finally:
            shutil.rmtree(log_dir, ignore_errors=True)
        out[init] = {**res, "init": init, "timeout_s": timeout_s, "poll_s": poll_s, "world_size": n}
    return out


_STEP_TEXT = {"start": "started", "isend": "isend returned", "irecv": "irecv returned",
              "wait": "wait() returned", "p2p_done": "requests complete: {}",
              "all_reduce": "all_reduce issued", "all_reduce_done": "all_reduce complete: {}",
              "synchronized": "synchronize returned"}


def describe_steps(outcome: dict) -> list[str]:
    """``rank r: started -> isend returned -> ...`` for every rank of a ``hang_demo`` outcome, then
    each distinct warning the ranks caught (once), then where labutils found each rank at the
    timeout (``RankTimeout.where``), if it did."""
    lines, warned = [], []
    for r, steps in outcome.get("steps", {}).items():
        seq = [_STEP_TEXT[s["step"]].format(s["detail"]) for s in steps if s["step"] in _STEP_TEXT]
        done = any(s["step"] == "synchronized" for s in steps)
        lines.append(f"rank {r}: " + " -> ".join(seq) + ("" if done else " -> (stopped here)"))
        warned += [s["detail"] for s in steps if s["step"] == "warning" and s["detail"] not in warned]
    where = [f"rank {r} at the timeout: {w}" for r, w in outcome.get("where", {}).items()]
    return lines + [f"warning caught: {w}" for w in warned] + where


def hang_verdict(outcome: dict) -> str:
    """One paragraph saying what happened in a ``hang_demo`` launch, formatted from its data only."""
    init, status = outcome["init"], outcome["status"]
    steps = {int(r): {s["step"]: s["detail"] for s in v} for r, v in outcome.get("steps", {}).items()}
    took = f"{outcome['elapsed_s']:.0f} s"
    if status == "completed":
        return f"{init} init: COMPLETED in {took} -- the exchange did not hang this time."
    ending = (f"labutils killed every rank at the {outcome['timeout_s']:g} s timeout (RankTimeout)"
              if status == "RankTimeout" else f"then {outcome['message'].split('. HINT')[0]}")
    kind = "HANG" if status == "RankTimeout" else "CRASH"
    n = outcome.get("world_size", len(steps))
    if len(steps) < n or not steps or any("start" not in s for s in steps.values()):
        if status == "RankTimeout":
            return (f"{init} init: INCONCLUSIVE -- not every rank reached the exchange within "
                    f"{outcome['timeout_s']:g} s (slow start-up); raise the timeout and run again.")
        return f"{init} init: CRASH before the exchange -- {ending}."
    for step, where in (("isend", "on the host inside isend"), ("irecv", "on the host inside irecv"),
                        ("wait", "on the host in wait()"), ("p2p_done", "after wait()")):
        stuck = [r for r, s in steps.items() if step not in s]
        if stuck:
            return f"{init} init: {kind} {where} (ranks {stuck}); {ending}."
    done = sorted({s["p2p_done"] for s in steps.values()})
    if all(d.split("/")[0] == d.split("/")[-1] for d in done):
        text = f"{init} init: {kind} after the exchange completed"
    else:
        text = (f"{init} init: {kind} -- isend, irecv and wait() returned on every rank's host, but "
                f"after {outcome['poll_s']:g} s the GPU had completed {' / '.join(done)} requests")
    ar = sorted({s["all_reduce_done"] for s in steps.values() if "all_reduce_done" in s})
    if ar:
        text += f"; an all_reduce issued afterwards completed: {' / '.join(ar)}"
    if ar and any("synchronized" not in s for s in steps.values()):
        text += "; torch.cuda.synchronize() (what print(final_result) needs) never returned"
    return f"{text}; {ending} ({took} in all)."
