"""Throw-away Unix users for the tests that need a second (or third) person on the node.

Made with ``useradd`` (root only) under a random name, removed with ``userdel -r`` at the end,
whatever happened. ``reason_unavailable()`` says why such a test must be skipped here.
``shared_course()`` stages a copy of ``labutils`` and the labs that those users can read, as the
clone may lie where they cannot (CI's clone under /root, mode 0700).
"""
from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def reason_unavailable() -> str | None:
    """None where users can be made; else why not (for ``pytest.skip``)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "needs root to create throw-away Unix users (run as root, e.g. in CI's container)"
    for tool in ("useradd", "userdel"):
        if shutil.which(tool) is None:
            return f"no {tool} on this machine (package 'passwd')"
    return None


@contextlib.contextmanager
def throwaway_user(prefix: str = "lab", home: bool = False):
    """A new Unix user (``pwd`` entry) for the duration of the block; home 0700 when ``home``."""
    name = f"{prefix}{secrets.token_hex(3)}"
    cmd = ["useradd", "--shell", "/bin/sh", "--user-group"]
    cmd += ["--create-home"] if home else ["--no-create-home", "--home-dir", "/nonexistent"]
    subprocess.run([*cmd, name], check=True, capture_output=True, timeout=30)
    try:
        entry = pwd.getpwnam(name)
        if home:
            os.chmod(entry.pw_dir, 0o700)
        yield entry
    finally:
        kill_processes_of(name)
        subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=30)


@contextlib.contextmanager
def shared_course():
    """A world-readable copy of ``labutils`` and the labs with their recordings (what the hub's
    workspace step copies), in a fresh temporary folder removed at the end; yields the folder, for
    the other users' ``PYTHONPATH``: it comes before the venv's editable install of the clone."""
    root = Path(tempfile.mkdtemp(prefix="labutils-course-"))
    try:
        shutil.copytree(REPO / "labutils", root / "labutils",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (root / "notebooks" / "recorded").mkdir(parents=True)
        for nb in (REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"):
            shutil.copy(nb, root / "notebooks")
        for rec in (REPO / "notebooks" / "recorded").glob("*.json"):
            shutil.copy(rec, root / "notebooks" / "recorded")
        for path in [root, *root.rglob("*")]:
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def processes_of(name: str) -> list:
    """Live processes owned by user ``name``."""
    import psutil
    found = []
    for p in psutil.process_iter(["username", "status"]):
        if p.info["username"] == name and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def kill_processes_of(name: str) -> list:
    """SIGKILL, one pid at a time, whatever the throw-away user ``name`` still runs; returns them."""
    import psutil
    left = processes_of(name)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()
    psutil.wait_procs(left, timeout=5)
    return left


def run_as(user: pwd.struct_passwd, argv: list[str], timeout_s: float = 60.0, extra_env: dict | None = None,
           **kw) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` (no supplementary groups, in /), output captured as text; the
    environment is a bare one plus ``extra_env``."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": user.pw_dir, "USER": user.pw_name,
           "LANG": "C.UTF-8", **(extra_env or {})}
    return subprocess.run(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=env,
                          cwd="/", capture_output=True, text=True, timeout=timeout_s, **kw)


def python_usable_by(user: pwd.struct_passwd, modules: str = "torch", extra_env: dict | None = None) -> str | None:
    """None when ``user`` can run this interpreter and import ``modules``; else why not."""
    try:
        r = run_as(user, [sys.executable, "-c", f"import {modules}"], timeout_s=120, extra_env=extra_env)
    except PermissionError as exc:
        return (f"a second user cannot run this Python ({sys.executable}): {exc}; the interpreter and "
                f"the venv must be readable by all (e.g. a venv of /usr/bin/python3, not one under /root)")
    if r.returncode:
        return (f"a second user cannot import {modules} with this Python ({sys.executable}): "
                f"{(r.stderr.strip().splitlines() or ['?'])[-1]} (the venv must be readable by all)")
    return None
