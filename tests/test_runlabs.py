"""run-labs: lab selection, the summary table and file, executing a passing and a failing notebook."""
import nbformat
import psutil
import pytest

from labutils.commands import run_labs
from labutils.__main__ import main

LABS = ("00_setup", "01_cuda_comm", "03_async_p2p", "07_interactive_ranks", "09_all_to_all")


def _nb(path, code):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in code]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.fixture
def labs_dir(tmp_path):
    for name in LABS:
        _nb(tmp_path / f"{name}.ipynb", ["1"])
    (tmp_path / "scratch.ipynb").write_text("{}")
    return tmp_path


@pytest.mark.parametrize("key,stem", [
    ("0", "00_setup"), ("00", "00_setup"), ("7", "07_interactive_ranks"), ("07", "07_interactive_ranks"),
    ("setup", "00_setup"), ("00_setup", "00_setup"), ("00_setup.ipynb", "00_setup"),
    ("notebooks/07_interactive_ranks.ipynb", "07_interactive_ranks"), ("cuda", "01_cuda_comm"),
    ("all_to_all", "09_all_to_all")])
def test_every_way_of_naming_a_lab(labs_dir, key, stem):
    assert [p.stem for p in run_labs.find_labs(labs_dir, [key])] == [stem]


def test_all_labs_in_order_and_selection_in_the_order_given(labs_dir):
    assert [p.stem for p in run_labs.find_labs(labs_dir, [])] == list(LABS)
    assert [p.stem for p in run_labs.find_labs(labs_dir, ["7", "0", "setup"])] == ["07_interactive_ranks",
                                                                                  "00_setup"]


@pytest.mark.parametrize("key,match", [("99", "no lab '99'. Labs: 00_setup, 01_cuda_comm"),
                                       ("nope", "no lab 'nope'. Labs: "),
                                       ("a", "'a' could be any of 03_async_p2p, 09_all_to_all")])
def test_unknown_or_ambiguous_lab(labs_dir, key, match):
    with pytest.raises(run_labs.UnknownLab, match=match):
        run_labs.find_labs(labs_dir, [key])


def test_cli_answers_an_unknown_lab_in_one_line(labs_dir, capsys):
    assert main(["run-labs", "--dir", str(labs_dir), "0", "99"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("python -m labutils run-labs: no lab '99'. Labs: 00_setup")
    assert main(["run-labs", "--dir", str(labs_dir / "missing")]) == 2
    assert "no lab notebooks" in capsys.readouterr().err


def test_format_table_has_a_total():
    table = run_labs.format_table([("00_setup", "cpu", "ok", 12.345), ("01_comm", "cpu", "FAILED: x", 3.0)])
    lines = table.splitlines()
    assert lines[0].split() == ["lab", "mode", "status", "seconds"]
    assert lines[2].split() == ["00_setup", "cpu", "ok", "12.3"]
    assert lines[-1].split() == ["total", "1/2", "ok", "15.3"]


WIDGET = "import ipywidgets as w\nw.interactive(lambda n: print(n * 2), n=w.IntSlider(value=3))"


def test_run_labs_executes_reports_saves_widgets_and_summary(tmp_path, capfd):
    _nb(tmp_path / "00_ok.ipynb", ["x = 1 + 1", "print(x)", WIDGET])
    _nb(tmp_path / "01_bad.ipynb", ["raise ValueError('broken lab')"])
    summary = tmp_path / "out" / "course.txt"
    rc = main(["run-labs", "--dir", str(tmp_path), "--inplace", "--timeout", "120", "--summary", str(summary)])
    captured = capfd.readouterr()  # file descriptors: the kernels' own stderr is seen too
    out = captured.out
    assert rc == 1
    assert "--- 01_bad: FAILED" in captured.err and "raise ValueError('broken lab')" in captured.err
    assert "00_ok" not in captured.err
    assert "without encryption" not in captured.err  # the kernels listen on Unix sockets, not TCP
    assert "labs:" not in captured.err and "%|" not in captured.err  # no progress bar in a log (not a tty)
    kernels = [p for p in psutil.Process().children(recursive=True) if "ipykernel" in " ".join(p.cmdline())]
    assert psutil.wait_procs(kernels, timeout=10)[1] == []  # each kernel was shut down with its lab
    assert any(line.split()[:3] == ["00_ok", runlabs_mode(), "ok"] for line in out.splitlines())
    assert "01_bad" in out and "FAILED: ValueError: broken lab" in out
    nb = nbformat.read(tmp_path / "00_ok.ipynb", 4)
    assert nb.cells[1].outputs[0]["text"] == "2\n"
    # the saved widget state holds the models the output refers to, so the slider renders unexecuted
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    view = next(o for o in nb.cells[2].outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {}))
    assert view["data"]["application/vnd.jupyter.widget-view+json"]["model_id"] in state
    assert any(m["model_name"] == "IntSliderModel" and m["state"]["value"] == 3 for m in state.values())
    text = summary.read_text()
    assert "machine: " in text and "date: " in text and "total" in text and "1/2 ok" in text
    assert "wall time of run-labs: " in text and "wall time: " in out
    assert "conditions: each lab's kernel started while the lab before it ran" in text  # 01_bad's was
    assert text.splitlines()[0].startswith("python -m labutils run-labs")


def test_conditions_name_kernel_start_and_bytecode_cache():
    assert run_labs.conditions(True, {}) == ("conditions: each lab's kernel started while the lab before it "
                                             "ran; bytecode as installed")
    assert run_labs.conditions(False, {"PYTHONPYCACHEPREFIX": "/c"}) == (
        "conditions: each lab's kernel started with the lab; bytecode cached in PYTHONPYCACHEPREFIX=/c")


def runlabs_mode():
    from labutils.hw import detect_mode
    return detect_mode()
