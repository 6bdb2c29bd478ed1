"""The ranks' private rendezvous: a FileStore in a 0700 directory, removed by its owner or, when the
owner was killed outright, by the next owner.

    pytest -n 0 tests/test_rendezvous.py -q      # seconds
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
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


def test_a_store_in_the_callers_directory_leaves_the_directory_to_it(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o755)
    owner = rendezvous.PrivateStore(10, directory=run_dir)
    assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700  # made private, whoever made it
    assert os.path.dirname(owner.address) == str(run_dir)
    rendezvous.join(owner.address, 10).set("k", "v")
    owner.close()
    assert run_dir.is_dir() and not os.path.exists(owner.address)


def test_launch_and_pool_keep_run_files_and_store_in_one_private_folder_and_leave_none(tmp_path, monkeypatch):
    import labutils

    def _folders(rank, world_size):  # defined here: sent by value, as a notebook's function is
        import os
        import tempfile
        return sorted(os.listdir(tempfile.gettempdir()))

    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the ranks' temporary folder too
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    during = labutils.launch(_folders, world_size=2, backend="gloo", output="quiet")[0]
    assert len(during) == 1 and during[0].startswith(f"labutils-{os.getpid()}_"), during  # no second folder
    assert not list(tmp_path.iterdir())
    with labutils.RankPool(2, "gloo", output="quiet") as pool:
        (run_dir,) = tmp_path.iterdir()
        assert run_dir.name.startswith(f"labutils-{os.getpid()}_")
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        assert rendezvous.STORE_FILE in os.listdir(run_dir)  # the ranks met there
        assert pool.run(_folders) == [[run_dir.name]] * 2
    assert not list(tmp_path.iterdir())
