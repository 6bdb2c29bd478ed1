"""The rank side of ``labutils.launch``: ``python -m labutils._rank DIR RANK WORLD_SIZE BACKEND PORT TIMEOUT INIT``.

Reads ``DIR/payload.pkl`` (cloudpickled ``(fn, args, kwargs)``), initialises ``torch.distributed``
against the caller's loopback store, runs ``fn(rank, world_size, *args, **kwargs)`` and writes
``DIR/result-RANK.pkl``: ``("ok", value)`` with CUDA tensors moved to the CPU, or
``("error", info)``. The helpers here are reused by the rank pool's worker.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
import threading
import time
import traceback
from datetime import timedelta


def watch_parent(poll_s: float = 0.5) -> None:
    """Exit at once if the process that started us dies (e.g. the Jupyter kernel is restarted).

    A daemon thread polls ``getppid()`` (portable; ``prctl(PR_SET_PDEATHSIG)`` would also fire
    when the *thread* that started us ends, e.g. a pool started from a worker thread).
    """
    parent = os.getppid()

    def poll():
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(poll_s)

    threading.Thread(target=poll, daemon=True, name="labutils-parent-watch").start()


def init_distributed(rank: int, world_size: int, backend: str, port: int, timeout_s: float,
                     eager: bool = True):
    """Bind the rank to its GPU (NCCL) and join the process group through the caller's store.

    ``eager=True`` passes ``device_id`` so NCCL creates its communicator inside
    ``init_process_group`` (and barriers know their device); ``eager=False`` is PyTorch's lazy
    default, where the communicator appears at the first collective/P2P call.
    """
    import torch
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", port, world_size=None, is_master=False,
                          timeout=timedelta(seconds=timeout_s))
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        if eager:
            kw["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s), **kw)
    return store


def to_cpu(value):
    """Return ``value`` with every non-CPU tensor inside lists/tuples/dicts replaced by a CPU copy."""
    import torch
    from torch.utils._pytree import tree_map
    return tree_map(lambda x: x.detach().cpu() if isinstance(x, torch.Tensor) and x.device.type != "cpu"
                    else x, value)


def error_info(exc: BaseException) -> dict:
    """Describe an exception raised in a rank as plain data (always picklable)."""
    tb_obj = exc.__traceback__
    while tb_obj is not None and tb_obj.tb_frame.f_code.co_filename == __file__:
        tb_obj = tb_obj.tb_next  # start at the user's code, not at this bootstrap
    tb = "".join(traceback.format_exception(type(exc), exc, tb_obj))
    if isinstance(exc, SystemExit):
        return {"exc_type": "SystemExit", "message": f"sys.exit({exc.code!r}) was called",
                "traceback": tb,
                "hint": "return from the function instead of exiting: every rank must return a result."}
    return {"exc_type": type(exc).__name__, "message": str(exc), "traceback": tb}


def dump_result(path: str, status: str, payload) -> None:
    """Write ``(status, payload)`` atomically (temp file + rename) with cloudpickle."""
    import cloudpickle
    buf = io.BytesIO()
    cloudpickle.dump((status, payload), buf, protocol=pickle.HIGHEST_PROTOCOL)
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getbuffer())
    os.replace(tmp, path)


def extend_sys_path(path: str) -> None:
    """Append the caller's ``sys.path`` entries we lack, so by-reference pickles import here too."""
    import json
    if os.path.exists(path):
        with open(path) as f:
            for entry in json.load(f):
                if entry not in sys.path:
                    sys.path.append(entry)


def main(argv: list[str]) -> None:
    run_dir, rank, world_size, backend, port, timeout_s, init = argv
    rank, world_size, port, timeout_s = int(rank), int(world_size), int(port), float(timeout_s)
    watch_parent()
    result_path = os.path.join(run_dir, f"result-{rank}.pkl")
    try:
        extend_sys_path(os.path.join(run_dir, "sys_path.json"))
        with open(os.path.join(run_dir, "payload.pkl"), "rb") as f:
            fn, args, kwargs = pickle.load(f)
        if init != "none":  # "none": fn initialises torch.distributed itself
            init_distributed(rank, world_size, backend, port, timeout_s, eager=(init == "eager"))
        value = fn(rank, world_size, *args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
        dump_result(result_path, "error", error_info(exc))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)  # skip teardown: the caller kills the other ranks anyway
    try:
        dump_result(result_path, "ok", to_cpu(value))
    except Exception as exc:  # noqa: BLE001
        info = error_info(exc)
        info["message"] = f"its return value could not be pickled: {info['message']}"
        info["hint"] = ("return tensors, numbers, strings, or lists/dicts of them "
                        "(not open files, locks, CUDA streams, generators ...).")
        dump_result(result_path, "error", info)
        os._exit(1)
    import torch.distributed as dist
    if dist.is_initialized():
        dist.destroy_process_group()  # no "process group was not destroyed" warnings
    sys.stdout.flush()
    sys.stderr.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
