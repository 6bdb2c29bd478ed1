"""The workshop hub for real: JupyterHub + configurable-http-proxy, two learners, a GPU slice each.

Starts ``classroom/jupyterhub_config.py`` on 127.0.0.1 with ports the OS picks and 4 fake GPUs
(``LABUTILS_FAKE_GPUS``: the slice logic is what runs, there are no GPUs), for two Unix users made
for the test. Both log in through the REST API; the second also through headless Chromium, whose
login starts its server. Each server must have its own, disjoint slice in ``CUDA_VISIBLE_DEVICES``,
its own ``~/my-labs`` made on first login, run the first cells of lab 00 there (ranks included), and
be unable to read the other's files. At the end the hub, the proxy, the servers, their kernels and
ranks, and the users are gone.

    pytest -n 0 tests/test_hub.py -q      # root, jupyterhub, configurable-http-proxy (else skipped, with why)
"""
from __future__ import annotations

import asyncio
import json
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest

from labutils import procs
from labutils.classroom import book, slices
import unix_users

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "classroom" / "jupyterhub_config.py"
FAKE_GPUS = "4"          # two slices of two
START_S = 90             # hub up, or a server up, within this (2 loaded cores)
CELL_S = 120             # one cell of lab 00
FIRST_RESULT = "every rank holds"   # lab 00 runs up to the checked result of its first launch


def _why_skip() -> str | None:
    why = unix_users.reason_unavailable()
    if why:
        return why
    try:
        import jupyterhub  # noqa: F401
        import jupyterhub_idle_culler  # noqa: F401
        import requests  # noqa: F401
    except ImportError as exc:
        return f"{exc.name} is not installed (pip install -r requirements.txt)"
    if shutil.which("configurable-http-proxy") is None:
        return "configurable-http-proxy is not on PATH (npm install -g configurable-http-proxy)"
    return None


WHY = _why_skip()
pytestmark = [pytest.mark.skipif(WHY is not None, reason=f"hub test skipped: {WHY}"),
              pytest.mark.timeout(600)]  # about 2.5 min on 2 loaded cores; the hub is stopped on timeout too


def _chromium() -> str | None:
    for name in (os.environ.get("LABUTILS_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Hub:
    """A JupyterHub process (and the proxy it starts) on 127.0.0.1, stopped by ``stop``."""

    def __init__(self, state: Path, users: list[str], password: str, course: Path):
        self.state, self.password = state, password
        self.port = procs.free_loopback_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, LABS_HUB_IP="127.0.0.1", LABS_HUB_PORT=str(self.port),
                   LABS_HUB_API_PORT=str(procs.free_loopback_port()),
                   LABS_PROXY_API_PORT=str(procs.free_loopback_port()),
                   LABS_SPAWNER="local", LABS_AUTH="shared", LABS_SHARED_PASSWORD=password,
                   LABS_USERS=",".join(users), LABS_STATE_DIR=str(state), LABS_SLICE_SIZE="2",
                   LABUTILS_FAKE_GPUS=FAKE_GPUS, LABS_IDLE_TIMEOUT_S="600", PYTHONPATH=str(course),
                   PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{os.environ.get('PATH', '')}")
        self.log = open(state / "hub.log", "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(CONFIG)], cwd=state,
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.family: set[int] = {self.proc.pid}

    def tail(self) -> str:
        self.log.flush()
        return (self.state / "hub.log").read_text()[-4000:]

    def api(self, method: str, path: str, token: str | None = None, **kw):
        import requests
        headers = {"Authorization": f"token {token}"} if token else {}
        return requests.request(method, f"{self.url}{path}", headers=headers, timeout=30, **kw)

    def wait_up(self) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the hub exited:\n{self.tail()}"
            try:
                if self.api("GET", "/hub/api/").status_code == 200:
                    self.note_family()
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"the hub did not answer within {START_S} s:\n{self.tail()}")

    def note_family(self) -> None:
        try:
            self.family |= {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)}
        except psutil.Error:
            pass

    def login(self, name: str) -> str:
        """A token for ``name`` from its password: a login through the REST API."""
        r = self.api("POST", f"/hub/api/users/{name}/tokens",
                     json={"auth": {"username": name, "password": self.password}, "expires_in": 900})
        assert r.status_code in (200, 201), (r.status_code, r.text)
        return r.json()["token"]

    def wait_server(self, name: str, token: str) -> None:
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            server = self.api("GET", f"/hub/api/users/{name}", token).json().get("servers", {}).get("", {})
            if server.get("ready"):
                self.note_family()
                return
            time.sleep(0.5)
        raise AssertionError(f"{name}'s server was not ready within {START_S} s:\n{self.tail()}")

    def stop(self) -> list[str]:
        """SIGTERM the hub (it stops the servers, the culler and the proxy), then reap; returns what
        was still alive after it and had to be killed."""
        self.note_family()
        left = []
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                left.append(f"hub {self.proc.pid}")
        alive = []
        for pid in sorted(self.family - {self.proc.pid}):
            try:
                p = psutil.Process(pid)
                if p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=10)
        for p in alive + ([psutil.Process(self.proc.pid)] if self.proc.poll() is None else []):
            left.append(f"{p.pid} {' '.join(p.cmdline())[:100]}")
            p.kill()
        self.proc.wait(10)
        self.log.close()
        return left


async def _run_cells(ws_url: str, token: str, codes: list[str]) -> list[tuple[str, str]]:
    """Execute ``codes`` in a kernel over its websocket; ``[(status, text output), ...]``."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect
    conn = await websocket_connect(HTTPRequest(ws_url, headers={"Authorization": f"token {token}"}))
    session, results = uuid.uuid4().hex, []
    try:
        for code in codes:
            msg_id = uuid.uuid4().hex
            conn.write_message(json.dumps({
                "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "test",
                           "session": session, "version": "5.3", "date": datetime.now(timezone.utc).isoformat()},
                "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                            "allow_stdin": False, "stop_on_error": True}}))
            status, idle, text = None, False, []
            while status is None or not idle:
                raw = await asyncio.wait_for(conn.read_message(), CELL_S)
                assert raw is not None, "the kernel's websocket closed"
                msg = json.loads(raw)
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                kind, content = msg["header"]["msg_type"], msg["content"]
                if kind == "stream":
                    text.append(content["text"])
                elif kind in ("execute_result", "display_data"):
                    text.append(content["data"].get("text/plain", "") + "\n")
                elif kind == "error":
                    text.append("\n".join(content["traceback"]))
                elif kind == "execute_reply":
                    status = content["status"]
                elif kind == "status" and content["execution_state"] == "idle":
                    idle = True
            results.append((status, "".join(text)))
    finally:
        conn.close()
    return results


def run_first_cells(hub: Hub, name: str, token: str, other_home: str) -> tuple[dict, list]:
    """In ``name``'s server: lab 00's first code cells from its own workspace, then a probe."""
    base = f"/user/{name}/api"
    listing = hub.api("GET", f"{base}/contents/my-labs", token)
    assert listing.status_code == 200, (listing.status_code, listing.text[:300])
    lab = next(item["path"] for item in listing.json()["content"] if item["name"].startswith("00_"))
    nb = hub.api("GET", f"{base}/contents/{lab}", token).json()["content"]
    codes = [c["source"] for c in nb["cells"] if c["cell_type"] == "code"]
    first = next(i for i, code in enumerate(codes) if FIRST_RESULT in code)   # imports ... first launch, its result
    codes = codes[:first + 1]
    probe = ("import json, os\n"
             f"try:\n    open({str(Path(other_home, lab))!r}).read(); other = 'READ'\n"
             "except PermissionError:\n    other = 'denied'\n"
             "print(json.dumps({'cvd': os.environ.get('CUDA_VISIBLE_DEVICES'), 'cwd': os.getcwd(),"
             " 'user': os.environ.get('USER'), 'other': other, 'uid': os.getuid()}))")
    kernel = hub.api("POST", f"{base}/kernels", token, json={"name": "python3", "path": "my-labs"})
    assert kernel.status_code in (200, 201), kernel.text
    kid = kernel.json()["id"]
    ws = f"ws://127.0.0.1:{hub.port}{base}/kernels/{kid}/channels"
    try:
        results = asyncio.run(_run_cells(ws, token, codes + [probe]))
    finally:
        hub.api("DELETE", f"{base}/kernels/{kid}", token)
    *cells, (probe_status, probe_out) = results
    assert probe_status == "ok", probe_out
    return json.loads(probe_out.strip().splitlines()[-1]), cells


def browser_login(hub: Hub, name: str) -> None:
    """Log ``name`` in through the hub's login page in headless Chromium; its JupyterLab must load."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=_chromium(), headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page()
            page.goto(f"{hub.url}/hub/login", timeout=START_S * 1000)
            page.fill("#username_input", name)
            page.fill("#password_input", hub.password)
            page.click("#login_submit")
            page.wait_for_url(f"**/user/{name}/lab**", timeout=START_S * 1000)
            page.wait_for_selector("#jp-main-dock-panel", timeout=START_S * 1000)
        finally:
            browser.close()


def test_two_learners_get_their_own_slices_workspaces_and_files(tmp_path):
    os.chmod(tmp_path, 0o700)
    with unix_users.throwaway_user("ada", home=True) as ada, unix_users.throwaway_user("bob", home=True) as bob, \
            unix_users.shared_course() as course:  # the learners' labutils and labs: the clone may be private
        why = unix_users.python_usable_by(ada, "torch, labutils, jupyterhub", {"PYTHONPATH": str(course)})
        if why:
            pytest.skip(why)
        hub = Hub(tmp_path, [ada.pw_name, bob.pw_name], password=secrets.token_urlsafe(12), course=course)
        left = []
        try:
            hub.wait_up()
            tokens = {u.pw_name: hub.login(u.pw_name) for u in (ada, bob)}
            r = hub.api("POST", f"/hub/api/users/{ada.pw_name}/server", tokens[ada.pw_name])
            assert r.status_code in (201, 202), (r.status_code, r.text)
            if _chromium() is not None and _playwright():
                browser_login(hub, bob.pw_name)  # the login page spawns bob's server
            else:
                r = hub.api("POST", f"/hub/api/users/{bob.pw_name}/server", tokens[bob.pw_name])
                assert r.status_code in (201, 202), (r.status_code, r.text)
            for u in (ada, bob):
                hub.wait_server(u.pw_name, tokens[u.pw_name])
            seen = {}
            for me, other in ((ada, bob), (bob, ada)):
                probe, cells = run_first_cells(hub, me.pw_name, tokens[me.pw_name], other.pw_dir)
                failed = [out for status, out in cells if status != "ok"]
                assert not failed, f"{me.pw_name}: a cell of lab 00 failed:\n{failed[0][-2000:]}"
                assert f"{FIRST_RESULT} 3 : True" in cells[-1][1], cells[-1][1]
                assert probe["uid"] == me.pw_uid and probe["user"] == me.pw_name
                assert probe["cwd"] == os.path.join(me.pw_dir, "my-labs")
                assert probe["other"] == "denied", f"{me.pw_name} could read {other.pw_name}'s lab"
                seen[me.pw_name] = probe["cvd"]
            plan = slices.plan_slices(slices.fake_topology(FAKE_GPUS), 2)
            given = {name: tuple(int(g) for g in cvd.split(",")) for name, cvd in seen.items()}
            assert sorted(given.values()) == sorted(plan), (given, plan)  # each its own, disjoint
            assert book.load_state(tmp_path / "slices.json") == given  # what `classroom check --hub-state` reads
            for u in (ada, bob):
                r = hub.api("DELETE", f"/hub/api/users/{u.pw_name}/server", tokens[u.pw_name])
                assert r.status_code in (202, 204), (r.status_code, r.text)
        finally:
            left += hub.stop()
            for u in (ada, bob):
                left += [f"{p.pid} of {u.pw_name}" for p in unix_users.kill_processes_of(u.pw_name)]
        assert not left, f"left running after the hub stopped: {left}"
        assert not (tmp_path / "jupyterhub-proxy.pid").exists() or not _pid_alive(tmp_path / "jupyterhub-proxy.pid")
        assert book.load_state(tmp_path / "slices.json") == {}  # every slice given back
    for u in (ada, bob):
        with pytest.raises(KeyError):
            pwd.getpwnam(u.pw_name)  # the users are gone too


def _pid_alive(pid_file: Path) -> bool:
    try:
        return psutil.pid_exists(int(pid_file.read_text().strip()))
    except (OSError, ValueError):
        return False


def _playwright() -> bool:
    try:
        import playwright.sync_api  # noqa: F401
        return True
    except ImportError:
        return False
