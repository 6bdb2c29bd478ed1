"""tools/nbsync.py: a rebuild keeps outputs of unchanged cells and the notebook's metadata (widget state,
language_info), and every notebook names the kernel JupyterLab should start (no "Select Kernel" dialog)."""
import importlib.util
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("nbsync", ROOT / "tools" / "nbsync.py")
nbsync = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(nbsync)

SOURCE = '''# %% [markdown]
# # 99 · Test

# %%
import ipywidgets as w
slider = w.interactive(print, n=w.IntSlider(value=3))
slider

# %% tags=["nbval-ignore-output"]
print("{second}")
'''
VIEW, STATE = nbsync.WIDGET_VIEW, nbsync.WIDGET_STATE


@pytest.fixture
def tree(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    monkeypatch.setattr(nbsync, "SRC", tmp_path / "src")
    monkeypatch.setattr(nbsync, "NB", tmp_path)
    monkeypatch.setattr(nbsync, "ROOT", tmp_path)
    return tmp_path


def _write_source(tree, second="one"):
    (tree / "src" / "99_test.py").write_text(SOURCE.replace("{second}", second))


def _execute_by_hand(path):
    """What an executed notebook holds: outputs, a widget view per widget cell, the widget state of
    every model (the slider's box contains the slider: IPY_MODEL_ references), language_info."""
    nb = nbformat.read(path, 4)
    widget_cell, print_cell = [c for c in nb.cells if c.cell_type == "code"]
    widget_cell.outputs = [nbformat.v4.new_output("display_data", {
        VIEW: {"model_id": "aa11", "version_major": 2, "version_minor": 0}, "text/plain": "interactive(...)"})]
    print_cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="one\n")]
    model = lambda name, **state: {"model_name": name, "model_module": "@jupyter-widgets/controls",  # noqa: E731
                                   "model_module_version": "2.0.0", "state": {"_model_name": name, **state}}
    nb.metadata["widgets"] = {STATE: {"version_major": 2, "version_minor": 0, "state": {
        "aa11": model("VBoxModel", children=["IPY_MODEL_bb22"]),
        "bb22": model("IntSliderModel", value=3, layout="IPY_MODEL_cc33"),
        "cc33": model("LayoutModel"),
        "dd44": model("IntSliderModel", value=9)}}}  # a widget no output shows any more
    nb.metadata["language_info"] = {"name": "python", "version": "3.12.3"}
    nbformat.write(nb, path)


def test_new_notebook_names_its_kernel_and_language(tree):
    _write_source(tree)
    assert nbsync.build(tree / "src" / "99_test.py")
    nb = nbformat.read(tree / "99_test.ipynb", 4)
    assert nb.metadata["kernelspec"] == {"name": "python3", "display_name": "Python 3", "language": "python"}
    assert nb.metadata["language_info"]["name"] == "python" and "jupytext" not in nb.metadata
    assert nbsync.kernelspec_ok(nb)


def test_unchanged_notebook_is_not_rewritten(tree):
    _write_source(tree)
    nbsync.build(tree / "src" / "99_test.py")
    _execute_by_hand(tree / "99_test.ipynb")
    before = (tree / "99_test.ipynb").read_bytes()
    assert not nbsync.build(tree / "src" / "99_test.py")
    assert (tree / "99_test.ipynb").read_bytes() == before


def test_rebuild_keeps_outputs_language_info_and_the_widget_state_still_shown(tree):
    _write_source(tree)
    nbsync.build(tree / "src" / "99_test.py")
    _execute_by_hand(tree / "99_test.ipynb")
    _write_source(tree, second="two")  # the print cell changes, the widget cell does not
    assert nbsync.build(tree / "src" / "99_test.py")
    nb = nbformat.read(tree / "99_test.ipynb", 4)
    widget_cell, print_cell = [c for c in nb.cells if c.cell_type == "code"]
    assert widget_cell.outputs[0]["data"][VIEW]["model_id"] == "aa11" and print_cell.outputs == []
    assert sorted(nb.metadata["widgets"][STATE]["state"]) == ["aa11", "bb22", "cc33"]  # dd44 pruned
    assert nb.metadata["language_info"]["version"] == "3.12.3"
    assert nbsync.kernelspec_ok(nb)


def test_widget_state_goes_when_no_output_shows_a_widget(tree):
    _write_source(tree)
    nbsync.build(tree / "src" / "99_test.py")
    _execute_by_hand(tree / "99_test.ipynb")
    (tree / "src" / "99_test.py").write_text(SOURCE.replace("slider\n", "slider  # changed\n")
                                             .replace("{second}", "one"))
    nbsync.build(tree / "src" / "99_test.py")
    assert "widgets" not in nbformat.read(tree / "99_test.ipynb", 4).metadata


def test_check_flags_cells_out_of_sync_and_a_missing_kernelspec(tree, capsys):
    _write_source(tree)
    nbsync.build(tree / "src" / "99_test.py")
    assert nbsync.main(["--check"]) == 0
    nb = nbformat.read(tree / "99_test.ipynb", 4)
    del nb.metadata["kernelspec"]
    nbformat.write(nb, tree / "99_test.ipynb")
    assert nbsync.main(["--check"]) == 1
    assert "no kernelspec 'python3'" in capsys.readouterr().out
    assert nbsync.build(tree / "src" / "99_test.py")  # rebuilding repairs it
    _write_source(tree, second="two")
    assert nbsync.main(["--check"]) == 1 and "out of sync" in capsys.readouterr().out


def test_committed_notebooks_name_the_course_kernel():
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        assert nbsync.kernelspec_ok(nbformat.read(path, 4)), path.name


NBGRADER_SOURCE = '''# %% nbgrader={"grade": false, "grade_id": "answer", "locked": false, "schema_version": 3, "solution": true}
def my_answer():
    ### BEGIN SOLUTION
    return 42
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_answer", "locked": true, "points": {points}, "schema_version": 3, "solution": false}
assert my_answer() == 42
'''


def test_nbgrader_cell_metadata_is_carried_into_the_notebook_and_checked(tree, capsys):
    (tree / "src" / "99_test.py").write_text(NBGRADER_SOURCE.replace("{points}", "2"))
    assert nbsync.build(tree / "src" / "99_test.py")
    solution, test = nbformat.read(tree / "99_test.ipynb", 4).cells
    assert solution.metadata["nbgrader"] == {"grade": False, "grade_id": "answer", "locked": False,
                                             "schema_version": 3, "solution": True}
    assert "### BEGIN SOLUTION" in solution.source
    assert test.metadata["nbgrader"]["points"] == 2 and test.metadata["nbgrader"]["grade"] is True
    assert nbsync.main(["--check"]) == 0
    (tree / "src" / "99_test.py").write_text(NBGRADER_SOURCE.replace("{points}", "3"))  # only the points change
    assert nbsync.main(["--check"]) == 1 and "out of sync" in capsys.readouterr().out
    assert nbsync.build(tree / "src" / "99_test.py")
    assert nbformat.read(tree / "99_test.ipynb", 4).cells[1].metadata["nbgrader"]["points"] == 3
