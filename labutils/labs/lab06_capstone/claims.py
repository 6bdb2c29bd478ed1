"""Lab 06's verdicts, each from recordings through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps recording names (or tuples of them) to functions of their ``data`` dicts; the notebook
prints their lines and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/``. The
thresholds are module constants; the notebook says why each is what it is.
"""
from __future__ import annotations

import dataclasses

from ... import claims
from ...bandwidth import format_size
from ...bench import analysis as bench_analysis, report
from . import analysis

BARE_GOAL = report.BARE_GOAL       # the benchmark's call may cost at most 15% more than the bare torch call
LINK_SHARE = 2 / 3                 # "most of the link": more than two thirds of it
FIT_TOL = 0.25                     # a model that misses by more than a quarter predicts nothing useful
DEVICE_SHARE = 0.25                # "mostly host": the device's part is at most a quarter of a call
HOST_PACE = 0.8                    # the loop runs at the host's pace: issuing a call takes >= 80% of it
GRAPH_GAIN = 0.5                   # a graph must at least halve the per-call time to be worth its rules
GRAPH_LATENCY_US = 15.0            # the benchmark's goal for an 8-byte all_reduce replayed from a graph
LEFTOVER = BARE_GOAL               # a profiler or a capture "leaves nothing behind": later calls within 15%
DUPLEX_TOL = 1.25                  # small messages, "about the same": both ways within 25% of one way
TWICE = 1.5                        # "about twice": closer to 2 than to 1
FULL_DUPLEX = 1.10                 # large messages, "about one way": within 10% (the copy engines: a few %)
MORE = 1.10                        # "costs more": by more than 10%, several times the spread of 5 samples
PREDICT_TOL = 0.25                 # a prediction within 25% of the measurement
SMALL_BYTES = 32 * 2**10           # "small": every size up to 32 KiB (the small size of the notebook's section 9)


def sweep_doc(data: dict) -> dict:
    """The benchmark document of a recorded sweep (what the notebook prints as the table)."""
    return report.make_doc(data, fingerprint="", link_peak_gbps=data.get("link_peak_gbps"))


def _rows(doc: dict, coll: str) -> dict:
    return {r["size_bytes"]: r["time_us"] for r in bench_analysis.primary_rows(doc, coll)}


def both_over_one_way(doc: dict) -> list[tuple[int, float]]:
    """``[(size, send_recv time / send_one_way time)]`` at the sizes both were measured (empty for a
    sweep recorded before send_one_way existed)."""
    both, one = _rows(doc, "send_recv"), _rows(doc, "send_one_way")
    return [(s, both[s] / one[s]) for s in sorted(set(both) & set(one))]


def sweep_verdicts(data: dict) -> list[claims.Verdict]:
    doc = sweep_doc(data)
    s = doc["summary"]
    out = [claims.compare("every collective returns the right data", s["wrong_total"], "<=", 0,
                          figure=f"{s['wrong_total']} wrong elements in {s['checked']} checked results")]
    ratios = s["bench_over_bare"]
    if ratios:  # every collective measured: the claim is stated for each call the table times
        out.append(report.bare_verdict(ratios))
    if s["peak_fraction_of_link"]:
        p = s["peak"]
        out.append(claims.at_least("the best busbw uses most of the physical link", s["peak_fraction_of_link"],
                                   round(LINK_SHARE, 3),
                                   figure=f"{p['busbw_gbps']:.0f} GB/s ({p['collective']}, "
                                          f"{format_size(p['size_bytes'])}) = {s['peak_fraction_of_link']:.0%} "
                                          f"of {s['link_peak_gbps']} GB/s"))
    fits = bench_analysis.fits(doc)
    if fits:
        worst = max(fits, key=lambda c: fits[c].max_rel_err)
        out.append(claims.at_most("two numbers (alpha, beta) describe each collective at every measured size",
                                  fits[worst].max_rel_err, FIT_TOL,
                                  figure=f"largest miss of a fit: {fits[worst].max_rel_err:.0%} ({worst}); "
                                         f"median over collectives "
                                         f"{sorted(f.max_rel_err for f in fits.values())[len(fits) // 2]:.0%}"))
    return out


def graph_verdicts(data: dict) -> list[claims.Verdict]:
    """The goal for a replayed 8-byte all_reduce, judged on both of the sweep's measurements of it: the line
    timed first and the table's 8 B row (the same loop, later). (Whether every replayed result is right is
    the table's own "Wrong elements" line.)"""
    s = sweep_doc(data)["summary"]
    points = {k: v for k, v in (("the line timed first", s["graph_latency_us"]),
                                ("the table's 8 B row", s["table_8b_us"])) if v is not None}
    if not points:
        return []
    return [claims.every(f"an 8-byte all_reduce replayed from a CUDA graph takes at most {GRAPH_LATENCY_US:g} us",
                         points, "<=", GRAPH_LATENCY_US, unit=" us")]


def small_sizes(ratios: list[tuple[int, float]]) -> dict[str, float]:
    """``{size label: ratio}`` at the sizes a sweep measured up to ``SMALL_BYTES``."""
    return {format_size(s): r for s, r in ratios if s <= SMALL_BYTES}


def duplex_verdicts(sweep: dict, graph: dict) -> list[claims.Verdict]:
    """Small messages, at every size up to ``SMALL_BYTES`` the sweeps measured: eager and replayed."""
    out = []
    eager = small_sizes(both_over_one_way(sweep_doc(sweep)))
    if eager:
        out.append(claims.every(f"launched eagerly, a small exchange (up to {format_size(SMALL_BYTES)}) both ways "
                                "costs about twice one way (send_recv / send_one_way)", eager, ">=", TWICE))
    replayed = small_sizes(both_over_one_way(sweep_doc(graph)))
    if replayed:
        out.append(claims.every(f"replayed from a CUDA graph, a small exchange (up to {format_size(SMALL_BYTES)}) "
                                "both ways costs about one way (send_recv / send_one_way)", replayed, "<=", DUPLEX_TOL))
    return out


def middle_sizes(ratios: list[tuple[int, float]]) -> list[tuple[int, float]]:
    """The large-size sweep's sizes up to a quarter of its largest (64-256 MiB for 64 MiB-1 GiB)."""
    largest = ratios[-1][0]
    return [(s, r) for s, r in ratios if 4 * s <= largest]


def large_duplex_verdicts(duplex: dict) -> list[claims.Verdict]:
    """Large messages, from the dense sweep (factor 2, five samples a point): the middle of the range and
    the largest size."""
    ratios = both_over_one_way(sweep_doc(duplex))
    if len(ratios) < 2:
        return []
    every = ", ".join(f"{format_size(s)} {r:.2f}" for s, r in ratios)
    out = []
    mid = middle_sizes(ratios)
    if mid:  # a claim about a range of sizes holds at each of them
        v = claims.every(f"from {format_size(mid[0][0])} to {format_size(mid[-1][0])}, an exchange both ways costs "
                         "more than one way (send_recv / send_one_way)", {format_size(s): r for s, r in mid},
                         ">=", MORE)
        out.append(dataclasses.replace(v, figure=f"{v.figure.split('; all:')[0]}; every size: {every}"))
    size, r = ratios[-1]
    out.append(claims.at_most(f"the link is full duplex: at {format_size(size)} an exchange both ways costs "
                              "about one way", r, FULL_DUPLEX,
                              figure=f"send_recv / send_one_way = {r:.2f} at {format_size(size)}"))
    return out


def alpha_verdicts(data: dict) -> list[claims.Verdict]:
    a = analysis.alpha_split(data["ranks"])
    size = format_size(data["size_bytes"])
    out = [
        claims.at_most(f"a {size} all_reduce's time is mostly the host's: the NCCL kernel is a small part of it",
                       a["device_share"], DEVICE_SHARE,
                       figure=f"NCCL kernel (rank that launched last) {a['transfer_us']:.1f} us of "
                              f"{a['eager_us']:.1f} us per eager call = {a['device_share']:.0%}"),
        claims.at_least(f"back to back, {size} all_reduces run at the pace the host issues them",
                        a["host_us"] / a["eager_us"], HOST_PACE,
                        figure=f"host {a['host_us']:.1f} us to issue one call (no profiler), "
                               f"{a['eager_us']:.1f} us per call on the GPU's clock"),
    ]
    return out


def after_profiler_verdicts(data: dict) -> list[claims.Verdict]:
    """The appendix: the same eager loop timed again once the profiler has stopped, against its time before."""
    a = analysis.alpha_split(data["ranks"])
    if a.get("eager_after_us") is None:  # recordings from before the re-measurement have no such field
        return []
    return [claims.at_most("the profiler leaves nothing behind: eager calls after it cost what they did before",
                           a["eager_after_us"] / a["eager_us"], LEFTOVER,
                           figure=f"{format_size(data['size_bytes'])} all_reduce: {a['eager_us']:.1f} us per call "
                                  f"before the profiler, {a['eager_after_us']:.1f} us after it")]


def capture_verdicts(data: dict) -> list[claims.Verdict]:
    """The graph against the same loop launched eagerly, the two timed in turn, sample by sample, in one
    block (``graph_us``, ``eager_us``). (Whether the replay is right is printed beside it.)"""
    size = format_size(data["size_bytes"])
    return [claims.at_most(f"replayed from a CUDA graph, a {size} all_reduce costs at most half its eager time",
                           data["graph_us"] / data["eager_us"], GRAPH_GAIN,
                           figure=f"{data['graph_us']:.1f} us per call from the graph, {data['eager_us']:.1f} us "
                                  f"eager, the two loops timed in turn ({format_size(data['size_bytes'])})")]


def after_capture_verdicts(data: dict) -> list[claims.Verdict]:
    """The appendix: where the eager loop was also timed right before the capture (``eager_before_us``),
    whether the capture changed it."""
    before = data.get("eager_before_us")
    if not before:
        return []
    return [claims.at_most("a capture leaves nothing behind: eager calls after it cost what they did before",
                           data["eager_us"] / before, LEFTOVER,
                           figure=f"{before:.1f} us per eager call before the capture, "
                                  f"{data['eager_us']:.1f} us after it")]


def lab_predictions(sweep: dict, lab: dict, default_p2p: str = analysis.BOTH_WAYS,
                    measured: str = "measured_ms") -> list[dict]:
    """Rows of ``analysis.predictions`` for a lab's summary, from a sweep's fits (eager or graph)."""
    doc = sweep_doc(sweep)
    return analysis.predictions(bench_analysis.fits(doc), analysis.comm_ops(lab), doc["meta"]["world_size"],
                                default_p2p, measured)


def _prediction_verdict(claim: str, rows: list[dict]) -> claims.Verdict | None:
    """``claim`` (a fit predicts a lab's calls) judged on every op the lab recorded: each prediction within
    ``PREDICT_TOL`` of its measurement (the points are |predicted / measured - 1|)."""
    points = {}
    for r in rows:
        if r["ratio"] is None:
            continue
        label = f"{r['what'].split(',')[0]} {format_size(r['size_bytes'])}"
        while label in points:
            label += "'"
        points[label] = abs(r["ratio"] - 1.0)
    if not points:
        return None
    return claims.every(f"{claim}: every op within {PREDICT_TOL:.0%} (|predicted / measured - 1|)", points, "<=",
                        PREDICT_TOL, digits=2)


def lab04_verdicts(sweep: dict, lab04: dict) -> list[claims.Verdict]:
    """The model the lab predicts lab 04 with: the one-way fit. (The send_recv fit's miss is the table's column.)"""
    v = _prediction_verdict("the one-way fit predicts lab 04's sends", lab_predictions(sweep, lab04, analysis.ONE_WAY))
    return [] if v is None else [v]


def has_transfer_times(lab02: dict) -> bool:
    """Whether lab 02's summary records each call's transfer (``kernel_ms``) next to its in-step time."""
    return any(op.get("kernel_ms") for op in lab02["ops"])


def lab02_verdicts(sweep: dict, graph: dict, lab02: dict) -> list[claims.Verdict]:
    """With transfer times (lab 02's profiler: the shortest kernel of a call): the device-time fit (CUDA graph,
    no host launch) against the transfer -- like with like -- and against the time in the step (transfer +
    waiting). Without them (an older recording): the eager fit against the in-step time."""
    device = "all_reduce" in bench_analysis.fits(sweep_doc(graph))
    if has_transfer_times(lab02) and device:
        out = [_prediction_verdict("the device-time fit (CUDA graph) predicts lab 02's transfer (shortest kernel)",
                                   lab_predictions(graph, lab02, measured="kernel_ms"))]
    else:
        out = [_prediction_verdict("the all_reduce fit predicts lab 02's all_reduce as lab 02 times it (in the step)",
                                   lab_predictions(sweep, lab02))]
    return [v for v in out if v is not None]


CLAIMS = {
    "06_bench_sweep": sweep_verdicts,
    "06_bench_graph": graph_verdicts,
    ("06_bench_sweep", "06_bench_graph"): duplex_verdicts,
    "06_duplex": large_duplex_verdicts,
    "06_alpha_split": alpha_verdicts,
    "06_graph_capture": capture_verdicts,
    ("06_bench_sweep", "04_comm_summary"): lab04_verdicts,
    ("06_bench_sweep", "06_bench_graph", "02_comm_summary"): lab02_verdicts,
    # the optional appendix judges the same two recordings again (a 1-tuple is a second key for one recording)
    ("06_alpha_split",): after_profiler_verdicts,
    ("06_graph_capture",): after_capture_verdicts,
}


def one_gpu_launch_verdicts(data: dict) -> list[claims.Verdict]:
    """``06_one_gpu_launch``: a tiny kernel on one GPU -- host launch, device time, CUDA-graph replay."""
    eager = data["eager_us"]
    share = data["device_us"] / eager
    return [
        claims.at_most("the device's part of a tiny kernel's eager call is small", share, DEVICE_SHARE,
                       figure=f"device {data['device_us']:.2f} us (queued) of {eager:.2f} us per eager call = "
                              f"{claims.percents(share, DEVICE_SHARE)[0]} ({data['kernel']})"),
        claims.at_least("back to back, tiny kernels run at the pace the host launches them",
                        data["host_us"] / eager, HOST_PACE,
                        figure=f"host {data['host_us']:.2f} us to launch one, {eager:.2f} us per call on the "
                               "GPU's clock"),
        claims.at_most("replayed from a CUDA graph, a tiny kernel costs at most half its eager time",
                       data["graph_us"] / eager, GRAPH_GAIN,
                       figure=f"{data['graph_us']:.2f} us per kernel from the graph, {eager:.2f} us eager"),
    ]  # whether the replayed kernels are right is printed beside them


CLAIMS["06_one_gpu_launch"] = one_gpu_launch_verdicts
