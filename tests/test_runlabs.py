"""run-labs: lab selection, the summary table, executing a passing and a failing notebook."""
import nbformat
import pytest

from labutils.commands import run_labs
from labutils.__main__ import main


def _nb(path, code):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c) for c in code]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_find_labs_and_errors(tmp_path):
    for name in ("00_setup", "01_comm", "02_tp"):
        _nb(tmp_path / f"{name}.ipynb", ["1"])
    (tmp_path / "scratch.ipynb").write_text("{}")
    assert [p.stem for p in run_labs.find_labs(tmp_path, [])] == ["00_setup", "01_comm", "02_tp"]
    assert [p.stem for p in run_labs.find_labs(tmp_path, ["02", "00_setup"])] == ["02_tp", "00_setup"]
    with pytest.raises(FileNotFoundError, match="no lab matches '07'"):
        run_labs.find_labs(tmp_path, ["07"])


def test_format_table():
    table = run_labs.format_table([("00_setup", "cpu", "ok", 12.345), ("01_comm", "cpu", "FAILED: x", 3.0)])
    lines = table.splitlines()
    assert lines[0].split() == ["lab", "mode", "status", "seconds"]
    assert lines[2].split() == ["00_setup", "cpu", "ok", "12.3"]


def test_run_labs_executes_and_reports(tmp_path, capsys):
    _nb(tmp_path / "00_ok.ipynb", ["x = 1 + 1", "print(x)"])
    _nb(tmp_path / "01_bad.ipynb", ["raise ValueError('broken lab')"])
    rc = main(["run-labs", "--dir", str(tmp_path), "--inplace", "--timeout", "120"])
    captured = capsys.readouterr()
    out = captured.out
    assert rc == 1
    assert "--- 01_bad: FAILED" in captured.err and "raise ValueError('broken lab')" in captured.err
    assert "00_ok" not in captured.err
    assert any(l.split()[:3] == ["00_ok", runlabs_mode(), "ok"] for l in out.splitlines())
    assert "01_bad" in out and "FAILED: ValueError: broken lab" in out
    assert nbformat.read(tmp_path / "00_ok.ipynb", 4).cells[1].outputs[0]["text"] == "2\n"


def runlabs_mode():
    from labutils.hw import detect_mode
    return detect_mode()
