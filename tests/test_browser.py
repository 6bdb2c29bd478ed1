"""JupyterLab in a real browser: labs 00, 04 and 07 of a workspace copy, run as a learner runs them.

    pytest tests/test_browser.py         # alone (needs Chromium and Playwright, see below)

It makes a workspace (``python -m labutils workspace``) in a temporary folder, starts JupyterLab there on
127.0.0.1 (a port the OS picks, a random token, its own Jupyter config/data/runtime folders, no news or
update checks), and drives headless Chromium through Playwright: open a lab, Run -> Run All Cells, wait,
save. It asserts what a learner would see: no error output except in cells tagged ``raises-exception``,
every plot rendered as an image, the lab 04 explorer's slider moved and its output redrawn (and, where the
committed lab saves widget state, its widgets drawn before anything runs: the copy is trusted), the course's
committed notebooks untouched, and -- after a learner's extra cell has started a pool of ranks in lab 07 --
no kernel or rank process left once the server has stopped.

Needs Debian's ``chromium`` (``apt-get install chromium``; another Chromium or Chrome through
``$LABUTILS_CHROMIUM``) and ``pip install playwright`` (it drives that browser and never downloads one).
Without them the test is skipped and says which is missing; ``.ci/run`` installs both where it can.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import psutil
import pytest

from labutils.commands import workspace

LABS = ("00_setup", "04_pipeline", "07_interactive_ranks")
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# (Playwright adds --headless and a fresh --user-data-dir of its own for every launch)
# JupyterLab settings for the test's server only: no news/update toasts over the notebook
SETTING_OVERRIDES = {"@jupyterlab/apputils-extension:notification": {"fetchNews": "false",
                                                                     "checkForUpdates": False},
                     # each cell's execution times in the saved notebook: proof that it ran now (the
                     # committed copy has outputs and counts already), and the slowest cells are printed
                     "@jupyterlab/notebook-extension:tracker": {"recordTiming": True}}
MARKER = "LABUTILS_BROWSER_TEST"     # set in the server's environment: its kernels and ranks inherit it
LAB_TIMEOUT_S = 600                  # one lab's Run All: tens of seconds on 2 idle cores, minutes under load


def _chromium() -> str | None:
    for candidate in (os.environ.get("LABUTILS_CHROMIUM"), "chromium", "chromium-browser",
                      "google-chrome-stable", "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def _requirements() -> str:
    """'' when the browser test can run here, else why not."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright is not installed (`pip install playwright`; it uses the system's Chromium)"
    if _chromium() is None:
        return "no Chromium found (`apt-get install chromium`, or set $LABUTILS_CHROMIUM to a Chromium/Chrome)"
    try:
        import jupyterlab  # noqa: F401
    except ImportError:
        return "JupyterLab is not installed (`pip install -r requirements.txt`)"
    return ""


WHY_SKIP = _requirements()
pytestmark = [pytest.mark.skipif(bool(WHY_SKIP), reason=f"browser test skipped: {WHY_SKIP}"),
              pytest.mark.timeout(1200)]


def _marked_processes(tag: str) -> list[psutil.Process]:
    """Every live process whose environment carries this test's marker: kernels, ranks, the server."""
    found = []
    for p in psutil.process_iter():
        try:
            if p.status() != psutil.STATUS_ZOMBIE and p.environ().get(MARKER) == tag:
                found.append(p)
        except psutil.Error:
            pass
    return found


def _commands(procs: list[psutil.Process]) -> list[str]:
    """Each process's command line, read now (it may be gone when the test reports)."""
    out = []
    for p in procs:
        try:
            out.append(" ".join(p.cmdline()))
        except psutil.Error:
            pass
    return out


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid}: {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            out.append(f"{p.pid}: (gone)")
    return out


class LabServer:
    """JupyterLab on 127.0.0.1, in ``root``, with a random token, and everything Jupyter writes in ``home``."""

    def __init__(self, root: Path, home: Path):
        self.root, self.home = root, home
        self.token = secrets.token_hex(24)
        self.tag = secrets.token_hex(8)
        cfg, self.runtime = home / "config", home / "runtime"
        (cfg / "labconfig").mkdir(parents=True)
        (cfg / "labconfig" / "default_setting_overrides.json").write_text(json.dumps(SETTING_OVERRIDES))
        (cfg / "jupyter_server_config.json").write_text(json.dumps({"LabApp": {
            "news_url": None,
            "check_for_updates_class": "jupyterlab.handlers.announcements.NeverCheckForUpdate",
            "user_settings_dir": str(home / "settings"), "workspaces_dir": str(home / "workspaces")}}))
        self.env = dict(os.environ, JUPYTER_CONFIG_DIR=str(cfg), JUPYTER_DATA_DIR=str(home / "data"),
                        JUPYTER_RUNTIME_DIR=str(self.runtime), IPYTHONDIR=str(home / "ipython"),
                        JUPYTER_TOKEN=self.token, **{MARKER: self.tag})
        self.env.pop("JUPYTER_PATH", None)
        self.env.pop("JUPYTER_CONFIG_PATH", None)
        self.log = home / "server.log"
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout_s: float = 120) -> None:
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.ip=127.0.0.1",
               "--ServerApp.port=0", "--ServerApp.port_retries=0", f"--ServerApp.root_dir={self.root}"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")           # CI and containers run as root
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:       # the server writes its port and URL once it listens
            for info in self.runtime.glob(f"jpserver-{self.proc.pid}.json"):
                self.url = f"http://127.0.0.1:{json.loads(info.read_text())['port']}"
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise RuntimeError(f"JupyterLab did not start (exit {self.proc.poll()}):\n{self.log.read_text()[-3000:]}")

    def stop(self, timeout_s: float = 60) -> int:
        """What File -> Shut Down does (POST /api/shutdown); returns the server's exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        req = urllib.request.Request(f"{self.url}/api/shutdown", method="POST",
                                     headers={"Authorization": f"token {self.token}"})
        try:
            urllib.request.urlopen(req, timeout=10).close()
        except OSError:
            self.proc.terminate()
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def kill_leftovers(self) -> None:
        left = _marked_processes(self.tag)
        for p in left:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(left, timeout=5)


def _digest(course: Path) -> dict[str, str]:
    """The course's labs and recordings, byte for byte."""
    return {rel: hashlib.sha256((course / rel).read_bytes()).hexdigest() for rel in workspace.course_files(course)}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A workspace, the JupyterLab server on it and a headless Chromium page; torn down after the module."""
    from playwright.sync_api import sync_playwright
    home = tmp_path_factory.mktemp("jupyter-home")
    root = home / "my-labs"
    with pytest.MonkeyPatch.context() as mp:   # the copies' trust signatures go where the server looks
        mp.setenv("JUPYTER_DATA_DIR", str(home / "data"))
        workspace.make_workspace(root)
    course = workspace.course_notebooks()
    committed = _digest(course)
    server = LabServer(root, home)
    pw = browser = None
    try:
        server.start()
        pw = sync_playwright().start()
        browser = pw.chromium.launch(executable_path=_chromium(), args=CHROMIUM_FLAGS, headless=True)
        context = browser.new_context(viewport={"width": 1400, "height": 1000})
        context.set_default_timeout(60_000)
        yield {"server": server, "context": context, "page": None, "root": root, "home": home,
               "processes": [], "course": course, "committed": committed}
    finally:
        if browser is not None:
            browser.close()
        if pw is not None:
            pw.stop()
        server.stop()
        server.kill_leftovers()


# ---- driving JupyterLab as a learner does -------------------------------------------------------------

NOTEBOOK = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook"     # the notebook in the current tab
RUNNING_OR_QUEUED = """() => [...document.querySelectorAll('.jp-NotebookPanel:not(.lm-mod-hidden) .jp-InputPrompt')]
    .filter(e => e.textContent.trim() === '[*]:').length"""


def _open(lab: dict, name: str) -> None:
    """Open a lab as a learner does: the first from its URL, the next from the file browser."""
    server = lab["server"]
    if lab.get("page") is None:      # JupyterLab loads once (tens of seconds on 2 cores); ?reset: no old tabs
        page = lab["page"] = lab["context"].new_page()
        page.goto(f"{server.url}/lab/workspaces/browser-test/tree/{name}.ipynb?reset&token={server.token}")
    else:                            # close the last lab's tab (its kernel keeps running), open the next
        page = lab["page"]
        _save(lab)                   # saved, closing asks nothing (even after a failed test left it changed)
        page.locator(".lm-TabBar-tab.jp-mod-current .lm-TabBar-tabCloseIcon").click()
        page.locator(".jp-DirListing-itemText", has_text=f"{name}.ipynb").dblclick()
    page.locator(".lm-TabBar-tab.jp-mod-current", has_text=f"{name}.ipynb").wait_for()
    page.locator(f"{NOTEBOOK} .jp-Cell").first.wait_for()
    # the kernel named in the notebook's kernelspec starts by itself: no "Select Kernel" dialog
    page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"^Python 3.*\| Idle$")).wait_for()
    assert page.locator(".jp-Dialog").count() == 0, page.locator(".jp-Dialog").inner_text()


def _run_all_and_wait(lab: dict, name: str) -> float:
    page = lab["page"]
    t0 = time.monotonic()
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    deadline, started, quiet_since = t0 + LAB_TIMEOUT_S, False, None
    while time.monotonic() < deadline:   # done: nothing running or queued, kernel idle, for 2 s in a row
        queued = page.evaluate(RUNNING_OR_QUEUED)
        started = started or queued > 0 or time.monotonic() - t0 > 10
        idle = started and queued == 0 and page.locator(".jp-StatusBar-TextItem", has_text="| Idle").count() > 0
        quiet_since = (quiet_since or time.monotonic()) if idle else None
        if quiet_since and time.monotonic() - quiet_since > 2:
            return time.monotonic() - t0
        time.sleep(0.25)
    _screenshot(lab, f"{name}-timeout")
    raise AssertionError(f"{name}: Run All Cells not finished after {LAB_TIMEOUT_S} s")


def _save(lab: dict, name: str = "") -> dict:
    """Save with Ctrl+S (File -> Save Notebook); returns the lab as written to the workspace."""
    page = lab["page"]
    page.locator(NOTEBOOK).click(position={"x": 5, "y": 5})
    page.keyboard.press("Escape")
    page.keyboard.press("Control+s")
    page.locator(".lm-TabBar-tab.jp-mod-current:not(.jp-mod-dirty)").wait_for()
    return json.loads((lab["root"] / f"{name}.ipynb").read_text()) if name else {}


def _timing(cell: dict) -> tuple[datetime, float] | None:
    """When the cell started running and for how long (JupyterLab's recordTiming), or None."""
    t = cell.get("metadata", {}).get("execution", {})
    if "iopub.status.busy" not in t or "shell.execute_reply" not in t:
        return None
    start, end = (datetime.fromisoformat(t[k].replace("Z", "+00:00")) for k in ("iopub.status.busy",
                                                                                "shell.execute_reply"))
    return start, (end - start).total_seconds()


def _print_slowest(nb: dict) -> None:
    rows = sorted((t[1], i) for i, c in enumerate(nb["cells"]) if (t := _timing(c)))
    print("   slowest cells: " + ", ".join(f"[{i}] {secs:.1f} s" for secs, i in rows[::-1][:5]))


def _screenshot(lab: dict, what: str) -> Path:
    path = lab["home"] / f"{what}.png"
    lab["page"].screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def _check_run(lab: dict, name: str, nb: dict, since: datetime) -> None:
    """Every code cell ran now; errors only where the lab makes them on purpose; plots are images."""
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    not_run = [i for i, c in enumerate(code) if "".join(c["source"]).strip()
               and not ((t := _timing(c)) and t[0] >= since)]
    errors = [(c.get("metadata", {}).get("tags", []), "\n".join(o.get("traceback", []))[-2000:])
              for c in code for o in c["outputs"] if o["output_type"] == "error"]
    unexpected = [tb for tags, tb in errors if "raises-exception" not in tags]
    assert not unexpected, f"{name}: error output in a cell not tagged raises-exception:\n{unexpected[0]}"
    assert not not_run, f"{name}: code cells {not_run} (of {len(code)}) did not run"
    pngs = sum("image/png" in o.get("data", {}) for c in code for o in c["outputs"])
    widths = lab["page"].evaluate(f"""() => [...document.querySelectorAll('{NOTEBOOK} .jp-OutputArea-output img')]
        .filter(i => i.src.startsWith('data:image/png')).map(i => i.naturalWidth)""")
    assert len(widths) >= pngs > 0, f"{name}: {pngs} PNG outputs saved, {len(widths)} shown as images"
    assert min(widths) > 0, f"{name}: an image did not decode ({widths})"
    lab["processes"] += _commands(_marked_processes(lab["server"].tag))


@pytest.mark.parametrize("name", LABS)
def test_lab_runs_in_jupyterlab(lab, name):
    _open(lab, name)
    if name == "04_pipeline":
        _saved_widgets_render(lab, name)
    since = datetime.now(timezone.utc)
    secs = _run_all_and_wait(lab, name)
    print(f"{name}: Run All Cells took {secs:.1f} s")
    nb = _save(lab, name)
    _print_slowest(nb)
    try:
        _check_run(lab, name, nb, since)
    except AssertionError:
        _screenshot(lab, f"{name}-failed")
        raise
    if name == "04_pipeline":
        _move_slider(lab)
    if name == "07_interactive_ranks":
        _leave_ranks_running(lab)


def _explorer(lab: dict):
    return lab["page"].locator(f"{NOTEBOOK} .jp-CodeCell", has_text="widgets.interactive(explore")


def _saved_widgets_render(lab: dict, name: str) -> None:
    """Before anything runs, the explorer shows its sliders from the saved widget state: the workspace
    copy is trusted (an untrusted notebook shows 'interactive(children=(IntSlider(...' as text)."""
    nb = json.loads((lab["root"] / f"{name}.ipynb").read_text())
    saved = nb["metadata"].get("widgets", {}).get("application/vnd.jupyter.widget-state+json", {})
    views = [o["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] for c in nb["cells"]
             if "interactive(explore" in "".join(c["source"]) for o in c.get("outputs", [])
             if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    if not views or views[0] not in saved.get("state", {}):
        print(f"   {name}: the committed notebook saves no state for the explorer's widgets: not checked")
        return
    cell = _explorer(lab)
    cell.scroll_into_view_if_needed()
    cell.locator(".widget-slider").first.wait_for()
    assert "interactive(children=" not in cell.locator(".jp-Cell-outputArea").inner_text()


def _move_slider(lab: dict) -> None:
    """The stages x micro-batches explorer: one step of the p slider redraws the simulation."""
    page = lab["page"]
    cell = _explorer(lab)
    slider = cell.locator(".widget-slider").first
    output = cell.locator(".widget-output").first
    slider.scroll_into_view_if_needed()
    output.get_by_text("p = 2,").wait_for()
    before = output.inner_text()
    img_before = output.locator("img").first.get_attribute("src")
    slider.locator(".noUi-handle").first.focus()
    page.keyboard.press("ArrowRight")
    output.get_by_text("p = 3,").wait_for()
    assert output.inner_text() != before
    assert output.locator("img").first.get_attribute("src") != img_before
    assert slider.locator(".widget-readout").inner_text().strip() == "3"


def _leave_ranks_running(lab: dict) -> None:
    """A learner's own cell at the end: a pool of ranks still alive when the server is shut down."""
    page = lab["page"]
    page.locator(f"{NOTEBOOK} .jp-Cell").last.locator(".jp-InputPrompt").click()
    page.keyboard.press("Escape")
    page.keyboard.press("b")                        # command mode: new cell below
    page.keyboard.press("Enter")                    # edit it
    page.keyboard.type("%ranks start 2")
    page.keyboard.press("Shift+Enter")
    new = page.locator(f"{NOTEBOOK} .jp-CodeCell", has_text="%ranks start 2").last
    new.locator(".jp-OutputArea-output", has_text="RankPool").wait_for()
    running = _commands(_marked_processes(lab["server"].tag))
    assert sum("labutils" in cmd for cmd in running) >= 2, running
    lab["processes"] += running


def test_no_kernel_or_rank_left_after_server_stops(lab):
    if not lab["processes"]:
        pytest.skip("checks what the lab tests above leave behind: run it with them")
    assert any("ipykernel" in cmd for cmd in lab["processes"]), "no kernel was seen while the labs ran"
    assert lab["server"].stop() == 0, lab["server"].log.read_text()[-3000:]
    deadline = time.monotonic() + 20                # kernels get a few seconds to shut down cleanly
    while (left := _marked_processes(lab["server"].tag)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"left behind after the server stopped: {_describe(left)}"
    assert _digest(lab["course"]) == lab["committed"], "the course's committed notebooks changed"
