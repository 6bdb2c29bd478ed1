"""Every verdict a committed notebook prints is re-derived here from notebooks/recorded/*.json.

Each lab's ``labutils/labs/labNN_topic/claims.py`` maps recording names to verdict functions
(``CLAIMS``). The notebooks were executed on 2xH200 with ``LABUTILS_RECORD=1``, so the data a
committed notebook judged is the data in its recordings: the same function on the same data must give
the very line the notebook shows. A verdict changed in code but not re-executed, a recording replaced
without re-running the notebook, or a verdict typed into a cell by hand, all fail here.

The markdown lint enforces the other half of the rule: prose explains mechanisms and does not type
measured figures (GB/s, µs, ms, ×) that a recording could contradict. A figure that is not a
measurement (a datasheet rate, a formula's example) carries ``<!-- not measured: why -->`` on its line.
"""
from __future__ import annotations

import importlib
import json
import pkgutil
import re
from pathlib import Path

import nbformat
import pytest

from labutils import claims

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = {p.stem[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
RECORDED = ROOT / "notebooks" / "recorded"


def _claim_modules() -> dict[str, object]:
    """``{"03": labutils.labs.lab03_async_p2p.claims, ...}`` for every lab package that has one."""
    import labutils.labs as labs
    found = {}
    for info in pkgutil.iter_modules(labs.__path__):
        m = re.fullmatch(r"lab(\d\d)_\w+", info.name)
        if m and info.ispkg:
            try:
                found[m.group(1)] = importlib.import_module(f"labutils.labs.{info.name}.claims")
            except ModuleNotFoundError as exc:
                if exc.name != f"labutils.labs.{info.name}.claims":
                    raise
    return found


MODULES = _claim_modules()


def _printed_text(nb, ignored_only: bool = False) -> str:
    """Text the notebook's cells printed; with ``ignored_only``, only cells nbval does not compare."""
    out = []
    for cell in nb.cells:
        if ignored_only and "nbval-ignore-output" not in cell.get("metadata", {}).get("tags", []):
            continue
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                out.append(o.get("text", ""))
            elif "data" in o and "text/plain" in o["data"]:
                out.append(o["data"]["text/plain"])
    return "\n".join(out)


def _cases():
    for lab, module in sorted(MODULES.items()):
        for key, fn in module.CLAIMS.items():
            names = (key,) if isinstance(key, str) else tuple(key)
            # a lab whose notebook is not built yet printed nothing (test_notebooks_in_sync fails on it)
            marks = () if lab in NOTEBOOKS else pytest.mark.skip(reason=f"notebooks/{lab}_*.ipynb is not built yet")
            yield pytest.param(lab, names, fn, id=f"{lab}:{'+'.join(names)}", marks=marks)


def test_every_lab_judges_its_claims():
    """Each lab with measurements has a claims module with at least one verdict function."""
    measured = {p.name[:2] for p in RECORDED.glob("[0-9][0-9]_*.json")}
    missing = sorted(measured - set(MODULES))
    assert not missing, f"labs {missing} record measurements but have no labs/labNN_*/claims.py"
    for lab, module in MODULES.items():
        assert module.CLAIMS, f"lab {lab}: CLAIMS is empty"


@pytest.mark.parametrize("lab,names,fn", list(_cases()))
def test_notebook_prints_the_verdicts_its_recordings_give(lab, names, fn):
    datas = []
    for name in names:
        path = RECORDED / f"{name}.json"
        assert path.exists(), f"{fn.__qualname__} judges {name!r}, which has no recording at {path}"
        datas.append(json.loads(path.read_text())["data"])
    verdicts = fn(*datas)
    assert verdicts and all(isinstance(v, claims.Verdict) for v in verdicts), \
        f"{fn.__qualname__} must return a non-empty list of claims.Verdict"
    printed = _printed_text(nbformat.read(NOTEBOOKS[lab], as_version=4))
    missing = [v.line() for v in verdicts if v.line() not in printed]
    assert not missing, (f"{NOTEBOOKS[lab].name} does not print these verdicts of {'+'.join(names)} "
                         "(re-execute the notebook on the GPUs after changing a verdict or a recording):\n"
                         + "\n".join(missing))


@pytest.mark.parametrize("lab", sorted(NOTEBOOKS))
def test_no_verdict_is_printed_without_its_function(lab):
    """A VERDICT line in a cell nbval does not compare must come from a function in CLAIMS. (A verdict in
    a checked cell is re-derived by nbval itself on every run, on CPU and on GPUs.)"""
    nb = nbformat.read(NOTEBOOKS[lab], as_version=4)
    printed = [ln.strip() for ln in _printed_text(nb, ignored_only=True).splitlines()
               if ln.strip().startswith(claims.PREFIX)]
    if not printed:
        return
    module = MODULES.get(lab)
    assert module is not None, f"lab {lab} prints verdicts but has no claims module"
    derived = set()
    for key, fn in module.CLAIMS.items():
        names = (key,) if isinstance(key, str) else tuple(key)
        datas = [json.loads((RECORDED / f"{n}.json").read_text())["data"] for n in names]
        derived |= {v.line().strip() for v in fn(*datas)}
    stray = [ln for ln in printed if ln not in derived]
    assert not stray, f"lab {lab} prints verdicts that no recording re-derives:\n" + "\n".join(stray)


FIGURE = re.compile(r"(?<![\w.])\d[\d,.]*\s?(GB/s|GiB/s|TB/s|µs|us|ms|×)(?!\w)")


def _prose_lines(md: str):
    in_code = False
    for line in md.splitlines():
        if line.strip().startswith("```"):
            in_code = not in_code
            continue
        if in_code or line.lstrip().startswith(">") or "not measured:" in line:
            continue
        yield re.sub(r"`[^`]*`", "", line)   # code spans are code, not claims


@pytest.mark.parametrize("lab", sorted(NOTEBOOKS))
def test_markdown_types_no_measured_figure(lab):
    nb = nbformat.read(NOTEBOOKS[lab], as_version=4)
    hits = [f"  {line.strip()[:140]}" for cell in nb.cells if cell.cell_type == "markdown"
            for line in _prose_lines(cell.source) if FIGURE.search(line)]
    assert not hits, (f"{NOTEBOOKS[lab].name}: markdown types figures a recording could contradict; print "
                      "them from data, or mark a datasheet/formula figure with <!-- not measured: why -->:\n"
                      + "\n".join(hits))


def test_verdict_helpers_follow_their_thresholds():
    assert claims.at_least("a", 1.2, 1.2, figure="x").verdict == "TRUE"
    assert claims.at_least("a", 1.19, 1.2, figure="x").verdict == "FALSE"
    assert claims.at_most("a", 0.6, 0.55, figure="x", true="YES", false="NO").verdict == "NO"
    assert claims.within("a", 1.3, 1.0, 0.25, figure="x").verdict == "FALSE"
    assert claims.within("a", 0.8, 1.0, 0.25, figure="x").verdict == "TRUE"
    # the printed error is on the verdict's side of the printed tolerance, however close the two are
    assert claims.within("a", 1.152, 1.0, 0.15, figure="x").rule == "TRUE if within 15.0% (off by 15.2%)"
    assert claims.within("a", 1.07, 1.0, 0.10, figure="x").rule == "TRUE if within 10% (off by 7%)"
    assert claims.percents(0.1500001, 0.15) == ("15.00001%", "15.00000%")
    assert claims.percents(0.004, 0.0) == ("0.4%", "0.0%")   # never "off by 0%" beside a FALSE
    with pytest.raises(ValueError, match="non-finite"):
        claims.at_least("a", float("nan"), 1.0, figure="x")
    with pytest.raises(ValueError, match="unknown comparison"):
        claims.compare("a", 1.0, "=>", 1.0, figure="x")
    line = claims.Verdict("c", "f", "r", "TRUE").line()
    assert line.startswith(claims.PREFIX) and "| f | rule: r" in line
