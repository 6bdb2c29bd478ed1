"""Verdicts from data: a claim, the measured figure, an explicit threshold, and the verdict that follows.

The course's first rule is that a sentence never states what the data could contradict. So a lab never
types "TRUE" or "395 GB/s" into markdown: it computes a ``Verdict`` from the live or recorded result
through a written threshold, and prints it::

    from labutils import claims
    v = claims.at_least("tip 3: NCCL beats a hand-written ring", ratio, 1.2,
                        figure=f"NCCL/ring busbw {ratio:.2f}x at 1 MiB")
    claims.show([v], m)      # m: the recorded.Measurement the ratio was computed from
    # VERDICT  TRUE   tip 3: NCCL beats a hand-written ring | NCCL/ring busbw 4.81x at 1 MiB | rule: TRUE if >= 1.2 | source: RECORDED 2026-11-30 on 2x NVIDIA H200 | NV18 | ...

Each lab keeps its verdict functions in ``labutils/labs/labNN_topic/claims.py`` with a table
``CLAIMS = {"03_overlap": overlap_verdicts, ...}`` from recording name (or a tuple of names) to a
function of the recordings' ``data`` dicts returning a list of ``Verdict``. ``tests/test_claims.py``
loads every recording, re-derives every verdict and checks that the committed notebook printed the
same line, so prose, recording and notebook cannot drift apart.

**Every verdict says where its numbers come from.** A ``Verdict`` has a ``source``: ``"live on <this
machine's fingerprint>"`` or ``"RECORDED <date> on <the recording's fingerprint>"`` -- exactly
``recorded.Measurement.source``. A lab's verdict functions do not set it (they see only ``data``); the
notebook passes the ``Measurement`` the data came from to ``show`` / ``table``, which stamp it on every
verdict that has none::

    m = recorded.live_or_recorded("03_overlap", measure, gpus_needed=1)
    claims.show(CLAIMS["03_overlap"](m.data), m)
    # VERDICT  TRUE   ... | rule: TRUE if >= 1.2 | source: live on 1x NVIDIA H200 | torch 2.11.0+cu130 | ...

    claims.table(claims.sourced(CLAIMS["a"](A.data), A) + claims.sourced(fn(B.data), B))
    claims.table(claims.judge(CLAIMS, A, B, (A, C)))   # CLAIMS["a"](A.data), ..., CLAIMS[("a", "c")](A.data, C.data)
    # one row per verdict, each with its own "source" column

A verdict that combines measurements takes them by what each one measured (the words its figure uses)::

    claims.show(ratio_verdicts(local.data, peer.data), {"host -> GPU": local, "GPU0 -> GPU1": peer})
    # ... | source: MIXED: host -> GPU: live on 1x NVIDIA H200 | ...; GPU0 -> GPU1: RECORDED 2026-11-30 on 2x ...

(when every part has the same source, that one source is printed, not ``MIXED``). A function whose verdicts
rest on different inputs may stamp each itself (``sourced`` inside it, as lab 00's ``copy_verdicts(...,
sources=(local, peer))`` does), so that only the verdict that really combines them is ``MIXED``. In a
cell nbval compares, a live source differs between machines: ``notebooks/sanitize.cfg`` masks
``| source: live on ...``. A verdict judged from
what this notebook just did (no ``Measurement``) takes ``recorded.live_source()``. ``source`` accepts a
``Measurement`` (anything with a ``.source`` string), a string, a ``{what: Measurement}`` dict, or a list of
``Measurement``s (each named by ``.name``). A verdict that reaches ``line`` / ``show`` / ``table`` without a
source raises ``ValueError``: a number with no origin is never shown.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any, Callable, Iterable, Mapping, Sequence

TRUE, FALSE = "TRUE", "FALSE"
PREFIX = "VERDICT"
SOURCE_SEP = " | source: "   # before the source on a verdict's line (the source is the line's last field)
MIXED = "MIXED: "            # before a source made of parts with different origins


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One judged claim.

    Attributes:
        claim: the statement under test, in words (quote the source where it is the source's).
        figure: the measured number(s) the verdict rests on, formatted with units.
        rule: the threshold, e.g. ``">= 1.2"`` or ``"TRUE if every size <= 64 MiB is >= 1.2x"``.
        verdict: ``"TRUE"``, ``"FALSE"`` or a word the rule defines (``"PARTLY"``, ``"ONLY BELOW 256 MiB"``).
        source: where the figure's numbers come from (``recorded.Measurement.source``, or a ``MIXED: ...``
            of several); None until ``sourced`` / ``show`` / ``table`` set it.
    """
    claim: str
    figure: str
    rule: str
    verdict: str
    source: str | None = None

    def body(self) -> str:
        """The line without its source: what the verdict says, from which numbers, by which rule."""
        return f"{PREFIX}  {self.verdict:<6} {self.claim} | {self.figure} | rule: {self.rule}"

    def line(self) -> str:
        """The one line a notebook prints and ``tests/test_claims.py`` looks for, its source last.

        Raises:
            ValueError: the verdict has no source.
        """
        return f"{self.body()}{SOURCE_SEP}{_required_source(self)}"

    def __str__(self) -> str:
        return self.line()


_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def compare(claim: str, value: float, op: str, threshold: float, *, figure: str,
            true: str = TRUE, false: str = FALSE, source: str | None = None) -> Verdict:
    """``true`` if ``value <op> threshold`` else ``false``.

    Raises:
        ValueError: an unknown operator, or a value that is not a finite number (a measurement that
            failed must not turn into a verdict).
    """
    if op not in _OPS:
        raise ValueError(f"unknown comparison {op!r}. HINT: one of {', '.join(_OPS)}.")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"cannot judge {claim!r} from a non-finite value {value!r}. "
                         "HINT: the measurement behind it failed; look at the cell that made it.")
    return Verdict(claim, figure, f"{true} if {op} {threshold:g}", true if _OPS[op](v, threshold) else false,
                   source)


def at_least(claim: str, value: float, threshold: float, *, figure: str, **words) -> Verdict:
    """``compare(claim, value, ">=", threshold, ...)``."""
    return compare(claim, value, ">=", threshold, figure=figure, **words)


def at_most(claim: str, value: float, threshold: float, *, figure: str, **words) -> Verdict:
    """``compare(claim, value, "<=", threshold, ...)``."""
    return compare(claim, value, "<=", threshold, figure=figure, **words)


def percents(value: float, limit: float, *, most_decimals: int = 6) -> tuple[str, str]:
    """``value`` and ``limit`` (fractions) as percentages rounded alike, with the fewest decimals that keep
    them in the order the unrounded numbers have: ``value <= limit`` exactly when the printed value is at most
    the printed limit. So a figure printed beside a verdict never contradicts it, as ``off by 15%`` beside
    ``within 15%`` and FALSE would (the unrounded error being 15.2%).

        percents(0.152, 0.15) == ("15.2%", "15.0%");  percents(0.07, 0.1) == ("7%", "10%")
    """
    value, limit = float(value), float(limit)
    decimals = 0
    while decimals < most_decimals and (round(value * 100, decimals) <= round(limit * 100, decimals)) != (
            value <= limit):
        decimals += 1
    return f"{value * 100:.{decimals}f}%", f"{limit * 100:.{decimals}f}%"


def within(claim: str, value: float, expected: float, rel_tol: float, *, figure: str,
           true: str = TRUE, false: str = FALSE, source: str | None = None) -> Verdict:
    """``true`` if ``|value / expected - 1| <= rel_tol`` (e.g. a prediction within 25% of a measurement).

    The rule prints the error and the tolerance with the decimals that keep them on the verdict's side of
    each other (``percents``)."""
    if not expected:
        raise ValueError(f"cannot judge {claim!r} against an expected value of {expected!r}. "
                         "HINT: the reference measurement is zero or missing.")
    err = abs(float(value) / float(expected) - 1.0)
    shown_err, shown_tol = percents(err, rel_tol)
    return Verdict(claim, figure, f"{true} if within {shown_tol} (off by {shown_err})",
                   true if err <= rel_tol else false, source)


def every(claim: str, points: Mapping[str, float], op: str, threshold: float, *, unit: str = "",
          digits: int = 3, true: str = TRUE, false: str = FALSE, source: str | None = None) -> Verdict:
    """Judge a claim on *every* measured point: ``true`` if each value of ``points`` (label -> value, e.g.
    ``{"hidden 512": 1.39, "hidden 16384": 1.02}``) satisfies ``value <op> threshold``, else ``false``.

    A claim stated without a size holds at every size the lab measured, so it is judged on all of them,
    never on the one point where it cannot fail. The figure lists every point and names the worst one::

        every("SP costs no more time than TP", {"512 tokens": 1.42, "8192 tokens": 0.98}, "<=", 1.05, unit="x")
        # VERDICT  FALSE  SP costs ... | worst 1.42x at 512 tokens; all: 512 tokens 1.42x, 8192 tokens 0.98x
        #   | rule: TRUE if every point <= 1.05

    Raises:
        ValueError: no points, an unknown operator, or a value that is not a finite number.
    """
    if not points:
        raise ValueError(f"cannot judge {claim!r} on no measured points. HINT: pass label -> value for every "
                         "point the lab measured for this claim.")
    if op not in _OPS:
        raise ValueError(f"unknown comparison {op!r}. HINT: one of {', '.join(_OPS)}.")
    values = {str(k): float(v) for k, v in points.items()}
    bad = [k for k, v in values.items() if v != v or v in (float("inf"), float("-inf"))]
    if bad:
        raise ValueError(f"cannot judge {claim!r}: the value at {', '.join(bad)} is not a finite number. "
                         "HINT: the measurement behind it failed; look at the cell that made it.")
    worst = min(values, key=values.get) if op in (">=", ">") else max(values, key=values.get)
    fmt = lambda v: f"{v:.{digits}g}{unit}"  # noqa: E731
    ok = all(_OPS[op](v, threshold) for v in values.values())
    figure = (f"worst {fmt(values[worst])} at {worst}; all: "
              + ", ".join(f"{k} {fmt(v)}" for k, v in values.items()))
    return Verdict(claim, figure, f"{true} if every point {op} {threshold:g}", true if ok else false, source)


def _required_source(v: Verdict) -> str:
    if not v.source:
        raise ValueError(
            f"the verdict on {v.claim!r} has no source. HINT: say where its numbers come from: "
            "claims.show(verdicts, m) / claims.table(verdicts, m) with the Measurement m that "
            "recorded.live_or_recorded returned, {what: m, ...} for several, or recorded.live_source() for "
            "what this notebook just did.")
    return v.source


def source_of(source: Any) -> str:
    """One source string from a ``Measurement`` (``.source``), a string, a ``{what: Measurement | str}``
    dict or a list of ``Measurement``s: the common source if all parts agree, else ``"MIXED: what: source;
    ..."`` naming each part.

    Raises:
        ValueError: nothing to take a source from (None, an empty dict or list, an empty string).
        TypeError: an object with no ``source``.
    """
    if isinstance(source, Mapping):
        parts = {str(what): source_of(m) for what, m in source.items()}
    elif isinstance(source, (list, tuple)):
        parts = {getattr(m, "name", str(i)): source_of(m) for i, m in enumerate(source)}
    else:
        s = source if isinstance(source, str) or source is None else getattr(source, "source", _NO_SOURCE)
        if s is _NO_SOURCE:
            raise TypeError(f"cannot take a verdict's source from a {type(source).__name__}. HINT: pass the "
                            "recorded.Measurement its data came from, a string, or a {what: Measurement} dict.")
        if not s:
            raise ValueError(f"empty source {source!r}. HINT: pass the recorded.Measurement the verdicts' "
                             "data came from, or recorded.live_source().")
        return s
    if not parts:
        raise ValueError("no source given (an empty dict or list). HINT: name each Measurement the verdicts "
                         "rest on: {'host <-> GPU': local, 'GPU <-> GPU': peer}.")
    if len(set(parts.values())) == 1:
        return next(iter(parts.values()))
    return MIXED + "; ".join(f"{what}: {s}" for what, s in parts.items())


_NO_SOURCE = object()


def sourced(verdicts: Sequence[Verdict] | Verdict, source: Any) -> list[Verdict]:
    """``verdicts`` with ``source_of(source)`` set on each that has none (one that has one keeps it)."""
    s = source_of(source)
    return [v if v.source else dataclasses.replace(v, source=s)
            for v in ([verdicts] if isinstance(verdicts, Verdict) else verdicts)]


def judge(table: Mapping, *measurements) -> list[Verdict]:
    """Every verdict a lab's ``CLAIMS`` gives for these measurements, each with its source, in order: a
    ``Measurement`` m is judged by ``table[m.name](m.data)``, a tuple ``(a, b)`` by
    ``table[(a.name, b.name)](a.data, b.data)`` (its source names both where they differ)::

        claims.table(claims.judge(CLAIMS, AS_WRITTEN, SWEEP, (SWEEP, TP)))

    Raises:
        KeyError: no verdict function for that recording name (or tuple of names).
    """
    out: list[Verdict] = []
    for m in measurements:
        group = tuple(m) if isinstance(m, (list, tuple)) else (m,)
        key = group[0].name if len(group) == 1 else tuple(x.name for x in group)
        if key not in table:
            raise KeyError(f"no verdict function for {key!r}. HINT: the lab's CLAIMS has "
                           f"{', '.join(map(repr, table))}.")
        out += sourced(table[key](*[x.data for x in group]), list(group) if len(group) > 1 else group[0])
    return out


def _with_source(verdicts, source) -> list[Verdict]:
    out = sourced(verdicts, source) if source is not None else (
        [verdicts] if isinstance(verdicts, Verdict) else list(verdicts))
    for v in out:
        _required_source(v)
    return out


def lines(verdicts: Iterable[Verdict]) -> list[str]:
    """The printable lines of ``verdicts`` (each must have its source)."""
    return [v.line() for v in verdicts]


def show(verdicts: Sequence[Verdict] | Verdict, source: Any = None) -> None:
    """Print one line per verdict, its source last (the notebook's output; ``tests/test_claims.py`` reads
    it back). ``source`` (see ``source_of``) is stamped on the verdicts that have none.

    Raises:
        ValueError: a verdict with no source, and none given (nothing is printed).
    """
    for line in lines(_with_source(verdicts, source)):
        print(line)


def table(verdicts: Sequence[Verdict], source: Any = None):
    """The verdicts as a pandas DataFrame (claim, verdict, figure, rule, source) for a lab's summary; a
    table of verdicts from several measurements has each row's own source.

    Raises:
        ValueError: a verdict with no source, and none given.
    """
    import pandas as pd
    return pd.DataFrame([{"claim": v.claim, "verdict": v.verdict, "figure": v.figure, "rule": v.rule,
                          "source": v.source} for v in _with_source(verdicts, source)],
                        columns=["claim", "verdict", "figure", "rule", "source"])
