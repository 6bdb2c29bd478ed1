"""Where a launch's or a pool's ranks meet: a store only the owner's processes can open.

A TCP store on 127.0.0.1 is open to every user of the machine: on a shared workshop node another
learner's process could connect to it, join the group as a rank, or overwrite its keys. So the
ranks meet in a ``torch.distributed.FileStore`` whose file lies in a fresh directory made by
``tempfile.mkdtemp`` (mode 0700: only the owner -- and root -- can enter it). Knowing its path
(a rank's command line shows it to ``ps``) opens nothing. Gloo and NCCL take any ``Store``: NCCL
exchanges its unique id through it, gloo its peers' addresses.

    owner = PrivateStore(timeout_s=300)     # in the caller (launch, RankPool)
    store = join(owner.address, 300)        # in each rank, before init_process_group(store=...)
    owner.close()                           # when the ranks are gone: the directory goes with it

``launch`` and ``RankPool`` put the store in their run directory (``directory=``: made 0700 by
``procs.make_run_dir``), so one folder holds a run's files and its store, and one rule removes it
(the caller, or the last rank out of a dead caller's run, or ``procs.remove_stale_runs``).
torchrun's ``env://`` rendezvous is left to torchrun. A caller killed outright (a kernel restart
that ends in SIGKILL) cannot remove its directory; the directory's name carries the caller's pid,
and the next ``PrivateStore`` of the same user removes those whose caller is gone.
"""
from __future__ import annotations

import os
import shutil
import stat
import tempfile
from datetime import timedelta
from pathlib import Path

STORE_FILE = "store"
PREFIX = "labutils-rdzv-"


class PrivateStore:
    """A FileStore in a directory only this user can enter (0700), for one generation of ranks.

    Args:
        timeout_s: how long the ranks' store operations wait.
        directory: a private directory of the caller's to hold the store file (a run directory);
            None: make one (``PREFIX`` + pid), removed by ``close``.

    Attributes:
        address: what the ranks pass to ``join`` (the store file's path).
        directory: the private directory holding it.
    """

    def __init__(self, timeout_s: float = 300.0, directory: str | os.PathLike | None = None):
        self.timeout_s = float(timeout_s)
        self._owned = directory is None
        if directory is None:
            remove_stale()
            directory = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-")
        self.directory = str(directory)
        info = os.stat(self.directory)
        if info.st_uid != os.geteuid():
            raise PermissionError(f"{self.directory} belongs to uid {info.st_uid}, not to this user: "
                                  "a store there would not be private.")
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.chmod(self.directory, 0o700)  # mkdtemp's mode already; said here because it is the point
        self.address = os.path.join(self.directory, STORE_FILE)

    def close(self) -> None:
        """Remove the store file, and the directory when this store made it (idempotent); ranks
        still holding it keep their open descriptor, nobody new can join."""
        if self.directory is not None:
            if self._owned:
                shutil.rmtree(self.directory, ignore_errors=True)
            else:
                try:
                    os.unlink(self.address)
                except OSError:
                    pass  # never made (no rank joined), or the folder went with its ranks
            self.directory = None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def join(address: str, timeout_s: float):
    """The store a rank passes to ``init_process_group(store=...)``: ``address`` from ``PrivateStore``.

    The number of workers is left open (-1): the file is never deleted by a rank leaving, only by
    the owner's ``close``.
    """
    import torch.distributed as dist
    store = dist.FileStore(address, -1)
    store.set_timeout(timedelta(seconds=timeout_s))
    return store


def remove_stale(parent: str | None = None) -> list[str]:
    """Remove this user's store directories whose caller has died; returns what was removed."""
    import psutil
    removed = []
    for path in Path(parent or tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        try:
            pid = int(path.name[len(PREFIX):].split("-", 1)[0])
            if path.stat().st_uid != os.geteuid() or psutil.pid_exists(pid):
                continue
        except (ValueError, OSError):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    return removed
