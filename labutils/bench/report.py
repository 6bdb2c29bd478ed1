"""What ``python -m labutils bench`` prints and writes: the nccl-tests table, the summary, CSV/JSON,
the busbw plot and alpha-beta fits. Pure functions of the result (no GPU, no processes)::

    from labutils.bench import report
    doc = report.make_doc(result, fingerprint=..., link_peak_gbps=478.1)
    print("\\n".join(report.table_lines(doc)))

``result`` is what ``labutils.bench.sweep.sweep`` returns: ``meta``, ``latency`` and ``rows`` (one per
collective, size and placement; ``time_us``, ``algbw_gbps``, ``busbw_gbps``, ``wrong``).
Column layout and number formats are nccl-tests' (``src/common.cu``, ``Reporter``).
"""
from __future__ import annotations

import bisect
import csv
import datetime as _dt
import json
import math
import statistics
from pathlib import Path

from .. import bandwidth
from .config import FORMS, PLACEMENTS

_HEAD = ("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
         % ("", "", "", "", ""))
_NAMES = ("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
          % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
             "time", "algbw", "busbw", "#wrong"))
_UNITS = ("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
          % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
             "(GB/s)", "")).rstrip()
CSV_COLUMNS = ("kind", "collective", "placement", "size_bytes", "count", "type", "redop", "root",
               "time_us", "p10_us", "p90_us", "algbw_gbps", "busbw_gbps", "wrong", "iters", "repeat",
               "world_size", "backend", "fingerprint")


def format_time_us(us: float | None) -> str:
    """nccl-tests' time format: 2 decimals below 100 us, 1 below 10 ms, none above."""
    if us is None:
        return "N/A"
    return f"{us:.0f}" if us >= 10000 else (f"{us:.1f}" if us >= 100 else f"{us:.2f}")


def make_doc(result: dict, *, fingerprint: str, link_peak_gbps: float | None = None,
             command: str = "", recorded_at: str | None = None, wall_s: float | None = None) -> dict:
    """The JSON document: the sweep's result plus provenance (date: now unless given) and the summary."""
    from .. import __version__
    doc = {"tool": "labutils bench", "labutils_version": __version__, "command": command,
           "recorded_at": recorded_at or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "fingerprint": fingerprint, "link_peak_gbps": link_peak_gbps, "wall_s": wall_s, **result}
    doc["summary"] = summarize(doc)
    return doc


def points(rows: list) -> list[tuple[str, int, list]]:
    """Group rows by (collective, size) in sweep order: ``[(collective, size_bytes, rows)]``."""
    out: dict = {}
    for r in rows:
        out.setdefault((r["collective"], r["size_bytes"]), []).append(r)
    return [(c, s, rs) for (c, s), rs in out.items()]


def header_lines(doc: dict) -> list[str]:
    """The header: tool, fingerprint, options, method, devices (nccl-tests prints the same facts)."""
    meta, cfg = doc["meta"], doc["meta"]["config"]
    gpu = meta["backend"] == "nccl"
    iters = cfg["iters"] if cfg["iters"] is not None else \
        "auto (20 per sample up to 64 MiB, then fewer as the size doubles, at least 5)"
    lines = [f"# labutils bench: nccl-tests-style benchmark of torch.distributed collectives, "
             f"backend {meta['backend']}",
             f"# fingerprint: {doc.get('fingerprint', 'unknown')}",
             f"# world_size {meta['world_size']} on {meta['nodes']} node(s) | minBytes {cfg['minbytes']} "
             f"maxBytes {cfg['maxbytes']} step: {cfg['stepfactor']}(factor) | type {cfg['datatype']} "
             f"| redop {cfg['redop']} | root {cfg['root']}",
             f"# warmup iters: {cfg['warmup_iters']} at the largest and smallest size, 1 per point "
             f"| iters: {iters} | repeat: {cfg['repeat']} | validation: {cfg['check']}",
             "# time: median over `repeat` samples of the slowest rank's time per call, `iters` calls "
             f"back to back {'between two CUDA events' if gpu else 'timed with perf_counter'}",
             "# N/A: no such form in torch.distributed (all_reduce, broadcast, reduce work in place; "
             "all_to_all, send_recv need two buffers)"]
    if not gpu:
        lines.append("# CPU/gloo run: these numbers measure gloo over loopback on CPU cores, "
                     "not GPU links. Labelled as such; never compare them with NVLink.")
    lines += ["#", "# Using devices"]
    lines += [f"#  Rank {d['rank']:2d} on {d['host']} device {d['device']} {d['name']}".rstrip()
              for d in meta["devices"]]
    return lines


def block_lines(collective: str) -> list[str]:
    """Title and the three column-header lines of one collective's table."""
    return ["#", f"# {collective}", _HEAD, _NAMES, _UNITS]


def _cell(r: dict | None) -> str:
    if r is None:
        return "  %7s  %6s  %6s  %5s" % ("N/A", "N/A", "N/A", "N/A")
    bw = ["%6.2f" % r[k] if r.get(k) is not None else "%6s" % "N/A" for k in ("algbw_gbps", "busbw_gbps")]
    wrong = "N/A" if r.get("wrong") is None else str(r["wrong"])
    return f"  {format_time_us(r.get('time_us')):>7s}  {bw[0]}  {bw[1]}  {wrong:>5s}"


def row_line(rows: list) -> str:
    """One table line for the rows of one (collective, size): out-of-place then in-place cells."""
    r0 = rows[0]
    by = {r["placement"]: r for r in rows}
    return ("%12d  %12d  %8s  %6s  %6d" % (r0["size_bytes"], r0["count"], r0["type"], r0["redop"], r0["root"])
            + "".join(_cell(by.get(p)) for p in PLACEMENTS))


def latency_line(row: dict) -> str:
    """The 8-byte all_reduce latency line."""
    return (f"# 8-byte latency: all_reduce of {row['size_bytes']} B ({row['count']} x {row['type']}, "
            f"in place): {format_time_us(row['time_us'])} us median (p10 {format_time_us(row['p10_us'])}, "
            f"p90 {format_time_us(row['p90_us'])}), #wrong {'N/A' if row['wrong'] is None else row['wrong']}")


def summarize(doc: dict) -> dict:
    """Average and peak busbw (as nccl-tests' last lines), busbw at each collective's largest size,
    the 8-byte latency, wrong elements, and the peak as a fraction of the link peak (if known)."""
    rows = doc["rows"]
    timed = [r for r in rows if r.get("busbw_gbps") is not None]
    lat = doc.get("latency")
    checked = [r for r in rows + ([lat] if lat else []) if r.get("wrong") is not None]
    at_max = {}
    for coll in dict.fromkeys(r["collective"] for r in timed):
        mine = [r for r in timed if r["collective"] == coll]
        top = max(r["size_bytes"] for r in mine)
        best = max((r for r in mine if r["size_bytes"] == top), key=lambda r: r["busbw_gbps"])
        at_max[coll] = {k: best[k] for k in ("size_bytes", "placement", "busbw_gbps", "algbw_gbps", "time_us")}
    peak = max(timed, key=lambda r: r["busbw_gbps"]) if timed else None
    link = doc.get("link_peak_gbps")
    return {
        "points": len(timed),
        "avg_busbw_gbps": statistics.fmean(r["busbw_gbps"] for r in timed) if timed else None,
        "peak": {k: peak[k] for k in ("collective", "size_bytes", "placement", "busbw_gbps")} if peak else None,
        "busbw_at_max": at_max,
        "latency_us": lat["time_us"] if lat else None,
        "wrong_total": sum(r["wrong"] for r in checked), "checked": len(checked),
        "link_peak_gbps": link,
        "peak_fraction_of_link": peak["busbw_gbps"] / link if (peak and link) else None,
        "sweep_s": doc.get("elapsed_s"), "wall_s": doc.get("wall_s"),
    }


def summary_lines(summary: dict) -> list[str]:
    """nccl-tests' closing lines, plus the peak against the link and the 8-byte latency."""
    s = summary
    ok = "OK" if s["wrong_total"] == 0 else "FAILED"
    lines = [f"# Wrong elements       : {s['wrong_total']} {ok} ({s['checked']} results checked)"
             if s["checked"] else "# Wrong elements       : not checked (-c 0)"]
    if s["avg_busbw_gbps"] is not None:
        p = s["peak"]
        lines.append(f"# Avg bus bandwidth    : {s['avg_busbw_gbps']:.3f} GB/s (mean over {s['points']} points)")
        vs = (f" = {s['peak_fraction_of_link']:.1%} of the link peak {s['link_peak_gbps']} GB/s per direction"
              if s["peak_fraction_of_link"] else " (no GPU link peak to compare with)")
        lines.append(f"# Peak bus bandwidth   : {p['busbw_gbps']:.2f} GB/s ({p['collective']}, "
                     f"{bandwidth.format_size(p['size_bytes'])}, {p['placement']}){vs}")
        lines.append("# busbw at the largest size: " + " | ".join(
            (f"{c} {v['busbw_gbps']:.1f}" if v["busbw_gbps"] >= 10 else f"{c} {v['busbw_gbps']:.3g}")
            + f" @ {bandwidth.format_size(v['size_bytes'])}"
            for c, v in s["busbw_at_max"].items()) + " (GB/s)")
    if s["latency_us"] is not None:
        lines.append(f"# 8-byte latency       : {format_time_us(s['latency_us'])} us (all_reduce, in place, "
                     "slowest rank)")
    if s.get("sweep_s") is not None:
        wall = f", {s['wall_s']:.1f} s wall time with start-up" if s.get("wall_s") else ""
        lines.append(f"# Duration             : {s['sweep_s']:.1f} s sweep{wall}")
    return lines


def table_lines(doc: dict) -> list[str]:
    """Everything the CLI prints, from a result document (also to re-print a recorded run)."""
    lines = header_lines(doc)
    if doc.get("latency"):
        lines += ["#", latency_line(doc["latency"])]
    current = None
    for coll, _, rows in points(doc["rows"]):
        if coll != current:
            lines += block_lines(coll)
            current = coll
        lines.append(row_line(rows))
    return lines + ["#"] + summary_lines(doc.get("summary") or summarize(doc))


def link_note(doc: dict) -> str:
    """Markdown note for benchmarks/README.md: peak busbw vs the physical link, per collective."""
    s = doc.get("summary") or summarize(doc)
    link = s["link_peak_gbps"]
    lines = [f"Run: `{doc.get('command', '')}` on {doc.get('fingerprint')} ({doc.get('recorded_at', '')[:10]}), "
             f"{s['wrong_total']} wrong elements in {s['checked']} checked results.", "",
             "| collective | size | busbw (GB/s) | algbw (GB/s) | time (us) | busbw / link peak |",
             "|---|---|---|---|---|---|"]
    for coll, v in s["busbw_at_max"].items():
        frac = f"{v['busbw_gbps'] / link:.0%}" if link else "n/a"
        lines.append(f"| {coll} ({v['placement']}) | {bandwidth.format_size(v['size_bytes'])} | "
                     f"{v['busbw_gbps']:.1f} | {v['algbw_gbps']:.1f} | {format_time_us(v['time_us'])} | {frac} |")
    if s["latency_us"] is not None:
        lines += ["", f"8-byte all_reduce latency: {format_time_us(s['latency_us'])} us."]
    if s["peak"] and link:
        p = s["peak"]
        lines += ["", f"Peak busbw {p['busbw_gbps']:.1f} GB/s ({p['collective']}, "
                  f"{bandwidth.format_size(p['size_bytes'])}) = {s['peak_fraction_of_link']:.0%} of the "
                  f"{link} GB/s per direction that `nvidia-smi nvlink -s` reports for one GPU."]
    return "\n".join(lines)


def write_json(path, doc: dict) -> Path:
    path = Path(path)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load_json(path) -> dict:
    """Read a document written by ``write_json`` (the summary is recomputed if absent)."""
    doc = json.loads(Path(path).read_text())
    if not {"meta", "rows"} <= doc.keys():
        raise ValueError(f"{path} is not a labutils bench result (no 'meta'/'rows'). "
                         "HINT: pass a file written by `python -m labutils bench --json`.")
    doc.setdefault("summary", summarize(doc))
    return doc


def csv_rows(doc: dict) -> list[dict]:
    """Tidy rows (one per measurement, the latency line first) with the fingerprint in each."""
    extra = {"world_size": doc["meta"]["world_size"], "backend": doc["meta"]["backend"],
             "fingerprint": doc.get("fingerprint", "")}
    out = [{"kind": "latency", **doc["latency"], **extra}] if doc.get("latency") else []
    out += [{"kind": "sweep", **r, **extra} for r in doc["rows"]]
    return [{k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS} for row in out]


def write_csv(path, doc: dict) -> Path:
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(csv_rows(doc))
    return path


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
