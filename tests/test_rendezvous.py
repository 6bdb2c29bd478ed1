"""The ranks' private rendezvous: a FileStore in a 0700 directory, removed by its owner or, when the
owner was killed outright, by the next owner.

    pytest -n 0 tests/test_rendezvous.py -q      # seconds
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from labutils import rendezvous


def test_store_is_private_usable_and_removed_on_close():
    owner = rendezvous.PrivateStore(timeout_s=10)
    try:
        assert stat.S_IMODE(os.stat(owner.directory).st_mode) == 0o700
        a, b = rendezvous.join(owner.address, 10), rendezvous.join(owner.address, 10)
        a.set("k", "v")
        assert b.get("k") == b"v"
        directory = owner.directory
    finally:
        owner.close()
        owner.close()  # idempotent
    assert not os.path.exists(directory)


def test_a_killed_owners_directory_goes_with_the_next_store():
    script = textwrap.dedent("""
        import os, sys
        from labutils import rendezvous
        s = rendezvous.PrivateStore()
        print(s.directory, flush=True)
        os.kill(os.getpid(), 9)
    """)
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, env=env)
    left = r.stdout.strip()
    assert r.returncode == -9 and os.path.isdir(left)
    mine = rendezvous.PrivateStore()
    try:
        assert not os.path.exists(left)
        assert os.path.isdir(mine.directory)  # a live owner's is kept
        assert mine.directory not in rendezvous.remove_stale()
    finally:
        mine.close()
