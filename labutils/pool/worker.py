"""One persistent rank of a ``RankPool``: ``python -m labutils.pool.worker RANK WORLD_SIZE BACKEND STORE PG_TIMEOUT RUN_DIR``.

Holds ``RUN_DIR/ranks.lock`` while it lives and leaves when the notebook is gone (``_rank.watch_parent``:
the last rank out removes ``RUN_DIR``), reads ``{"address": [host, port], "token": hex}`` from stdin,
starts answering ``RUN_DIR/diagnose`` as launch's ranks do (``_rank.serve_diagnostics``: where it is, its flight
record), joins the process group (``_rank.init_distributed``: one GPU per rank under NCCL, torch's
timeout ``PG_TIMEOUT``), then connects to the notebook's control
channel and says ``ready`` (or ``failed``, with the error) -- in that order, so that the slow part of a
start needs nothing from the notebook, which may be busy elsewhere meanwhile -- then serves tasks
until told to stop or until the notebook goes away:

* ``call``: ``fn(rank, world_size, *args, **kwargs)``, the contract of ``labutils.launch``;
* ``exec``: a ``%%ranks`` cell, run in this rank's namespace (kept between cells) holding
  ``rank``, ``world_size``, ``device``, ``torch`` and ``dist``; like a REPL, the value of a last
  bare expression is printed.

SIGINT (sent by the notebook when the kernel is interrupted) raises KeyboardInterrupt inside a
running task and is ignored while idle. A rank stuck in a collective does not see it (the wait is
in C++), which is how the notebook tells "interrupted" from "stuck".
"""
from __future__ import annotations

import ast
import json
import linecache
import os
import pickle
import signal
import sys

from .._rank import error_info, init_distributed, restore_sources, serve_diagnostics, to_cpu, watch_parent
from . import protocol

_busy = False  # True while a task runs: only then does SIGINT raise KeyboardInterrupt


def _on_sigint(signum, frame):
    if _busy:
        raise KeyboardInterrupt


def make_namespace(rank: int, world_size: int, backend: str) -> dict:
    """The per-rank namespace of ``%%ranks`` cells."""
    import torch
    import torch.distributed as dist
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    return {"__name__": "__ranks__", "__builtins__": __builtins__, "rank": rank,
            "world_size": world_size, "device": device, "torch": torch, "dist": dist}


def run_cell(code: str, filename: str, ns: dict) -> None:
    """Execute ``code`` in ``ns``; print ``repr`` of a last bare expression that is not None."""
    if code:  # tracebacks show the cell's lines
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    tree = ast.parse(code, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, filename, "exec"), ns)  # noqa: S102 - running the user's cell is the job
    if last is not None:
        value = eval(compile(last, filename, "eval"), ns)  # noqa: S307
        if value is not None:
            print(repr(value))


def _execute(kind: str, body: bytes, ns: dict, rank: int, world_size: int):
    if kind == "call":
        fn, args, kwargs, smap = pickle.loads(body)
        restore_sources((fn, args, kwargs), smap)  # as launch's ranks: cells' files and lines back
        return fn(rank, world_size, *args, **kwargs)
    code, filename, push, fetch = pickle.loads(body)
    ns.update(push)
    run_cell(code, filename, ns)
    missing = [name for name in fetch if name not in ns]
    if missing:
        raise NameError(f"cannot fetch {missing}: not defined on rank {rank}. HINT: assign it in "
                        "a %%ranks cell that ran on this rank, or fetch only from ranks that have it.")
    return {name: ns[name] for name in fetch}


def _strip_own_frames(exc: BaseException) -> BaseException:
    """Start the traceback at the user's code, not at this module."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return exc.with_traceback(tb)


def serve_task(kind: str, task_id: int, body: bytes, ns: dict, rank: int, world_size: int) -> bytes:
    """Run one task; return the packed ``done`` message (its output is already in the pipe)."""
    global _busy
    try:
        _busy = True
        value = _execute(kind, body, ns, rank, world_size)
        _busy = False
        try:
            reply = ("ok", protocol.dumps(to_cpu(value)))
        except Exception as exc:  # noqa: BLE001
            info = error_info(_strip_own_frames(exc))
            info["message"] = f"its return value could not be pickled: {info['message']}"
            info["hint"] = ("return tensors, numbers, strings, or lists/dicts of them "
                            "(not open files, locks, CUDA streams, generators ...).")
            reply = ("error", info)
    except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt and SystemExit included
        _busy = False
        reply = ("error", error_info(_strip_own_frames(exc)))
    finally:
        _busy = False
    sys.stdout.flush()
    sys.stderr.flush()
    os.write(1, protocol.end_marker(task_id))  # after every byte this task printed
    return protocol.pack("done", task_id, protocol.dumps(reply))


def main(argv: list[str]) -> None:
    rank, world_size, backend, address, timeout_s, run_dir = argv
    rank, world_size, timeout_s = int(rank), int(world_size), float(timeout_s)
    watch_parent(run_dir)
    signal.signal(signal.SIGINT, _on_sigint)
    cfg = json.loads(sys.stdin.readline())
    # the same answer as launch's ranks give on a hang (RankTimeout.where / .stacks / .flight);
    # frames are recognised by their code objects
    serve_diagnostics(run_dir, rank, backend, entry=[_execute.__code__, run_cell.__code__], states={
        init_distributed.__code__: "starting", main.__code__: "idle", serve_task.__code__: "running",
        to_cpu.__code__: "returning"})
    devnull = os.open(os.devnull, os.O_RDONLY)  # input() in a cell gets EOF instead of hanging
    os.dup2(devnull, 0)
    os.close(devnull)
    failure = None
    try:
        init_distributed(rank, world_size, backend, address, timeout_s, eager=True)
        ns = make_namespace(rank, world_size, backend)
    except BaseException as exc:  # noqa: BLE001
        failure = error_info(exc)
    conn = protocol.connect(cfg["address"], bytes.fromhex(cfg["token"]))
    conn.send_bytes(protocol.pack("hello", os.getpid()))
    if failure is not None:
        conn.send_bytes(protocol.pack("failed", 0, protocol.dumps(failure)))
        sys.stdout.flush()
        os._exit(1)
    conn.send_bytes(protocol.pack("ready", 0, protocol.dumps(str(ns["device"]))))
    while True:
        try:
            kind, task_id, body = protocol.unpack(conn.recv_bytes())
        except (EOFError, OSError):  # the notebook is gone
            os._exit(0)
        except KeyboardInterrupt:  # only if SIGINT lands exactly between two checks of _busy
            continue
        if kind == "stop":
            break
        try:
            conn.send_bytes(serve_task(kind, task_id, body, ns, rank, world_size))
        except KeyboardInterrupt:  # landed after the task: the task itself was reported
            continue
        except (EOFError, OSError):
            os._exit(0)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()  # leave the group cleanly (no "not destroyed" warnings)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip the interpreter's teardown (~0.5 s with torch loaded)


if __name__ == "__main__":
    main(sys.argv[1:])
