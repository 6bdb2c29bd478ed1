"""``python -m labutils workspace``: copies apart from the committed notebooks, edits never lost, every refusal."""
import json
import subprocess

import pytest

from labutils import recorded
from labutils.__main__ import main
from labutils.commands import run_labs
from labutils.commands import workspace as ws


@pytest.fixture(autouse=True)
def _own_jupyter_data_dir(tmp_path, monkeypatch):
    """Trust signatures go to a scratch Jupyter data dir, not the user's."""
    monkeypatch.setenv("JUPYTER_DATA_DIR", str(tmp_path / "jupyter-data"))
    monkeypatch.delenv(recorded.DIR_ENV, raising=False)


def _nb(path, text):
    import nbformat
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(f"print({text!r})")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture
def course(tmp_path):
    """A small stand-in for the course's notebooks/ folder."""
    src = tmp_path / "course" / "notebooks"
    (src / "recorded").mkdir(parents=True)
    _nb(src / "00_setup.ipynb", "setup")
    _nb(src / "01_comm.ipynb", "comm")
    (src / "recorded" / "00_bw.json").write_text('{"data": 1}')
    (src / "sanitize.cfg").write_text("[x]\n")
    (src / "scratch.ipynb").write_text("{}")
    return src


def _files(d):
    return sorted(str(p.relative_to(d)) for p in d.rglob("*") if p.is_file())


def test_fresh_copy_is_apart_and_git_ignored(course, tmp_path):
    dest = tmp_path / "labs"
    res = ws.make_workspace(dest, src=course)
    assert res["copied"] == ["00_setup.ipynb", "01_comm.ipynb", "recorded/00_bw.json"]
    assert _files(dest) == [".gitignore", ws.MANIFEST, "00_setup.ipynb", "01_comm.ipynb", "recorded/00_bw.json"]
    for rel in res["copied"]:
        assert (dest / rel).read_bytes() == (course / rel).read_bytes()
        assert (dest / rel).stat().st_ino != (course / rel).stat().st_ino   # a copy, never a link
    before = (course / "00_setup.ipynb").read_bytes()
    with open(dest / "00_setup.ipynb", "a") as f:   # what an autosave does to the copy ...
        f.write(" ")
    assert (course / "00_setup.ipynb").read_bytes() == before   # ... leaves the course's file alone
    assert (dest / ".gitignore").read_text().splitlines()[-1] == "*"
    assert set(json.loads((dest / ws.MANIFEST).read_text())["files"]) == set(res["copied"])
    assert res["trust_error"] == []


def test_workspace_inside_a_git_repo_stays_out_of_git(course, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    ws.make_workspace(repo / "somewhere", src=course)
    status = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout
    assert status == ""


def test_copies_are_trusted(course, tmp_path):
    import nbformat
    from nbformat.sign import NotebookNotary
    dest = tmp_path / "labs"
    ws.make_workspace(dest, src=course)
    assert NotebookNotary().check_signature(nbformat.read(dest / "01_comm.ipynb", as_version=4))


def test_trust_failure_is_a_note_not_an_error(course, tmp_path, monkeypatch, capsys):
    from nbformat.sign import NotebookNotary

    def broken(self, nb):
        raise OSError("read-only data dir")
    monkeypatch.setattr(NotebookNotary, "sign", broken)
    monkeypatch.setattr(ws, "course_notebooks", lambda: course)
    assert main(["workspace", str(tmp_path / "labs")]) == 0
    out = capsys.readouterr().out
    assert "could not mark the copies trusted (OSError: read-only data dir)" in out
    assert "jupyter trust" in out and (tmp_path / "labs" / "00_setup.ipynb").exists()


def test_rerun_update_and_force(course, tmp_path):
    dest = tmp_path / "labs"
    ws.make_workspace(dest, src=course)
    assert ws.make_workspace(dest, src=course)["copied"] == []            # idempotent
    # the course moves on: a new lab, a changed lab; the learner edited the other
    _nb(course / "02_new.ipynb", "new")
    _nb(course / "01_comm.ipynb", "comm v2")
    _nb(dest / "00_setup.ipynb", "my edit")
    assert ws.plan(course, dest) == {"new": ["02_new.ipynb"], "same": ["recorded/00_bw.json"],
                                     "outdated": ["01_comm.ipynb"], "edited": ["00_setup.ipynb"]}
    res = ws.make_workspace(dest, src=course)
    assert res["copied"] == ["02_new.ipynb", "01_comm.ipynb"]
    assert "my edit" in (dest / "00_setup.ipynb").read_text()                  # kept
    assert (dest / "01_comm.ipynb").read_bytes() == (course / "01_comm.ipynb").read_bytes()
    assert ws.plan(course, dest)["edited"] == ["00_setup.ipynb"]               # still known as edited
    res = ws.make_workspace(dest, src=course, force=True)
    assert res["copied"] == ["00_setup.ipynb"]
    assert (dest / "00_setup.ipynb").read_bytes() == (course / "00_setup.ipynb").read_bytes()


def test_a_rerun_keeps_changed_copies_adds_new_ones_and_succeeds(course, tmp_path, monkeypatch, capsys):
    dest = tmp_path / "labs"
    ws.make_workspace(dest, src=course)
    _nb(dest / "01_comm.ipynb", "my edit")
    _nb(course / "02_new.ipynb", "new")
    monkeypatch.setattr(ws, "course_notebooks", lambda: course)                 # through the CLI
    assert main(["workspace", str(dest)]) == 0                                  # `workspace && jupyter lab` works
    out = capsys.readouterr().out
    assert "Kept your changed copies" in out and "01_comm.ipynb" in out and "--allow-root" in out
    assert f"jupyter lab {dest}" in out and (dest / "02_new.ipynb").exists()
    assert "my edit" in (dest / "01_comm.ipynb").read_text()
    assert main(["workspace", str(dest), "--update"]) == 0                      # older instructions still work
    assert main(["workspace", str(dest), "--force"]) == 0
    assert "Overwrote your edited copies: 01_comm.ipynb" in capsys.readouterr().out
    assert "my edit" not in (dest / "01_comm.ipynb").read_text()


def test_a_real_failure_exits_non_zero(course, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ws, "course_notebooks", lambda: course)
    (tmp_path / "a_file").write_text("x")
    assert main(["workspace", str(tmp_path / "a_file")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("python -m labutils workspace: ") and err.count("\n") == 1 and "HINT" in err


def test_refuses_bad_destinations(course, tmp_path):
    (tmp_path / "a_file").write_text("x")
    with pytest.raises(ws.WorkspaceError, match="is a file, not a folder"):
        ws.make_workspace(tmp_path / "a_file", src=course)
    for overlapping in (course, course / "inside", course.parent):
        with pytest.raises(ws.WorkspaceError, match="must be apart from them"):
            ws.make_workspace(overlapping, src=course, force=True)
    other = tmp_path / "other"
    other.mkdir()
    (other / "thesis.tex").write_text("mine")
    with pytest.raises(ws.WorkspaceError, match="is not empty and is not a labs workspace"):
        ws.make_workspace(other, src=course)
    assert _files(other) == ["thesis.tex"]
    ws.make_workspace(other, src=course, force=True)                             # asked for: done
    assert (other / "thesis.tex").read_text() == "mine" and (other / "00_setup.ipynb").exists()
    with pytest.raises(SystemExit):                                              # the CLI refuses it too
        main(["workspace", "--update", "--force"])


def test_damaged_manifest(course, tmp_path):
    dest = tmp_path / "labs"
    ws.make_workspace(dest, src=course)
    for text in ("not json", '{"files": [1]}', "{}"):
        (dest / ws.MANIFEST).write_text(text)
        with pytest.raises(ws.WorkspaceError, match="is damaged .*HINT: `--force`"):
            ws.make_workspace(dest, src=course)
    _nb(dest / "01_comm.ipynb", "my edit")
    assert ws.make_workspace(dest, src=course, force=True)["copied"] == ["01_comm.ipynb"]   # starts afresh
    assert len(json.loads((dest / ws.MANIFEST).read_text())["files"]) == 3
    assert ws.make_workspace(dest, src=course)["copied"] == []


def test_no_course_beside_the_package(tmp_path, monkeypatch):
    monkeypatch.setattr(ws, "__file__", str(tmp_path / "site" / "labutils" / "commands" / "workspace.py"))
    with pytest.raises(ws.WorkspaceError, match="no lab notebooks in .*HINT: .*pip install -e"):
        ws.course_notebooks()


def test_real_course_runs_from_the_workspace(tmp_path, monkeypatch):
    """The course's labs, copied: recordings found beside the notebook, run-labs finds the labs."""
    src = ws.course_notebooks()
    dest = tmp_path / "my-labs"
    res = ws.make_workspace(dest)
    assert [r for r in res["copied"] if r.endswith(".ipynb")] == [p.name for p in run_labs.find_labs(src, [])]
    assert not (dest / "sanitize.cfg").exists()
    assert [p.name for p in run_labs.find_labs(dest, [])] == [p.name for p in run_labs.find_labs(src, [])]
    monkeypatch.chdir(dest)                     # JupyterLab and run-labs start kernels in the notebook's folder
    assert recorded.recorded_dir() == dest / "recorded"
    name = sorted((src / "recorded").glob("*.json"))[0].stem
    assert recorded.load(name).data == recorded.load(name, directory=src / "recorded").data


def test_opened_is_not_edited_but_run_is(course, tmp_path):
    """JupyterLab rewrites metadata when a kernel starts (and autosaves); new outputs are the learner's."""
    dest = tmp_path / "labs"
    ws.make_workspace(dest, src=course)
    path = dest / "00_setup.ipynb"
    nb = json.loads(path.read_text())
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.99.0"}
    nb["metadata"]["kernelspec"]["display_name"] = "Python 3 (ipykernel)"
    nb["cells"][0]["source"] = list(nb["cells"][0]["source"])       # one string or a list of lines
    nb["cells"][0]["metadata"]["scrolled"] = True
    path.write_text(json.dumps(nb, indent=2))
    assert ws.plan(course, dest)["same"] == ["00_setup.ipynb", "01_comm.ipynb", "recorded/00_bw.json"]
    nb["cells"][0]["outputs"] = [{"output_type": "stream", "name": "stdout", "text": ["my run\n"]}]
    path.write_text(json.dumps(nb))
    assert ws.plan(course, dest)["edited"] == ["00_setup.ipynb"]
    path.write_text("{ broken")                                       # unreadable: edited, never lost
    assert ws.plan(course, dest)["edited"] == ["00_setup.ipynb"]
