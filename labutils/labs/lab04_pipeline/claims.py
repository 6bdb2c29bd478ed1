"""Lab 04's verdicts, each from a recording through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps recording names to functions of their ``data`` dicts; the notebook prints their lines
and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/04_*.json``. Thresholds:

* a speedup counts only above the noise: 1 + the larger relative spread (p90 - p10) / median of the
  two sets of step samples compared (``noise``), never below ``NOISE_FLOOR``;
* a predicted bubble is right within 2 percentage points, or the measured bubble's own p10-p90 range
  over the samples where that is wider (``analysis.bubble_tolerance``);
* a predicted peak memory is right within ``MEMORY_TOL`` (10%): what it leaves out (allocator
  rounding, small buffers of a few MiB) is smaller than that;
* a clock counts as higher from ``CLOCK_RATIO`` (2%) up, above the tens of MHz in which NVML reports it;
* a clock-event reason (NVML) holds the clock when it is set in at least ``MOST`` (half) of the readings
  taken while the steps ran, and resting lifts it when it is set in ``LIFTED`` (25 points) fewer.
"""
from __future__ import annotations

import statistics

from ... import bandwidth, claims, recorded
from ...timing import summarize
from . import analysis, power

NOISE_FLOOR = 0.02
MEMORY_TOL = 0.10
CLOCK_RATIO = 1.02
LINK_SHARE = 0.10


def noise(*sample_sets) -> float:
    """The larger relative spread (p90 - p10) / median of the sample sets, at least ``NOISE_FLOOR``."""
    return max([NOISE_FLOOR] + [summarize(s).spread for s in sample_sets if s])


def naive_verdicts(nd: dict) -> list[claims.Verdict]:
    """Part 1: one GPU vs the model split over two GPUs in one process (m = 1)."""
    speedup = nd["one_gpu_ms"] / nd["naive_ms"]
    n = noise(nd["one_gpu_samples_ms"], nd["naive_samples_ms"])
    out = [claims.compare("Naive model parallelism (m = 1) makes a training step faster than one GPU",
                          speedup, ">", round(1 + n, 3),
                          figure=f"one GPU back to back {nd['one_gpu_ms']:.1f} ms, split "
                                 f"{nd['naive_ms']:.1f} ms: {speedup:.3f}x; sample spread {n:.1%}")]
    if "one_gpu_rested_ms" in nd:
        n2 = noise(nd["one_gpu_rested_samples_ms"], nd["naive_samples_ms"])
        out.append(claims.within(
            "One GPU that rests between steps as long as a step lasts is as fast as the split "
            "(the split's gain is the rest, not the split)", nd["naive_ms"], nd["one_gpu_rested_ms"],
            round(n2, 3), figure=f"one GPU resting {nd['rest_ms']:.0f} ms before each step: "
                                 f"{nd['one_gpu_rested_ms']:.1f} ms; split {nd['naive_ms']:.1f} ms"))
    clocks = nd.get("gpu_clock") or {}
    if clocks.get("back to back") and clocks.get("rested"):
        a, b = clocks["back to back"], clocks["rested"]
        out.append(claims.at_least(
            "A GPU that rests between steps computes at a higher SM clock", b["clock_mhz"] / a["clock_mhz"],
            CLOCK_RATIO, figure=f"median SM clock while computing: back to back {a['clock_mhz']:.0f} MHz "
                                f"({a['power_w']:.0f} W), rested {b['clock_mhz']:.0f} MHz ({b['power_w']:.0f} W)"))
    return out


def _bubble_verdict(claim: str, rows: list[dict], key: str) -> claims.Verdict:
    ok = [abs(r["measured"] - r[key]) <= r["tolerance"] for r in rows]
    if all(ok):
        word = claims.TRUE
    elif ok[0]:
        last = next(i for i, good in enumerate(ok) if not good) - 1
        word = f"UP TO m={rows[last]['m']}"
    else:
        word = claims.FALSE
    figure = ", ".join(f"m={r['m']}: {r['measured']:.1%} vs {r[key]:.1%}" for r in rows)
    rule = ("TRUE if |measured - predicted| <= 2 pp (or the samples' p10-p90 range) at every m; "
            "'UP TO m=k' if only up to k")
    return claims.Verdict(claim, figure, rule, word)


def bubble_verdicts(B: dict) -> list[claims.Verdict]:
    """Part 3: the GPipe sweep over m -- bubble, step time, compute per step."""
    ms, P = B["config"]["ms"], B["world_size"]
    rows = analysis.bubble_breakdown(B)
    i8 = ms.index(8) if 8 in ms else len(ms) - 1
    s8 = B["step_ms"][0] / B["step_ms"][i8]
    busy = [b[0] for b in B["busy_ms_per_rank"]]
    out = [
        _bubble_verdict("GPipe's bubble is (p-1)/(m+p-1)", rows, "ideal"),
        _bubble_verdict("GPipe's bubble is the schedule run with each stage's measured times and the "
                        "measured transfers", rows, "with_sends"),
        claims.compare(f"GPipe at m = {ms[i8]} beats naive model parallelism (m = 1)", s8, ">",
                       round(1 + noise(B["step_samples_ms"][0], B["step_samples_ms"][i8]), 3),
                       figure=f"{B['step_ms'][0]:.1f} ms -> {B['step_ms'][i8]:.1f} ms per step: {s8:.2f}x "
                              f"(ideal p m/(m+p-1) = {P * ms[i8] / (ms[i8] + P - 1):.2f}x)"),
        claims.compare("Smaller micro-batches cost more compute per step", busy[-1] / busy[0], ">",
                       round(1 + noise(B["step_samples_ms"][0], B["step_samples_ms"][-1]), 3),
                       figure=f"stage 0 computes {busy[0]:.1f} ms per step at m = {ms[0]}, "
                              f"{busy[-1]:.1f} ms at m = {ms[-1]}"),
    ]
    return out


def traffic_verdicts(B: dict) -> list[claims.Verdict]:
    """Part 3: the messages between stages, against data parallelism's traffic and the step."""
    ms, P, cfg = B["config"]["ms"], B["world_size"], B["config"]
    act_bytes = 2 * cfg["rows"] * cfg["hidden"] * B["element_size"]
    params = sum(B["n_params_per_stage"])
    dp_bytes = 2 * (P - 1) / P * params * B["element_size"]
    p2p = B["p2p"]
    share = max(m * (p2p["fwd_ms"][i] + p2p["bwd_ms"][i]) / B["step_ms"][i] for i, m in enumerate(ms))
    return [
        claims.at_least("Source 002 §5.3: model parallelism passes only the necessary features, fewer bytes "
                        "than data parallelism's gradient all-reduce", dp_bytes / act_bytes, 1.0,
                        figure=f"{bandwidth.format_size(act_bytes)} per step and boundary vs "
                               f"{bandwidth.format_size(dp_bytes)} per GPU for data parallelism"),
        claims.at_most("Sending the activations costs little next to the compute", share, LINK_SHARE,
                       figure=f"at most {share:.1%} of the step, if no transfer overlapped compute"),
    ]


def memory_verdicts(B: dict) -> list[claims.Verdict]:
    """Part 4: peak memory per stage of GPipe and 1F1B, measured and predicted."""
    P, cfg, out = B["world_size"], B["config"], []
    mem, m_s = B["memory_bytes"], cfg["schedule_m"]
    g, f = mem.get(f"torch gpipe m={m_s}"), mem.get(f"torch 1f1b m={m_s}")
    if g and f and None not in g and None not in f:
        out.append(claims.every(f"1F1B needs less activation memory than GPipe, on every stage (m = {m_s}; 1F1B / "
                                "GPipe peak)", {f"stage {s}": f[s] / g[s] for s in range(P)}, "<", 1.0, unit="x"))
    pred = analysis.memory_prediction(B)
    if pred:
        measured = analysis.measured_memory(B)
        errs = {(k, s): measured[k][s] / pred[k][s] - 1 for k in measured for s in range(P)}
        (wk, ws), worst = max(errs.items(), key=lambda kv: abs(kv[1]))
        out.append(claims.compare(
            "Peak memory = micro-batches held x what one keeps + one micro-batch's backward (+ the outputs "
            "on the last stage)", max(abs(e) for e in errs.values()), "<=", MEMORY_TOL,
            figure=f"{len(errs)} schedule/stage peaks; furthest: {wk}, stage {ws}: measured "
                   f"{measured[wk][ws] / 2**30:.2f} GiB vs predicted {pred[wk][ws] / 2**30:.2f} GiB ({worst:+.1%})"))
    return out


def pipeline_verdicts(B: dict) -> list[claims.Verdict]:
    """Every verdict of the ``04_pipeline_bench`` recording (parts 3 and 4)."""
    return bubble_verdicts(B) + traffic_verdicts(B) + memory_verdicts(B)


POWER_CAP = "software power cap"
MOST = 0.5            # a reason "holds the clock" when NVML reports it in at least half of the readings
LIFTED = 0.25         # resting "lifts" a reason when it is reported in at least 25 points fewer readings


def _share(summary: dict | None, *words) -> float | None:
    share = (summary or {}).get("reason_share")
    if share is None:
        return None
    return max([0.0] + [share.get(w, 0.0) for w in words])


def _temp(summary: dict) -> str:
    t = summary.get("temperature_c")
    return "temperature unknown" if t is None else f"{t:.0f} C"


def _reasons(summary: dict) -> str:
    share = summary.get("reason_share") or {}
    return ", ".join(f"{w} {v:.0%}" for w, v in share.items()) or "none"


def boost_verdicts(bd: dict) -> list[claims.Verdict]:
    """One GPU, back to back vs rested, with NVML's clock-event reasons (``boost.measure_one_gpu``). The
    claim about power is decided by the reasons NVML reports, not by the power it reads."""
    speedup = bd["one_gpu_ms"] / bd["one_gpu_rested_ms"]
    n = noise(bd["one_gpu_samples_ms"], bd["one_gpu_rested_samples_ms"])
    out = [claims.compare("One GPU that rests between steps as long as a step lasts computes a step faster",
                          speedup, ">", round(1 + n, 3),
                          figure=f"back to back {bd['one_gpu_ms']:.1f} ms, resting {bd['rest_ms']:.0f} ms before "
                                 f"each step {bd['one_gpu_rested_ms']:.1f} ms: {speedup:.3f}x; sample spread {n:.1%}")]
    nv = bd.get("nvml") or {}
    a, b = nv.get("back to back"), nv.get("rested")
    if not (a and b):
        return out
    out.append(claims.at_least(
        "A GPU that rests between steps computes at a higher SM clock", b["clock_mhz"] / a["clock_mhz"], CLOCK_RATIO,
        figure=f"median SM clock while computing: back to back {a['clock_mhz']:.0f} MHz ({a['power_w']:.0f} W, "
               f"{_temp(a)}), rested {b['clock_mhz']:.0f} MHz ({b['power_w']:.0f} W, {_temp(b)})"))
    cap_a, cap_b = _share(a, POWER_CAP), _share(b, POWER_CAP)
    if cap_a is None or cap_b is None:
        return out
    limit = f", limit {bd['power_limit_w']:.0f} W" if bd.get("power_limit_w") else ""
    return out + [
        cap_holds(cap_a, f"power cap in {cap_a:.0%} of {a['samples']} readings{limit}; back-to-back reasons: "
                         f"{_reasons(a)}"),
        rest_lifts_cap(cap_a, cap_b, f"rested reasons: {_reasons(b)}")]


# One claim, one rule: these two are judged alike on the step study (04_boost_one_gpu) and on the timeline.

def cap_holds(share: float, figure: str) -> claims.Verdict:
    return claims.at_least("Back to back, the power limit holds the SM clock down (NVML reports the software "
                           "power cap)", share, MOST, figure=figure)


def rest_lifts_cap(share_back_to_back: float, share_rested: float, figure: str) -> claims.Verdict:
    return claims.at_least("Resting between steps lifts the power cap", share_back_to_back - share_rested, LIFTED,
                           figure=f"power cap in {share_back_to_back:.0%} of the readings back to back, "
                                  f"{share_rested:.0%} rested; {figure}")



def power_timeline_verdicts(td: dict) -> list[claims.Verdict]:
    """The timeline (``boost.power_timeline``): from a rested GPU, steps back to back, then rested steps. The
    reasons decide; the power reading (an average that lags) only shows how late it would have told."""
    samples = td["samples"]
    b2b = power.readings(samples, "back to back")
    rested = power.readings(samples, "rested steps")
    cap_a, cap_b = power.share(b2b, POWER_CAP), power.share(rested, POWER_CAP)
    if not b2b or cap_a is None or cap_b is None:
        return []
    onset = power.onset_s(samples, "back to back", POWER_CAP)
    ramp = power.power_ramp(samples, "back to back")
    limit = f", limit {td['power_limit_w']:.0f} W" if td.get("power_limit_w") else ""
    when = f"from {onset:.2f} s on" if onset is not None else "never"
    first = [r for r in b2b if r["t_s"] <= b2b[0]["t_s"] + td["pause_ms"] / 1e3]
    last = [r for r in b2b if r["t_s"] >= b2b[-1]["t_s"] - 1.0]
    clock_first = statistics.median(r["clock_mhz"] for r in first)
    clock_last = statistics.median(r["clock_mhz"] for r in last)
    out = [
        claims.at_least("A GPU that has rested computes its first step at a higher SM clock than it keeps back to "
                        "back", clock_first / clock_last, CLOCK_RATIO,
                        figure=f"median SM clock during the first step {clock_first:.0f} MHz, over the last second "
                               f"of {td['run_s']:.0f} s back to back {clock_last:.0f} MHz"),
        cap_holds(cap_a, f"power cap {when}, in {cap_a:.0%} of {len(b2b)} readings over {td['run_s']:.0f} s back "
                         f"to back{limit}"),
    ]
    if onset is not None:
        at_onset = power.at(samples, "back to back", onset)["power_w"]
        out.append(claims.compare(
            "When the power cap comes on, NVML's power reading has not reached its level yet (it is an average "
            "that lags)", at_onset / ramp["final_w"], "<", power.RAMP,
            figure=f"power reading {at_onset:.0f} W at the cap's onset ({onset:.2f} s), final {ramp['final_w']:.0f} W, "
                   f"{power.RAMP:.0%} of it reached at {ramp['ramp_s']:.2f} s"))
    out.append(rest_lifts_cap(cap_a, cap_b, f"each rested step after a {td['pause_ms']:.0f} ms pause"))
    return out


# Measurements shown with recorded.live_or_none: judged in CLAIMS once a GPU run has recorded them.
AWAITING_RECORDING = {"04_power_timeline": power_timeline_verdicts}


CLAIMS = {"04_naive_one_process": naive_verdicts, "04_pipeline_bench": pipeline_verdicts,
          "04_boost_one_gpu": boost_verdicts}
CLAIMS.update(recorded.awaiting(AWAITING_RECORDING))
