"""Every verdict a committed notebook prints is re-derived here from notebooks/recorded/*.json.

Each lab's ``labutils/labs/labNN_topic/claims.py`` maps recording names to verdict functions
(``CLAIMS``). The notebooks were executed on 2xH200 with ``LABUTILS_RECORD=1``, so the data a
committed notebook judged is the data in its recordings: the same function on the same data must give
the very line the notebook shows. A verdict changed in code but not re-executed, a recording replaced
without re-running the notebook, or a verdict typed into a cell by hand, all fail here.

Every line ends with its source (``claims.SOURCE_SEP``): the recording's fingerprint, as "live on ..." where
the notebook measured it (and recorded it) or "RECORDED <date> on ..." where it showed the recording, or a
``MIXED:`` of those, one per part. A source that names no recording of the verdict fails, as does a line
with none.

The markdown lint enforces the other half of the rule: prose explains mechanisms and does not type
measured figures (GB/s, µs, ms, ×) that a recording could contradict. A figure that is not a
measurement (a datasheet rate, a formula's example) carries ``<!-- not measured: why -->`` on its line.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import nbformat
import pytest

import claims_helpers   # tests/claims_helpers.py: recordings, perturbations, re-judging
from labutils import claims, recorded

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = {p.stem[:2]: p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))}
RECORDED = ROOT / "notebooks" / "recorded"
MODULES = claims_helpers.claim_modules()


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


def _docs(names) -> list[dict]:
    return [json.loads((RECORDED / f"{n}.json").read_text()) for n in names]


def _printed_verdicts(text: str) -> list[tuple[str, str]]:
    """(body, source) of every VERDICT line in ``text``; source "" where the line has none."""
    out = []
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith(claims.PREFIX):
            body, _, source = ln.partition(claims.SOURCE_SEP)
            out.append((body.strip(), source.strip()))
    return out


def source_names_its_recordings(source: str, docs: list[dict]) -> bool:
    """True if every part of ``source`` is how one of ``docs`` (recordings) is shown: live (the machine that
    measured it, the notebook's own run) or recorded (its fingerprint and date). A ``MIXED:`` source has
    two different parts at least, each ``what: source``. Live, the run printed the fingerprint it stored;
    recorded, a notebook shows it as ``recorded.shown_fingerprint`` does (ending ``NCCL_* variables not
    recorded`` for a GPU recording that predates storing them)."""
    valid = {recorded.source_text(True, d["fingerprint"], d["recorded_at"]) for d in docs} | {
        recorded.source_text(False, recorded.shown_fingerprint(d), d["recorded_at"]) for d in docs}
    if not source.startswith(claims.MIXED):
        return source in valid
    parts = [part.partition(": ")[2] for part in source[len(claims.MIXED):].split("; ")]
    return len(set(parts)) >= 2 and all(part in valid for part in parts)


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
    for name in names:
        path = RECORDED / f"{name}.json"
        assert path.exists(), f"{fn.__qualname__} judges {name!r}, which has no recording at {path}"
    docs = _docs(names)
    verdicts = fn(*[d["data"] for d in docs])
    assert verdicts and all(isinstance(v, claims.Verdict) for v in verdicts), \
        f"{fn.__qualname__} must return a non-empty list of claims.Verdict"
    printed = _printed_verdicts(_printed_text(nbformat.read(NOTEBOOKS[lab], as_version=4)))
    missing = [v.body() for v in verdicts
               if not any(body == v.body() and source_names_its_recordings(source, docs)
                          for body, source in printed)]
    assert not missing, (f"{NOTEBOOKS[lab].name} does not print these verdicts of {'+'.join(names)} with "
                         "a source that names their recordings (re-execute the notebook on the GPUs after "
                         "changing a verdict or a recording):\n" + "\n".join(missing))


@pytest.mark.parametrize("lab", sorted(NOTEBOOKS))
def test_no_verdict_is_printed_without_its_function(lab):
    """A VERDICT line in a cell nbval does not compare must come from a function in CLAIMS. (A verdict in
    a checked cell is re-derived by nbval itself on every run, on CPU and on GPUs.)"""
    nb = nbformat.read(NOTEBOOKS[lab], as_version=4)
    printed = _printed_verdicts(_printed_text(nb, ignored_only=True))
    if not printed:
        return
    unsourced = [body for body, source in printed if not source]
    assert not unsourced, f"lab {lab} prints verdicts without their source:\n" + "\n".join(unsourced)
    module = MODULES.get(lab)
    assert module is not None, f"lab {lab} prints verdicts but has no claims module"
    derived: dict[str, list[list[dict]]] = {}
    for key, fn in module.CLAIMS.items():
        names = (key,) if isinstance(key, str) else tuple(key)
        if not all((RECORDED / f"{n}.json").exists() for n in names):
            continue   # test_notebook_prints_the_verdicts_its_recordings_give says which recording is missing
        docs = _docs(names)
        for v in fn(*[d["data"] for d in docs]):
            derived.setdefault(v.body().strip(), []).append(docs)
    stray = [f"{body}{claims.SOURCE_SEP}{source}" for body, source in printed
             if not any(source_names_its_recordings(source, docs) for docs in derived.get(body, []))]
    assert not stray, (f"lab {lab} prints verdicts that no recording re-derives, or with a source that names "
                       "none of the recordings they come from:\n" + "\n".join(stray))


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
    line = claims.Verdict("c", "f", "r", "TRUE", "live on X").line()
    assert line.startswith(claims.PREFIX) and line.endswith("| f | rule: r | source: live on X")


# ---- every verdict says where its numbers come from ---------------------------------------------------------

LIVE_FP = "1x NVIDIA H200 | torch 2.11.0+cu130 | CUDA 13.0 | NCCL 2.28.9 | driver 580.159.04 | NCCL_NVLS_ENABLE=0"


def _measurement(name: str, live: bool, fingerprint: str | None = None) -> recorded.Measurement:
    """A recording of this repository as the notebook holds it: live on this machine, or loaded."""
    doc = json.loads((RECORDED / f"{name}.json").read_text())
    if live:
        return recorded.Measurement(name, doc["data"], True, fingerprint or LIVE_FP, "2026-12-01T20:00:00+00:00")
    return recorded.load(name, directory=RECORDED)


def test_a_verdict_without_a_source_fails():
    v = claims.at_least("c", 2.0, 1.0, figure="2 GB/s")
    assert v.source is None
    for show in (v.line, lambda: claims.show([v]), lambda: claims.table([v]), lambda: claims.lines([v])):
        with pytest.raises(ValueError, match="has no source.*HINT: .*claims.show\\(verdicts, m\\)"):
            show()
    with pytest.raises(ValueError, match="empty source"):
        claims.show([v], "")
    with pytest.raises(ValueError, match="no source given"):
        claims.show([v], {})
    with pytest.raises(TypeError, match="cannot take a verdict's source from a int"):
        claims.show([v], 3)


def test_show_and_table_print_the_source(capsys):
    live = _measurement("01_many_small", live=True)
    rec = _measurement("01_many_small", live=False)
    assert live.source == f"live on {LIVE_FP}"
    assert rec.source == f"RECORDED {rec.recorded_at[:10]} on {rec.fingerprint}"
    verdicts = CLAIMS_OF("01")["01_many_small"](rec.data)
    for m in (live, rec):
        claims.show(verdicts, m)
        out = capsys.readouterr().out.splitlines()
        assert len(out) == len(verdicts) and all(ln.endswith(f"{claims.SOURCE_SEP}{m.source}") for ln in out)
        assert [ln.partition(claims.SOURCE_SEP)[0] for ln in out] == [v.body() for v in verdicts]
        df = claims.table(verdicts, m)
        assert list(df.columns) == ["claim", "verdict", "figure", "rule", "source"]
        assert set(df["source"]) == {m.source}
    # a verdict that has its source keeps it; the one given is for those that have none
    kept = claims.sourced([verdicts[0], claims.sourced(verdicts[1], live)[0]], rec)
    assert [v.source for v in kept] == [rec.source, live.source]
    assert claims.source_of([rec, rec]) == rec.source and claims.source_of({"a": live, "b": live}) == live.source


def CLAIMS_OF(lab: str) -> dict:
    return MODULES[lab].CLAIMS


def test_lab00_ratio_of_a_live_and_a_recorded_sweep_names_both(capsys):
    """Lab 00 on one GPU: host -> GPU live, GPU0 -> GPU1 recorded. The ratio names both sources; a verdict on
    one sweep only carries that sweep's."""
    from labutils.labs.lab00_setup import claims as lab00
    local, peer = _measurement("00_copy_local", live=True), _measurement("00_copy_bandwidth", live=False)
    claims.show(lab00.copy_verdicts(local.data, peer.data, sources=(local, peer)))
    lines = dict(ln.partition(claims.SOURCE_SEP)[::2] for ln in capsys.readouterr().out.splitlines())
    by_claim = {body.split(" | ")[0][len(claims.PREFIX) + 9:]: src for body, src in lines.items()}
    ratio = next(src for c, src in by_claim.items() if c.startswith("a copy over PCIe"))
    assert ratio == f"{claims.MIXED}GPU0 -> GPU1: {peer.source}; host -> GPU: {local.source}"
    assert next(s for c, s in by_claim.items() if c.startswith("pinned host memory")) == local.source
    assert next(s for c, s in by_claim.items() if c.startswith("the two directions of the GPU pair")) == peer.source
    df = claims.table(lab00.all_verdicts(local.data, peer.data, sources=(local, peer)))
    assert set(df["source"]) == {local.source, peer.source, ratio}
    # both recorded (a CPU learner): one source, no MIXED
    local_rec = _measurement("00_copy_local", live=False)
    assert claims.source_of({"GPU0 -> GPU1": peer, "host -> GPU": local_rec}) == peer.source \
        or local_rec.source != peer.source


def test_lab02_summary_table_labels_each_row():
    """Lab 02's summary on one GPU: each row carries the source of the measurement it was judged from."""
    m02 = CLAIMS_OF("02")
    as_written = _measurement("02_source_nccl_error", live=False)
    sweep, tp = _measurement("02_collectives", live=False), _measurement("02_tp_mlp", live=True)
    df = claims.table(claims.judge(m02, as_written, sweep, (sweep, tp)))
    n_err, n_sweep = len(m02["02_source_nccl_error"](as_written.data)), len(m02["02_collectives"](sweep.data))
    assert list(df["source"][:n_err]) == [as_written.source] * n_err
    assert list(df["source"][n_err:n_err + n_sweep]) == [sweep.source] * n_sweep
    mixed = set(df["source"][n_err + n_sweep:])
    assert mixed == {f"{claims.MIXED}02_collectives: {sweep.source}; 02_tp_mlp: {tp.source}"}
    with pytest.raises(KeyError, match="no verdict function for 'nope'"):
        claims.judge(m02, recorded.Measurement("nope", {}, True, "f", ""))


def test_lab05_summary_labels_live_and_recorded_rows():
    """Lab 05 on fewer than two GPUs: the port verdict is live, the NCCL ones recorded."""
    m05 = CLAIMS_OF("05")
    runs = [_measurement(n, live=False) for n in ("05_raw_mistakes_nccl", "05_wrong_device_nccl")]
    port = claims.Verdict("port", "rank 0: DistNetworkError", "TRUE if the launch returns", "FALSE",
                          f"live on {LIVE_FP}")
    df = claims.table([port] + claims.judge(m05, *runs))
    assert df["source"][0] == f"live on {LIVE_FP}"
    assert set(df["source"][1:]) == {runs[0].source} and runs[0].source.startswith("RECORDED ")


def test_a_printed_source_must_name_the_recordings():
    docs = _docs(["00_copy_local", "00_copy_bandwidth"])
    fp, at = docs[1]["fingerprint"], docs[1]["recorded_at"]
    shown = recorded.shown_fingerprint(docs[1])
    assert source_names_its_recordings(f"live on {fp}", docs)
    assert source_names_its_recordings(f"RECORDED {at[:10]} on {shown}", docs)
    if shown != fp:   # a recording without its NCCL_* variables is never shown as if they had been stored
        assert not source_names_its_recordings(f"RECORDED {at[:10]} on {fp}", docs)
    other = "9x NVIDIA NOTHING | torch 0.0 | CUDA 0.0 | NCCL 0.0 | driver 0"  # a machine no recording names
    assert not any(d["fingerprint"] == other for d in docs)
    assert not source_names_its_recordings(f"live on {other}", docs)              # another machine
    assert not source_names_its_recordings(f"RECORDED 1999-01-01 on {fp}", docs)  # another date
    assert not source_names_its_recordings("", docs)
    assert source_names_its_recordings(f"{claims.MIXED}a: live on {fp}; b: RECORDED {at[:10]} on {shown}", docs)
    assert not source_names_its_recordings(f"{claims.MIXED}a: live on {fp}; b: live on {fp}", docs)
    body = "VERDICT  TRUE   c | f | rule: r"
    assert _printed_verdicts(f"x\n{body}{claims.SOURCE_SEP}live on {fp}\n{body}\n") == [
        (body, f"live on {fp}"), (body, "")]


def _unsourced_calls(source: str) -> list[int]:
    """Lines of ``claims.show(fn(...))`` / ``claims.table(fn(...))`` that pass a verdict function's fresh
    result and no source: those verdicts cannot have one (``claims.sourced`` / ``claims.judge`` give it)."""
    import ast
    lines = ["pass" if ln.lstrip().startswith(("%", "!")) else ln for ln in source.splitlines()]  # IPython magics
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:   # IPython syntax inside the cell (a magic's assignment): not Python to check
        return []
    bad = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("show", "table") and getattr(node.func.value, "id", None) == "claims"):
            continue
        if len(node.args) > 1 or any(k.arg == "source" for k in node.keywords) or not node.args:
            continue
        parts, todo = [], [node.args[0]]
        while todo:   # the terms of a + b + c
            x = todo.pop()
            if isinstance(x, ast.BinOp):
                todo += [x.left, x.right]
            else:
                parts.append(x)
        fresh = [p for p in parts if isinstance(p, ast.Call)
                 and not (isinstance(p.func, ast.Attribute) and p.func.attr in ("sourced", "judge"))
                 and not any(k.arg == "sources" for k in p.keywords)]   # a function that stamps them itself
        if fresh:
            bad.append(node.lineno)
    return bad


@pytest.mark.parametrize("src", sorted((ROOT / "notebooks" / "src").glob("[0-9][0-9]_*.py")), ids=lambda p: p.stem)
def test_notebooks_pass_a_source_to_show_and_table(src):
    import jupytext
    nb = jupytext.read(src)
    bad = [f"  cell {i}, line {ln}: {cell.source.splitlines()[ln - 1].strip()[:100]}"
           for i, cell in enumerate(nb.cells) if cell.cell_type == "code" and not cell.source.lstrip().startswith("%")
           for ln in _unsourced_calls(cell.source)]
    assert not bad, (f"{src.name} shows verdicts without their source (claims.show(verdicts, m) with the "
                     "Measurement m their data came from):\n" + "\n".join(bad))


def test_the_unsourced_call_lint_flags_only_fresh_verdicts():
    assert _unsourced_calls("claims.show(CLAIMS['x'](m.data))\nclaims.table(claims.sourced(f(a), a) + g(b) + V)\n"
                            "%ranks push x") == [1, 2]
    assert _unsourced_calls("claims.show(CLAIMS['x'](m.data), m)\nclaims.table(V)\n"
                            "claims.table(claims.judge(CLAIMS, a, b))\nclaims.show(claims.sourced(f(a), a) + V)\n"
                            "claims.show(copy_verdicts(a, b, sources=(a, b)))") == []


# ---- every verdict can fail on the data it judges -----------------------------------------------------------

# CLAIMS entries whose verdicts judge an outcome held as text (an error message, the kinds of kernels a trace
# shows) that no standard perturbation turns the other way: their TRUE and FALSE cases are tested with
# written data in the lab's own tests. An entry leaves this list as soon as the data can flip it.
JUDGED_ON_TEXT = {
    ("01", ("01_optimised_one_gpu",)): "the kinds of the kernels its CUDA trace shows (no NCCL kernel to scale)",
    ("03", ("03_source_on_nccl",)): "the status and error text of the source's program",
    ("05", ("05_raw_mistakes_nccl",)): "NCCL's outcome text for each mismatch (a hang, not an error)",
    ("05", ("05_wrong_device_nccl",)): "the error text of the source's program",
}


def _entries():
    for lab, names, fn in claims_helpers.entries():
        if all((RECORDED / f"{n}.json").exists() for n in names):
            yield pytest.param(lab, names, fn, id=f"{lab}:{'+'.join(names)}")


@pytest.mark.parametrize("lab,names,fn", list(_entries()))
def test_some_perturbation_of_the_recorded_data_flips_a_verdict(lab, names, fn):
    """A rule no measured point could fail is not a verdict: each verdict function gives at least one verdict
    that the standard perturbations of its recordings (claims_helpers: a series or one number x0.5 / x2, a
    count, a boolean or a text outcome; then x0.01 / x100 for margins beyond 2x) turn the other way."""
    datas = [claims_helpers.recording(n) for n in names]
    verdicts, flipped = claims_helpers.flips(fn, datas, names)
    if not flipped:
        flipped = claims_helpers.flips(fn, datas, names, tiers=("series", "point"),
                                       factors=claims_helpers.WIDE_FACTORS)[1]
    known = JUDGED_ON_TEXT.get((lab, names))
    if known:
        assert not flipped, (f"{fn.__qualname__} now flips under a perturbation of its data "
                             f"({next(iter(flipped.values())).what}): remove {(lab, names)} from JUDGED_ON_TEXT")
        return
    assert flipped, (f"{fn.__qualname__}: no perturbation of {'+'.join(names)} changes any of its verdicts:\n"
                     + "\n".join(f"  {v.verdict} {v.claim}" for v in verdicts)
                     + "\nHINT: judge the claim on the measured numbers, at every point the lab measured, "
                       "through a threshold some point could fail (claims.every, at_least, at_most, within).")


def test_the_perturbation_helpers_flip_what_they_should():
    """claims_helpers on a verdict function written here: a rule on a measured series flips, a rule on nothing
    measured does not, and a function that edits its data is refused."""
    def fn(d):
        return [claims.every("each step stays under 10 ms", {str(i): t for i, t in enumerate(d["t_ms"])}, "<=", 10.0),
                claims.Verdict("a constant", "-", "always TRUE", "TRUE")]
    data = {"t_ms": [4.0, 6.0, 8.0], "sizes": [1, 2, 3], "ok": True}
    verdicts, flipped = claims_helpers.flips(fn, [data], ("x",))
    assert [v.verdict for v in verdicts] == ["TRUE", "TRUE"]
    assert set(flipped) == {0} and flipped[0].tier == "series" and flipped[0].what == "x:t_ms.* x2"
    assert data == {"t_ms": [4.0, 6.0, 8.0], "sizes": [1, 2, 3], "ok": True}            # restored
    only_points = claims_helpers.flips(fn, [data], ("x",), tiers=("point",))[1]
    assert only_points[0].what == "x:t_ms.1 x2"     # 4 ms doubled stays under 10 ms; 6 ms doubled does not
    assert claims_helpers.verdict_of(fn(claims_helpers.scaled(data, ("t_ms", 1), 2.0)), "under 10 ms") == "FALSE"
    assert claims_helpers.replaced(data, ("t_ms", 0), 11.0)["t_ms"] == [11.0, 6.0, 8.0] and data["t_ms"][0] == 4.0
    with pytest.raises(LookupError, match="0 verdicts have 'nope'"):
        claims_helpers.verdict_of(verdicts, "nope")

    before, after, how, moved = claims_helpers.flipping_case(fn, ("x",), "under 10 ms", datas=[data])
    assert (before, after, how.what) == ("TRUE", "FALSE", "x:t_ms.* x2") and moved[0]["t_ms"] == [8.0, 12.0, 16.0]
    assert data["t_ms"] == [4.0, 6.0, 8.0]
    with pytest.raises(LookupError, match="no standard perturbation of x flips 'a constant'"):
        claims_helpers.flipping_case(fn, ("x",), "a constant", datas=[data])
    # from a recording: the first verdict of the first CLAIMS entry that a perturbation flips, both sides
    lab, names, real = next((lab, names, f) for lab, names, f in claims_helpers.entries()
                            if all((RECORDED / f"{n}.json").exists() for n in names)
                            and claims_helpers.flips(f, [claims_helpers.recording(n) for n in names], names)[1])
    verdicts, flipped = claims_helpers.flips(real, [claims_helpers.recording(n) for n in names], names)
    claim = verdicts[min(flipped)].claim
    if sum(claim in v.claim for v in verdicts) == 1:
        before, after, how, moved = claims_helpers.flipping_case(real, names, claim)
        assert before != after and moved != [claims_helpers.recording(n) for n in names]

    def sorts_in_place(d):
        d["t_ms"].sort(reverse=True)
        return fn(d)
    with pytest.raises(RuntimeError, match="changed the data it judged"):
        claims_helpers.flips(sorts_in_place, [{"t_ms": [1.0, 2.0]}], ("x",))


@pytest.mark.parametrize("lab", sorted(NOTEBOOKS))
def test_every_verdict_line_in_a_committed_notebook_names_its_source(lab):
    """Checked cells too: a VERDICT line anywhere in the notebook ends with ``| source: ...``."""
    printed = _printed_verdicts(_printed_text(nbformat.read(NOTEBOOKS[lab], as_version=4)))
    unsourced = [body for body, source in printed if not source]
    assert not unsourced, f"lab {lab} prints verdicts without their source:\n" + "\n".join(unsourced)


def _rule_of(rule: str) -> str:
    """A verdict's rule without the measured part ``within`` prints in it (``(off by 7%)``)."""
    return re.sub(r"\s*\(off by [^)]*\)", "", rule).strip()


def _claims_with_two_rules(judged) -> dict:
    """``{claim: [(rule, where), ...]}`` for each claim of ``judged`` (``(claim, rule, where)`` triples) that is
    judged by more than one rule."""
    rules: dict[str, set] = {}
    for claim, rule, where in judged:
        rules.setdefault(claim, set()).add((_rule_of(rule), where))
    return {claim: sorted(found) for claim, found in rules.items() if len({r for r, _ in found}) > 1}


def _everything_judged():
    for lab, names, fn in claims_helpers.entries():
        if all((RECORDED / f"{n}.json").exists() for n in names):
            for v in fn(*[claims_helpers.recording(n) for n in names]):
                yield v.claim, v.rule, f"{lab}:{'+'.join(names)}"
    for lab, path in NOTEBOOKS.items():
        for body, _ in _printed_verdicts(_printed_text(nbformat.read(path, as_version=4))):
            words = body[len(claims.PREFIX):].strip().split(None, 1)
            if len(words) == 2 and " | rule: " in words[1]:
                yield words[1].split(" | ")[0], body.rpartition(" | rule: ")[2], f"notebook {lab}"


def test_one_claim_one_rule():
    """The same claim is judged by the same rule wherever it is judged: in every CLAIMS function and on every
    VERDICT line of every committed notebook (a summary that judges a claim with another rule than the
    verdict beside it says two things about one claim)."""
    split = _claims_with_two_rules(_everything_judged())
    assert not split, "claims judged by more than one rule:\n" + "\n".join(
        f"  {claim}: " + "; ".join(f"{where}: {rule}" for rule, where in found) for claim, found in split.items())


def test_the_one_rule_check_sees_two_rules():
    median, worst = claims.at_most("adds nothing", 1.03, 1.15, figure="f"), claims.at_most("adds nothing", 1.32, 1.05,
                                                                                          figure="f")
    within = [claims.within("w", x, 1.0, 0.1, figure="f") for x in (1.07, 1.2)]
    found = _claims_with_two_rules([(median.claim, median.rule, "a"), (worst.claim, worst.rule, "b"),
                                    (within[0].claim, within[0].rule, "a"), (within[1].claim, within[1].rule, "b")])
    assert found == {"adds nothing": [("TRUE if <= 1.05", "b"), ("TRUE if <= 1.15", "a")]}   # "off by" is no rule
