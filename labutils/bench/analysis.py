"""What a benchmark result says beyond its table: each collective's primary rows, alpha-beta fits,
times interpolated between measured sizes, and the busbw plot. Pure functions of a result document
(``labutils.bench.report.make_doc``); lab 06 predicts other labs' communication with them::

    from labutils.bench import analysis
    analysis.fits(doc)["all_reduce"]            # AlphaBeta(alpha_us, beta_gbps, max_rel_err)
    analysis.time_us_at(doc, "send_one_way", 3 * 2**20)
"""
from __future__ import annotations

import bisect
import math

from .. import bandwidth
from .config import FORMS


def primary_rows(doc: dict, collective: str) -> list[dict]:
    """Timed rows of ``collective`` in its first form (out of place where torch has it), by size."""
    form = FORMS[collective][0]
    rows = [r for r in doc["rows"] if r["collective"] == collective and r["placement"] == form
            and (r.get("time_us") or 0) > 0]
    return sorted(rows, key=lambda r: r["size_bytes"])


def busbw_figure(doc: dict, title: str | None = None, prediction=None):
    """busbw vs size, one line per collective, with the link peak dotted (``plots.bandwidth_plot``);
    ``prediction=(size_bytes, gbps)`` adds the learner's star."""
    from ..plots import bandwidth_plot
    colls = list(dict.fromkeys(r["collective"] for r in doc["rows"]))
    sizes = sorted({r["size_bytes"] for c in colls for r in primary_rows(doc, c)})
    series = {}
    for c in colls:
        by = {r["size_bytes"]: r["busbw_gbps"] for r in primary_rows(doc, c)}
        if by:
            series[f"{c} ({FORMS[c][0]})"] = [by.get(s, math.nan) for s in sizes]
    hw = (doc.get("fingerprint") or "").split(" | ")[0]
    return bandwidth_plot(sizes, series, peak_gbps=doc.get("link_peak_gbps"),
                          peak_label="link peak (nvidia-smi nvlink -s)", ylabel="busbw (GB/s)",
                          prediction=prediction,
                          title=title or f"busbw vs size — {hw}, backend {doc['meta']['backend']}")


def fits(doc: dict) -> dict:
    """``{collective: bandwidth.AlphaBeta}`` fitted to each collective's primary rows (t = a + S/b,
    S as in the table). Collectives whose times do not grow with size are left out."""
    out = {}
    for coll in dict.fromkeys(r["collective"] for r in doc["rows"]):
        rows = primary_rows(doc, coll)
        try:
            out[coll] = bandwidth.fit_alpha_beta([r["size_bytes"] for r in rows],
                                                 [r["time_us"] * 1e-3 for r in rows])
        except ValueError:
            continue
    return out


def time_us_at(doc: dict, collective: str, size_bytes: float) -> float | None:
    """Measured time (us) of ``collective`` at ``size_bytes``: the sweep's point, or log-log
    interpolation between its two neighbours; None outside the measured range."""
    rows = primary_rows(doc, collective)
    xs = [math.log(r["size_bytes"]) for r in rows]
    if not rows or size_bytes <= 0 or not xs[0] <= math.log(size_bytes) <= xs[-1]:
        return None
    x = math.log(size_bytes)
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return rows[i]["time_us"]
    w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
    return math.exp((1 - w) * math.log(rows[i - 1]["time_us"]) + w * math.log(rows[i]["time_us"]))
