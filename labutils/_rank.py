"""The rank side of ``labutils.launch``: ``python -m labutils._rank DIR RANK WORLD_SIZE BACKEND STORE TIMEOUT INIT``.

Reads ``DIR/payload.pkl`` (cloudpickled ``(fn, args, kwargs)``), initialises ``torch.distributed``
against the caller's private store (``rendezvous``), runs ``fn(rank, world_size, *args, **kwargs)`` and writes
``DIR/result-RANK.pkl``: ``("ok", value)`` with CUDA tensors moved to the CPU, or
``("error", info)``. A rank that returned then waits until the caller writes ``DIR/release``
(every rank has a result) before it tears the process group down, so that a rank that returns
early looks the same under gloo and NCCL: its peers wait, rather than crash on a closed socket.
While it runs, a daemon thread answers the caller's ``DIR/diagnose`` request with the rank's
Python stack and flight-recorder summary (``RankTimeout.where`` / ``.flight``).
The helpers here are reused by the rank pool's worker.
"""
from __future__ import annotations

import functools
import linecache
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import types
from datetime import timedelta

from . import rendezvous
from .procs import PARENT_ENV, RUN_LOCK, parent_alive

DYNAMIC_CODE = "<dynamic-code>"  # the file name cloudpickle gives code it sends by value
LOAD_HINT = ("modules the function uses must be importable by the ranks (they start a fresh "
             "`python` with the notebook's sys.path and working directory): define helpers in the "
             "notebook, or install the module.")


def parent_from_env(environ=None) -> tuple[int, float | None]:
    """The launcher this rank belongs to: ``LABUTILS_PARENT`` (``PID:START_TIME``), which the launcher
    sets before the rank exists; without it, ``getppid()`` now (a rank started by hand)."""
    value = (os.environ if environ is None else environ).get(PARENT_ENV, "")
    pid, _, started = value.partition(":")
    try:
        return int(pid), float(started)
    except ValueError:
        return os.getppid(), None


def _leave(run_dir: str | None, lock_fd: int | None) -> None:
    """The launcher is gone: remove the run directory if this is the last rank out, then kill this
    rank's process group (itself and whatever it started) -- nobody else is left to do either."""
    try:
        if run_dir is not None:
            import fcntl
            import shutil
            try:
                fd = lock_fd if lock_fd is not None else os.open(os.path.join(run_dir, RUN_LOCK), os.O_RDONLY)
                fcntl.flock(fd, fcntl.LOCK_UN)
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # fails while another rank still holds it
                shutil.rmtree(run_dir, ignore_errors=True)
            except OSError:
                pass  # another rank is still here (it removes the folder), or the folder is gone
    finally:
        if os.getpgid(0) == os.getpid():  # a session of our own (procs.spawn_rank): take it along
            os.killpg(0, signal.SIGKILL)
        os._exit(1)


def watch_parent(run_dir: str | None = None, poll_s: float = 0.5) -> None:
    """Exit if the process that launched us is gone: now, and from then on (a daemon thread polls).

    The launcher names itself (``parent_from_env``): a rank that records ``getppid()`` when it starts
    would, when it starts after its launcher died (under load, with many ranks starting), record init
    and never notice. ``run_dir`` (a launch's): this rank holds ``run_dir/ranks.lock`` shared while it
    lives, so that the last one to leave a dead launcher's run can tell, and remove the folder.
    (``prctl(PR_SET_PDEATHSIG)`` would also fire when the *thread* that started us ends, e.g. a pool
    started from a worker thread, and not at all when the launcher was dead before it was set.)
    """
    pid, started = parent_from_env()
    lock_fd = None
    if run_dir is not None:
        import fcntl
        try:
            lock_fd = os.open(os.path.join(run_dir, RUN_LOCK), os.O_RDONLY)
            fcntl.flock(lock_fd, fcntl.LOCK_SH)
        except OSError:  # the run directory is gone: so is the launch
            _leave(None, None)
    if not parent_alive(pid, started):
        _leave(run_dir, lock_fd)

    def poll():
        while parent_alive(pid, started):
            time.sleep(poll_s)
        _leave(run_dir, lock_fd)

    threading.Thread(target=poll, daemon=True, name="labutils-parent-watch").start()


def serve_diagnostics(run_dir: str, rank: int, backend: str, poll_s: float = 0.05, *,
                      entry=(), states: dict | None = None) -> None:
    """Answer the caller's ``run_dir/diagnose`` request once, from a daemon thread.

    Writes ``run_dir/diag-RANK.pkl``: ``{"frames": [(file, line, function), ...] of the main
    thread, outermost first, "user_from": index of the first frame past the bootstrap, "state":
    label of the innermost marked frame, "flight": debugging.flight_record(backend) or None}``. A
    thread (not a signal handler) because the main thread is usually blocked inside C++ with the
    GIL released.

    Args:
        entry: code objects of the bootstrap's functions that call the user's code: the frames up
            to the innermost of them are the bootstrap's, not the user's (``user_from``).
        states: ``{code object: label}`` marking the bootstrap's own functions (``"starting"``,
            ``"returning"``, ``"returned"``, ``"idle"``, ``"running"``): the innermost marked frame
            says what a rank is doing when no user code runs (``errors.RANK_STATES``). Frames are
            matched by the identity of their code objects, never by their names.
    """
    request = os.path.join(run_dir, "diagnose")
    main_ident = threading.main_thread().ident
    # by identity: code objects compare equal when only their file differs
    entry_ids, state_ids = {id(c) for c in entry}, {id(c): label for c, label in (states or {}).items()}
    held = (*entry, *(states or {}))

    def answer(held=held):  # holds the codes: alive, their ids stay theirs
        while not os.path.exists(request):
            time.sleep(poll_s)
        info: dict = {"frames": [], "flight": None, "user_from": 0, "state": ""}
        frame, chain = sys._current_frames().get(main_ident), []
        while frame is not None:  # one walk: the lines and the codes are of the same moment
            chain.append((frame.f_code, frame.f_lineno))
            frame = frame.f_back
        chain.reverse()  # outermost first
        info["frames"] = [(code.co_filename, line, code.co_name) for code, line in chain]
        marked = [i for i, (code, _) in enumerate(chain) if id(code) in entry_ids]
        info["user_from"] = marked[-1] + 1 if marked else 0
        labels = [state_ids[id(code)] for code, _ in chain if id(code) in state_ids]
        info["state"] = labels[-1] if labels else ""
        try:
            from .debugging.flight import flight_record
            info["flight"] = flight_record(backend)
        except Exception as exc:  # noqa: BLE001 - best effort: the stack matters more
            info["flight_error"] = f"{type(exc).__name__}: {exc}"
        _atomic_write(os.path.join(run_dir, f"diag-{rank}.pkl"), pickle.dumps(info))

    threading.Thread(target=answer, daemon=True, name="labutils-diagnostics").start()


def _functions(obj, max_depth: int = 4) -> list[types.FunctionType]:
    """Functions reachable from ``obj``: itself, containers, closures, and the globals it names."""
    seen, found, todo = set(), [], [(obj, 0)]
    while todo:
        x, depth = todo.pop()
        if id(x) in seen or depth > max_depth:
            continue
        seen.add(id(x))
        if isinstance(x, functools.partial):
            todo += [(x.func, depth + 1), (x.args, depth + 1)]
        elif isinstance(x, (list, tuple, set, frozenset)):
            todo += [(y, depth + 1) for y in x]
        elif isinstance(x, dict):
            todo += [(y, depth + 1) for y in x.values()]
        elif isinstance(x, types.FunctionType):
            found.append(x)
            for cell in x.__closure__ or ():
                try:
                    todo.append((cell.cell_contents, depth + 1))
                except ValueError:  # an empty cell
                    pass
            todo += [(x.__globals__[n], depth + 1) for n in _code_names(x.__code__)
                     if n in x.__globals__]
    return found


def _codes(code: types.CodeType):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _codes(c)


def _code_names(code: types.CodeType) -> set[str]:
    return {n for c in _codes(code) for n in c.co_names}


def _code_key(code: types.CodeType) -> str:
    return f"{getattr(code, 'co_qualname', code.co_name)}:{code.co_firstlineno}"


def source_map(obj) -> dict:
    """(Caller side) where the functions in ``obj`` come from, so that a rank can say it too.

    cloudpickle renames the file of code it sends by value to ``<dynamic-code>``, so tracebacks
    and stacks from a rank would not name the notebook cell nor show its lines. This records
    ``{"files": {code key: file name}, "lines": {file name: source lines}}``; the lines are sent
    only for files that are not on disk (notebook cells live in ``linecache`` only).
    """
    files, lines = {}, {}
    for fn in _functions(obj):
        for code in _codes(fn.__code__):
            files[_code_key(code)] = code.co_filename
            if not os.path.exists(code.co_filename) and code.co_filename not in lines:
                cached = linecache.getlines(code.co_filename)
                if cached:
                    lines[code.co_filename] = cached
    return {"files": files, "lines": lines}


def restore_sources(obj, smap: dict) -> None:
    """(Rank side) undo ``<dynamic-code>``: give code sent by value its file and lines back."""
    files = smap.get("files", {})

    def patch(code: types.CodeType) -> types.CodeType:
        if code.co_filename != DYNAMIC_CODE:
            return code
        consts = tuple(patch(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        return code.replace(co_filename=files.get(_code_key(code), DYNAMIC_CODE), co_consts=consts)

    for fn in _functions(obj):
        try:
            fn.__code__ = patch(fn.__code__)
        except (ValueError, TypeError):  # e.g. a mismatching closure: keep the original
            pass
    for name, lines in smap.get("lines", {}).items():
        linecache.cache[name] = (sum(map(len, lines)), None, lines, name)


def init_distributed(rank: int, world_size: int, backend: str, address: str, timeout_s: float,
                     eager: bool = True):
    """Bind the rank to its GPU (NCCL) and join the process group through the caller's private
    store (``rendezvous.PrivateStore``'s ``address``).

    ``eager=True`` passes ``device_id`` so NCCL creates its communicator inside
    ``init_process_group`` (and barriers know their device); ``eager=False`` is PyTorch's lazy
    default, where the communicator appears at the first collective/P2P call.
    """
    import torch
    import torch.distributed as dist
    store = rendezvous.join(address, timeout_s)
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        if eager:
            kw["device_id"] = torch.device("cuda", rank)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=timeout_s), **kw)
    # Start the user's function only once *every* rank is through init: gloo's init returns on a
    # rank while its peers may still be connecting, so a rank that failed at once could break their
    # init ("connectFullMesh failed") and the error would blame the wrong rank. Done through the store,
    # not a collective, so a lazy NCCL communicator stays lazy.
    store.set(f"labutils/init_done/{rank}", "1")
    store.wait([f"labutils/init_done/{r}" for r in range(world_size)], timedelta(seconds=timeout_s))
    return store


def to_cpu(value):
    """Return ``value`` with every non-CPU tensor inside lists/tuples/dicts replaced by a CPU copy."""
    if "torch" not in sys.modules:  # no tensor can exist without torch
        return value
    import torch
    from .compat import tree_map
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


def _atomic_write(path: str, data: bytes | None = None, dump=None) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "wb") as f:
        if dump is not None:
            dump(f)  # streamed: a large result is not copied into memory once more
        else:
            f.write(data)
    os.replace(tmp, path)


def dump_result(path: str, status: str, payload) -> None:
    """Write ``(status, payload)`` atomically (temp file + rename) with cloudpickle.

    Raises:
        OSError: the result could not be written (e.g. the disk is full); the message says so.
    """
    import cloudpickle
    try:
        _atomic_write(path, dump=lambda f: cloudpickle.dump((status, payload), f,
                                                            protocol=pickle.HIGHEST_PROTOCOL))
    except OSError as exc:
        raise OSError(exc.errno, f"the result could not be written to {os.path.dirname(path)}: "
                      f"{exc.strerror}") from exc


def _wait_for_release(run_dir: str) -> None:
    """Block until the caller says every rank has a result (or the caller goes away)."""
    release, delay = os.path.join(run_dir, "release"), 0.002
    while not os.path.exists(release):
        time.sleep(delay)
        delay = min(delay * 1.5, 0.05)


def _flush_all() -> None:
    """Flush Python's and C's stdio buffers (NCCL logs through C stdio) before ``os._exit``."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        import ctypes
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass


def _fail(result_path: str, info: dict) -> None:
    """Report ``info`` as this rank's error and exit at once (the caller kills the others)."""
    try:
        dump_result(result_path, "error", info)
    finally:
        _flush_all()
        os._exit(1)


def main(argv: list[str]) -> None:
    from .config import process_group_timeout
    run_dir, rank, world_size, backend, address, timeout_s, init = argv
    rank, world_size, timeout_s = int(rank), int(world_size), float(timeout_s)
    watch_parent(run_dir)
    serve_diagnostics(run_dir, rank, backend, entry=[main.__code__], states={
        init_distributed.__code__: "starting", to_cpu.__code__: "returning",
        _wait_for_release.__code__: "returned"})
    result_path = os.path.join(run_dir, f"result-{rank}.pkl")
    try:
        with open(os.path.join(run_dir, "payload.pkl"), "rb") as f:
            data = pickle.load(f)
        if isinstance(data, dict):  # like multiprocessing's spawn: the caller's sys.path first
            sys.path[:] = data["sys_path"] + [p for p in sys.path if p not in data["sys_path"]]
            data = pickle.loads(data["payload"])
        fn, args, kwargs, *smap = data
        if smap:
            restore_sources((fn, args, kwargs), smap[0])
    except BaseException as exc:  # noqa: BLE001
        info = error_info(exc)
        info.update(message=f"the function or its arguments could not be loaded in the rank: "
                            f"{info['message']}", hint=LOAD_HINT)
        _fail(result_path, info)
    try:
        if init != "none":  # "none": fn initialises torch.distributed itself
            init_distributed(rank, world_size, backend, address, process_group_timeout(timeout_s),
                             eager=(init == "eager"))
        value = to_cpu(fn(rank, world_size, *args, **kwargs))  # .cpu() waits for the GPU work
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the caller
        _fail(result_path, error_info(exc))
    try:
        dump_result(result_path, "ok", value)
    except BaseException as exc:  # noqa: BLE001
        info = error_info(exc)
        if isinstance(exc, OSError):
            info.update(message=str(exc), hint="return less data (a summary, or save large "
                        "tensors to a file yourself and return its path).")
        else:
            info.update(message=f"its return value could not be pickled: {info['message']}",
                        hint="return tensors, numbers, strings, or lists/dicts of them "
                        "(not open files, locks, CUDA streams, generators ...).")
        _fail(result_path, info)
    _flush_all()
    _wait_for_release(run_dir)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()  # no "process group was not destroyed" warnings
    try:
        import atexit
        atexit._run_exitfuncs()  # the user's atexit handlers still run ...
    finally:
        _flush_all()
        os._exit(0)  # ... but not the interpreter's teardown (~0.5 s with torch loaded)


if __name__ == "__main__":
    main(sys.argv[1:])
