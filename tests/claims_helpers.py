"""Judge a lab's claims again on perturbed recordings: does each verdict's rule depend on what was measured?

A rule that no measured point could fail is not a verdict. So every verdict function of every lab's
``CLAIMS`` is run again on its recordings' data with one change at a time -- the *standard perturbations*:

* ``series``: every measured number (float) of one series scaled by 0.5, then by 2 (a series: the numbers at
  one path of the JSON with list indices wildcarded, e.g. ``rows[*].time_us`` or ``time_ms.SP[*]``);
* ``point``: one measured number (a float) scaled by 0.5, then by 2 (a zero, which scaling keeps, set to 1);
* ``count``: integers -- a series of them, then one at a time -- scaled the same way, and one at a time plus 1
  (a count, a byte total, or a setting such as a size: an integer is a measurement only sometimes);
* ``outcome``: one boolean negated, one string emptied (an error text, a log that did not come);
* ``machine``: every measured number (float) of one recording scaled together by 0.5, then by 2 -- the same
  run on a machine twice as fast or as slow, which moves an absolute goal (``<= 15 us``) judged on several
  numbers that no single series holds.

A verdict *flips* when the same claim (same position and claim text) comes out with another word. For the
tests of a verdict you fix, take the data, change it where the claim must fail, and judge again::

    from claims_helpers import recording, judge, verdict_of, scaled
    data = recording("09_sp_block")
    assert verdict_of(judge(fn, data), "sequence parallelism costs no more") == "TRUE"
    worse = scaled(data, ("time_ms", "SP", 0), 2.0)           # SP twice as slow at the first size
    assert verdict_of(judge(fn, worse), "sequence parallelism costs no more") == "FALSE"

or let ``flipping_case(fn, names, claim_part)`` find the data on the other side of the rule.
Run ``python tests/claims_helpers.py`` for the table of every verdict and the first perturbation that flips it
(``never`` where none does).
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import pkgutil
import re
import sys
from pathlib import Path
from typing import Callable, Iterator

ROOT = Path(__file__).resolve().parent.parent
RECORDED = ROOT / "notebooks" / "recorded"
FACTORS = (0.5, 2.0)
TIERS = ("series", "point", "count", "outcome", "machine")


def claim_modules() -> dict[str, object]:
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


def entries() -> list[tuple[str, tuple, Callable]]:
    """``(lab, recording names, verdict function)`` for every entry of every lab's ``CLAIMS``."""
    return [(lab, (key,) if isinstance(key, str) else tuple(key), fn)
            for lab, module in sorted(claim_modules().items()) for key, fn in module.CLAIMS.items()]


def recording(name: str) -> dict:
    """A fresh copy of the ``data`` of ``notebooks/recorded/<name>.json`` (change it freely)."""
    return json.loads((RECORDED / f"{name}.json").read_text())["data"]


def judge(fn: Callable, *datas) -> list:
    """``fn(*datas)``: the verdicts (``claims.Verdict``) of a verdict function, without sources."""
    return list(fn(*datas))


def verdict_of(verdicts, claim_part: str) -> str:
    """The verdict word of the one verdict whose claim contains ``claim_part``.

    Raises:
        LookupError: none or several verdicts match.
    """
    hits = [v for v in verdicts if claim_part in v.claim]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} verdicts have {claim_part!r} in their claim. HINT: the claims are: "
                          + "; ".join(v.claim for v in verdicts))
    return hits[0].verdict


# ---- paths into a recording's JSON --------------------------------------------------------------------------

def get(data, path: tuple):
    for k in path:
        data = data[k]
    return data


def _put(data, path: tuple, value) -> None:
    get(data, path[:-1])[path[-1]] = value


def replaced(data, path: tuple, value):
    """A copy of ``data`` with the value at ``path`` (keys and list indices) set to ``value``."""
    out = copy.deepcopy(data)
    _put(out, path, value)
    return out


def scaled(data, path: tuple, factor: float):
    """A copy of ``data`` with the number at ``path`` -- or every number under it (a list, a dict) -- times
    ``factor``."""
    out = copy.deepcopy(data)
    for p, v in leaves(get(out, path), path):
        if _is_number(v):
            _put(out, p, v * factor)
    return out


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def leaves(x, path: tuple = ()) -> Iterator[tuple[tuple, object]]:
    """``(path, value)`` of every number, boolean and string in a recording's JSON, in document order."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaves(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x):
            yield from leaves(v, path + (i,))
    elif isinstance(x, (int, float, str)):
        yield path, x


def series_of(path: tuple) -> tuple:
    """The series a leaf belongs to: its path with list indices wildcarded (``("rows", "*", "time_us")``)."""
    return tuple("*" if isinstance(k, int) else k for k in path)


# ---- the standard perturbations -----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Perturbation:
    """One change to a verdict function's inputs: ``changes`` are ``(input index, path, new value)``."""
    tier: str
    what: str
    changes: tuple


def _name(names, i: int, path: tuple) -> str:
    return f"{names[i]}:" + ".".join(map(str, path))


def perturbations(datas: list, names: tuple, tiers=TIERS, factors=FACTORS) -> Iterator[Perturbation]:
    """The standard perturbations of ``datas`` (see the module docstring), tier by tier."""
    all_leaves = [(i, p, v) for i, d in enumerate(datas) for p, v in leaves(d)]

    def whole_series(kind, tier):
        groups: dict[tuple, list] = {}
        for i, p, v in all_leaves:
            if type(v) is kind:
                groups.setdefault((i, series_of(p)), []).append((p, v))
        for (i, pattern), members in groups.items():
            for f in factors:
                yield Perturbation(tier, f"{_name(names, i, pattern)} x{f:g}", tuple((i, p, v * f) for p, v in members))

    def each_point(kind, tier):
        for i, p, v in all_leaves:
            if type(v) is kind:
                if v == 0:
                    yield Perturbation(tier, f"{_name(names, i, p)} = 1 (was 0)", ((i, p, kind(1)),))
                    continue
                for f in factors:
                    yield Perturbation(tier, f"{_name(names, i, p)} x{f:g}", ((i, p, v * f),))
                if kind is int:
                    yield Perturbation(tier, f"{_name(names, i, p)} + 1", ((i, p, v + 1),))
    if "series" in tiers:
        yield from whole_series(float, "series")
    if "point" in tiers:
        yield from each_point(float, "point")
    if "count" in tiers:
        yield from whole_series(int, "count")
        yield from each_point(int, "count")
    if "outcome" in tiers:
        for i, p, v in all_leaves:
            if isinstance(v, bool):
                yield Perturbation("outcome", f"{_name(names, i, p)} = {not v}", ((i, p, not v),))
            elif isinstance(v, str) and v:
                yield Perturbation("outcome", f"{_name(names, i, p)} = ''", ((i, p, ""),))
    if "machine" in tiers:
        for i, name in enumerate(names):
            floats = [(j, p, v) for j, p, v in all_leaves if j == i and type(v) is float]
            for f in factors:
                if floats:
                    yield Perturbation("machine", f"every number of {name} x{f:g}",
                                       tuple((j, p, v * f) for j, p, v in floats))


def _words(verdicts) -> list[tuple[str, str]]:
    return [(v.claim, v.verdict) for v in verdicts]


def flips(fn: Callable, datas: list, names: tuple, tiers=TIERS, factors=FACTORS) -> tuple[list, dict[int, Perturbation]]:
    """The verdicts of ``fn(*datas)`` and, for each (by index), the first standard perturbation that changes its
    word; a verdict absent from the dict is never flipped. A perturbation under which ``fn`` raises (data it
    cannot judge) flips nothing. The data are changed in place and restored after each call."""
    pristine = json.dumps(datas, sort_keys=True)
    base = _words(judge(fn, *datas))
    flipped: dict[int, Perturbation] = {}
    for pert in perturbations(datas, names, tiers, factors):
        if len(flipped) == len(base):
            break
        old = [(i, p, get(datas[i], p)) for i, p, _ in pert.changes]
        for i, p, v in pert.changes:
            _put(datas[i], p, v)
        try:
            now = _words(judge(fn, *datas))
        except Exception:  # noqa: BLE001 - data the function cannot judge: no verdict came out of it
            now = None
        finally:
            for i, p, v in old:
                _put(datas[i], p, v)
        if now is None:
            continue
        for k, (claim, word) in enumerate(base):
            if k in flipped:
                continue
            same = now[k] if k < len(now) and now[k][0] == claim else next((c for c in now if c[0] == claim), None)
            if same is not None and same[1] != word:
                flipped[k] = pert
    if json.dumps(datas, sort_keys=True) != pristine:
        raise RuntimeError(f"{getattr(fn, '__qualname__', fn)} changed the data it judged. HINT: a verdict "
                           "function reads its data; copy what it must sort or edit.")
    return judge(fn, *datas), flipped


def flipping_case(fn: Callable, names: tuple, claim_part: str, tiers=TIERS, factors=FACTORS, datas=None):
    """``(word on the recordings, word after, Perturbation, perturbed datas)`` for the first standard
    perturbation of the recordings ``names`` (or of ``datas``, copied, if given) that turns the verdict whose claim
    contains ``claim_part`` the other way: both sides of its rule, from the recorded data, for a lab's TRUE/FALSE
    test::

        before, after, how, datas = flipping_case(fn, ("09_sp_block",), "costs no more time")
        assert {before, after} == {"TRUE", "FALSE"}, how.what

    Raises:
        LookupError: no verdict or several match ``claim_part``, or no standard perturbation flips it.
    """
    datas = [recording(n) for n in names] if datas is None else copy.deepcopy(list(datas))
    verdicts, flipped = flips(fn, datas, names, tiers, factors)
    hits = [k for k, v in enumerate(verdicts) if claim_part in v.claim]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} verdicts have {claim_part!r} in their claim. HINT: the claims are: "
                          + "; ".join(v.claim for v in verdicts))
    k = hits[0]
    if k not in flipped:
        raise LookupError(f"no standard perturbation of {'+'.join(names)} flips {verdicts[k].claim!r} "
                          f"({verdicts[k].verdict}). HINT: write the data on its other side by hand "
                          "(claims_helpers.replaced / scaled), or judge the claim where a point could fail it.")
    pert = flipped[k]
    for i, p, v in pert.changes:
        _put(datas[i], p, v)
    after = verdict_of(judge(fn, *datas), claim_part)
    return verdicts[k].verdict, after, pert, datas


WIDE_FACTORS = (0.01, 100.0)   # for the report only: a verdict with a margin beyond 2x flips here


def report(out=sys.stdout) -> list[tuple]:
    """Every verdict of every ``CLAIMS`` entry and the first standard perturbation that flips it (else the first
    with factors 0.01 and 100, marked ``wide``); returns rows ``(lab, names, claim, verdict, tier, what)``, tier
    None where nothing flips it."""
    rows = []
    for lab, names, fn in entries():
        if not all((RECORDED / f"{n}.json").exists() for n in names):
            continue
        datas = [recording(n) for n in names]
        verdicts, flipped = flips(fn, datas, names)
        wide = flips(fn, datas, names, tiers=("series", "point"), factors=WIDE_FACTORS)[1] \
            if len(flipped) < len(verdicts) else {}
        for k, v in enumerate(verdicts):
            p = flipped.get(k) or (wide.get(k) and dataclasses.replace(wide[k], tier=f"wide {wide[k].tier}"))
            rows.append((lab, names, v.claim, v.verdict, p and p.tier, p and p.what))
            print(f"{lab} {'+'.join(names)} | {v.verdict} | {v.claim[:100]} | "
                  f"{f'{p.tier}: {p.what}' if p else 'never'}", file=out)
    return rows


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    report()
