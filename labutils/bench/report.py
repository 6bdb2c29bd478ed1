"""What ``python -m labutils bench`` prints: the header, the nccl-tests table, the latency lines, the
summary and the Markdown note. Pure functions of the result (no GPU, no processes)::

    from labutils.bench import report
    doc = report.make_doc(result, fingerprint=..., link_peak_gbps=478.1)
    print("\\n".join(report.table_lines(doc)))

``result`` is what ``labutils.bench.sweep.sweep`` returns: ``meta``, ``mode``, ``latency``,
``graph_latency`` and ``rows`` (one per collective, size and placement; ``time_us``, ``algbw_gbps``,
``busbw_gbps``, ``wrong``, ``bare_us``). Column layout and number formats are nccl-tests'
(``src/common.cu``, ``Reporter``). Files are ``labutils.bench.files``; fits and the plot
``labutils.bench.analysis``.
"""
from __future__ import annotations

import datetime as _dt
import statistics

from .. import bandwidth, claims
from .config import AUTO_ITERS, P2P_FORMS, PLACEMENTS

BARE_GOAL = 1.15  # the benchmark's call may cost at most this much more than a bare loop of the torch call
BARE_CLAIM = ("the benchmark adds (almost) nothing to the torch call it times: for every collective, its per-call "
              f"time is within {BARE_GOAL - 1:.0%} of a bare loop of the same call")
FIRST = "8-byte all_reduce, timed first"   # the line measured before the table (``sweep``'s ``latency``)

_HEAD = ("# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place"
         % ("", "", "", "", ""))
_NAMES = ("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s"
          % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
             "time", "algbw", "busbw", "#wrong"))
_UNITS = ("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s"
          % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
             "(GB/s)", "")).rstrip()



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
    graphs = cfg.get("cuda_graph") or 0
    iters = cfg["iters"] if cfg["iters"] is not None else f"auto ({AUTO_ITERS})"
    lines = [f"# labutils bench: nccl-tests-style benchmark of torch.distributed collectives, "
             f"backend {meta['backend']}",
             f"# fingerprint: {doc.get('fingerprint', 'unknown')}",
             f"# world_size {meta['world_size']} on {meta['nodes']} node(s) | minBytes {cfg['minbytes']} "
             f"maxBytes {cfg['maxbytes']} step: {cfg['stepfactor']}(factor) | type {cfg['datatype']} "
             f"| redop {cfg['redop']} | root {cfg['root']}",
             f"# warmup iters: {cfg['warmup_iters']} at the largest and smallest size, 1 per point "
             f"| iters: {iters} | repeat: {cfg['repeat']} | validation: {cfg['check']}"
             + (f" | cuda graph launches: {graphs}" if graphs else "")]
    if graphs:
        lines += [f"# mode: CUDA graph (-G {graphs}): each point's `iters` calls captured in one graph (after a "
                  "warm-up on a side stream), replayed",
                  f"#   {graphs} times back to back between two CUDA events; time per call = sample / "
                  f"({graphs} x iters): the device's time per call, without the host's launch of each call",
                  f"#   (the {FIRST} is printed both ways; validation replays a captured one-call graph)"]
    else:
        lines += ["# mode: eager: `iters` calls back to back "
                  + ("between two CUDA events; each call pays the host's launch (Python, dispatcher, "
                     "ProcessGroupNCCL, kernel launch)" if gpu else "timed with perf_counter")]
    lines.append("# time: median over `repeat` samples of the slowest rank's time per call")
    if cfg.get("latency", True):
        lines += [f"# {FIRST}: the table's own loop (per call of `iters` back to back, slowest rank), run once "
                  "before the table, at 8 B whatever -b is;",
                  "#   the table's 8 B row is the same loop later in the run, on a view of the largest buffer: the two "
                  "differ by when they ran. Neither is one call alone (that would also wait for its launch and a "
                  "synchronize)"]
    if not graphs and cfg.get("bare", False):
        lines.append("# bench/bare: at each collective's smallest size a bare loop of the same torch call "
                     "(nothing around it) is timed in turn with the benchmark's loop; the summary gives the "
                     f"ratio (goal <= {BARE_GOAL})")
    for coll in cfg["collectives"]:
        if coll in P2P_FORMS:
            lines.append(f"# {coll}: {P2P_FORMS[coll]}")
    lines.append("# N/A: no such form in torch.distributed (all_reduce, broadcast, reduce work in place; "
                 "all_to_all and send/recv need two buffers)")
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
    """The line of the 8-byte all_reduce timed first, before the table (eager, with the bare loop beside it,
    or replayed from a CUDA graph): per call of ``iters`` back to back, as the table's rows."""
    graph = row.get("mode") == "graph"
    text = (f"# {FIRST}{' (CUDA graph)' if graph else ''}: {row['size_bytes']} B "
            f"({row['count']} x {row['type']}, in place), per call of {row['iters']} back to back: "
            f"{format_time_us(row['time_us'])} us median "
            f"(p10 {format_time_us(row['p10_us'])}, p90 {format_time_us(row['p90_us'])}), "
            f"#wrong {'N/A' if row['wrong'] is None else row['wrong']}")
    if row.get("bare_us"):
        text += (f" | bare loop {format_time_us(row['bare_us'])} us, bench/bare "
                 f"{row['time_us'] / row['bare_us']:.2f}")
    if row.get("sample_start_us") is not None:
        text += (f" | per-sample start {row['sample_start_us']:.0f} us = "
                 f"+{row['sample_start_us'] / row['iters']:.2f} us per call at {row['iters']} calls per sample")
    return text


def summarize(doc: dict) -> dict:
    """Average and peak busbw (as nccl-tests' last lines), busbw at each collective's largest size,
    the 8-byte all_reduce timed first and the table's 8 B row, wrong elements, and the peak as a fraction
    of the link peak (if known)."""
    rows = doc["rows"]
    timed = [r for r in rows if r.get("busbw_gbps") is not None]
    lat = doc.get("latency")
    checked = [r for r in rows + [x for x in (lat, doc.get("graph_latency")) if x] if r.get("wrong") is not None]
    at_max = {}
    for coll in dict.fromkeys(r["collective"] for r in timed):
        mine = [r for r in timed if r["collective"] == coll]
        top = max(r["size_bytes"] for r in mine)
        best = max((r for r in mine if r["size_bytes"] == top), key=lambda r: r["busbw_gbps"])
        at_max[coll] = {k: best[k] for k in ("size_bytes", "placement", "busbw_gbps", "algbw_gbps", "time_us")}
    peak = max(timed, key=lambda r: r["busbw_gbps"]) if timed else None
    link = doc.get("link_peak_gbps")
    graph_lat = doc.get("graph_latency")
    return {
        "table_8b_us": table_8b_us(doc),
        "mode": doc.get("mode") or doc["meta"].get("mode", "eager"), "backend": doc["meta"]["backend"],
        "bench_over_bare": bench_over_bare(doc),
        "graph_latency_us": graph_lat["time_us"] if graph_lat else None,
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


def table_8b_us(doc: dict) -> float | None:
    """The per-call time in the table's own 8-byte in-place all_reduce row (the same loop as the line timed
    first, later in the run), or None where the table has no such row (-b above 8, no all_reduce)."""
    return next((r["time_us"] for r in doc["rows"] if r["collective"] == "all_reduce" and r["size_bytes"] == 8
                 and r["placement"] == "in-place" and r.get("time_us") is not None), None)


def bare_verdict(ratios: dict) -> claims.Verdict:
    """The benchmark's goal, judged on every collective whose bare loop was timed (``bench_over_bare``): each
    ratio at most ``BARE_GOAL``. The summary line and lab 06 use this one rule."""
    return claims.every(BARE_CLAIM, {bare_label(k): v for k, v in ratios.items()}, "<=", BARE_GOAL, unit="x")


def bare_label(key: str) -> str:
    """How a key of ``bench_over_bare`` is printed: the collective, or the 8-byte all_reduce timed first."""
    return "8 B all_reduce timed first" if key == "latency" else key


def bench_over_bare(doc: dict) -> dict:
    """``{collective: benchmark's time / bare loop's time}`` where a bare loop was timed beside
    (the 8-byte all_reduce timed first as ``"latency"``); empty for a recording made before bare loops existed."""
    rows = ([dict(doc["latency"], collective="latency")] if doc.get("latency") else []) + doc["rows"]
    return {r["collective"]: r["time_us"] / r["bare_us"] for r in rows
            if r.get("bare_us") and r.get("time_us")}


def summary_lines(summary: dict) -> list[str]:
    """nccl-tests' closing lines, plus the peak against the link and the 8-byte all_reduce."""
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
    table = s.get("table_8b_us")
    graph = s.get("mode") == "graph"
    later = ("" if table is None else f"; the table's 8 B row, the same loop later{' (replayed)' if graph else ''}: "
             f"{format_time_us(table)} us")
    if s["latency_us"] is not None:
        lines.append(f"# 8-byte all_reduce   : {format_time_us(s['latency_us'])} us timed first (in place, per call "
                     f"back to back, slowest rank, eager){'' if graph else later}")
    if s.get("graph_latency_us") is not None:
        lines.append(f"# 8-byte all_reduce   : {format_time_us(s['graph_latency_us'])} us timed first, replayed "
                     f"from a CUDA graph (eager - graph = the host's launch of a call){later}")
    ratios = s.get("bench_over_bare") or {}
    if ratios:
        worst = max(ratios.values())
        met = bare_verdict(ratios).verdict == claims.TRUE
        goal = (f"goal <= {BARE_GOAL} for every one: {'met' if met else 'NOT met'}"
                if s.get("backend") == "nccl" else "on CPU cores shared by the ranks, noise dominates")
        lines.append("# bench / bare loop    : " + " | ".join(f"{bare_label(c)} {v:.2f}" for c, v in ratios.items())
                     + f" (per-call time over a bare loop of the same torch call; max {worst:.2f}, {goal})")
    if s.get("sweep_s") is not None:
        wall = f", {s['wall_s']:.1f} s wall time with start-up" if s.get("wall_s") else ""
        lines.append(f"# Duration             : {s['sweep_s']:.1f} s sweep{wall}")
    return lines


def table_lines(doc: dict) -> list[str]:
    """Everything the CLI prints, from a result document (also to re-print a recorded run)."""
    lines = header_lines(doc)
    if doc.get("latency"):
        lines += ["#", latency_line(doc["latency"])]
    if doc.get("graph_latency"):
        lines.append(latency_line(doc["graph_latency"]))
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
        graph = (f"; replayed from a CUDA graph: {format_time_us(s['graph_latency_us'])} us"
                 if s.get("graph_latency_us") is not None else "")
        lines += ["", f"8-byte all_reduce, timed first (per call back to back): {format_time_us(s['latency_us'])} us "
                  f"eager{graph}."]
    if s.get("bench_over_bare"):
        lines += ["", "Per-call time of the benchmark over a bare loop of the same torch call (smallest size): "
                  + ", ".join(f"{c} {v:.2f}" for c, v in s["bench_over_bare"].items()) + "."]
    if s["peak"] and link:
        p = s["peak"]
        lines += ["", f"Peak busbw {p['busbw_gbps']:.1f} GB/s ({p['collective']}, "
                  f"{bandwidth.format_size(p['size_bytes'])}) = {s['peak_fraction_of_link']:.0%} of the "
                  f"{link} GB/s per direction that `nvidia-smi nvlink -s` reports for one GPU."]
    return "\n".join(lines)
