"""Verdicts from data: a claim, the measured figure, an explicit threshold, and the verdict that follows.

The course's first rule is that a sentence never states what the data could contradict. So a lab never
types "TRUE" or "395 GB/s" into markdown: it computes a ``Verdict`` from the live or recorded result
through a written threshold, and prints it::

    from labutils import claims
    v = claims.at_least("tip 3: NCCL beats a hand-written ring", ratio, 1.2,
                        figure=f"NCCL/ring busbw {ratio:.2f}x at 1 MiB")
    claims.show([v])
    # VERDICT  TRUE   tip 3: NCCL beats a hand-written ring | NCCL/ring busbw 4.81x at 1 MiB | rule: >= 1.2

Each lab keeps its verdict functions in ``labutils/labs/labNN_topic/claims.py`` with a table
``CLAIMS = {"03_overlap": overlap_verdicts, ...}`` from recording name (or a tuple of names) to a
function of the recordings' ``data`` dicts returning a list of ``Verdict``. ``tests/test_claims.py``
loads every recording, re-derives every verdict and checks that the committed notebook printed the
same line, so prose, recording and notebook cannot drift apart.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Callable, Iterable, Sequence

TRUE, FALSE = "TRUE", "FALSE"
PREFIX = "VERDICT"


@dataclasses.dataclass(frozen=True)
class Verdict:
    """One judged claim.

    Attributes:
        claim: the statement under test, in words (quote the source where it is the source's).
        figure: the measured number(s) the verdict rests on, formatted with units.
        rule: the threshold, e.g. ``">= 1.2"`` or ``"TRUE if every size <= 64 MiB is >= 1.2x"``.
        verdict: ``"TRUE"``, ``"FALSE"`` or a word the rule defines (``"PARTLY"``, ``"ONLY BELOW 256 MiB"``).
    """
    claim: str
    figure: str
    rule: str
    verdict: str

    def line(self) -> str:
        """The one line a notebook prints and ``tests/test_claims.py`` looks for."""
        return f"{PREFIX}  {self.verdict:<6} {self.claim} | {self.figure} | rule: {self.rule}"

    def __str__(self) -> str:
        return self.line()


_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def compare(claim: str, value: float, op: str, threshold: float, *, figure: str,
            true: str = TRUE, false: str = FALSE) -> Verdict:
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
    return Verdict(claim, figure, f"{true} if {op} {threshold:g}", true if _OPS[op](v, threshold) else false)


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
           true: str = TRUE, false: str = FALSE) -> Verdict:
    """``true`` if ``|value / expected - 1| <= rel_tol`` (e.g. a prediction within 25% of a measurement).

    The rule prints the error and the tolerance with the decimals that keep them on the verdict's side of
    each other (``percents``)."""
    if not expected:
        raise ValueError(f"cannot judge {claim!r} against an expected value of {expected!r}. "
                         "HINT: the reference measurement is zero or missing.")
    err = abs(float(value) / float(expected) - 1.0)
    shown_err, shown_tol = percents(err, rel_tol)
    return Verdict(claim, figure, f"{true} if within {shown_tol} (off by {shown_err})",
                   true if err <= rel_tol else false)


def lines(verdicts: Iterable[Verdict]) -> list[str]:
    """The printable lines of ``verdicts``."""
    return [v.line() for v in verdicts]


def show(verdicts: Sequence[Verdict] | Verdict) -> None:
    """Print one line per verdict (the notebook's output; ``tests/test_claims.py`` reads it back)."""
    for v in ([verdicts] if isinstance(verdicts, Verdict) else verdicts):
        print(v.line())


def table(verdicts: Sequence[Verdict]):
    """The verdicts as a pandas DataFrame (claim, verdict, figure, rule) for a lab's summary."""
    import pandas as pd
    return pd.DataFrame([{"claim": v.claim, "verdict": v.verdict, "figure": v.figure, "rule": v.rule}
                         for v in verdicts])
