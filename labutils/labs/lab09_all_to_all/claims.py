"""Lab 09's verdicts, each from a recording through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps recording names to functions of their ``data`` dicts; the notebook prints their lines
and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/09_*.json``.
"""
from __future__ import annotations

import math

from ... import bandwidth, claims
from ...bandwidth import format_size


def a2a_fit(data: dict) -> bandwidth.AlphaBeta:
    """Alpha-beta fit of the ``all_to_all_single`` sweep (``t`` against nccl-tests' S)."""
    op = data["ops"]["all_to_all_single"]
    return bandwidth.fit_alpha_beta(data["size_bytes"], op["time_ms"])


def a2a_verdicts(data: dict) -> list[claims.Verdict]:
    a2a, ag = data["ops"]["all_to_all_single"], data["ops"]["all_gather_into_tensor"]
    big = format_size(data["size_bytes"][-1])
    fit = a2a_fit(data)
    out = [
        claims.within("all_to_all_single reaches all_gather's busbw on large messages (same bytes per link)",
                      a2a["busbw_gbps"][-1], ag["busbw_gbps"][-1], 0.15,
                      figure=f"busbw at {big}: all_to_all {a2a['busbw_gbps'][-1]:.0f} GB/s, "
                             f"all_gather {ag['busbw_gbps'][-1]:.0f} GB/s"),
        claims.at_most("t = alpha + S / beta describes all_to_all_single from the smallest to the largest size",
                       fit.max_rel_err, 0.35,
                       figure=f"{fit}; largest deviation {fit.max_rel_err:.0%} over "
                              f"{len(data['size_bytes'])} sizes"),
        claims.compare("every all_to_all_single and all_gather result was right", data["wrong"], "<=", 0,
                       figure=f"{data['wrong']} wrong results"),
    ]
    return out


def skew_dispatch_predicted_ms(a2a: dict, skew: dict) -> list[float]:
    """Dispatch time per router bias predicted from the uniform router's measured time and section 1's
    fit: every extra byte on the busiest link costs ``n / (n - 1) / beta`` (the fit's S counts the rank's
    whole send buffer, of which (n - 1)/n leaves it)."""
    fit, n = a2a_fit(a2a), skew["world_size"]
    base_ms, base_bytes = skew["dispatch_ms"][0], skew["busiest_bytes"][0]
    return [base_ms + (b - base_bytes) * n / (n - 1) / (fit.beta_gbps * 1e9) * 1e3 for b in skew["busiest_bytes"]]


NOT_RESOLVED = "NOT RESOLVED"
RISE_RESOLVED_SPREADS = 2.0  # a predicted rise is judged only when it is at least this many p10-p90 spreads
RISE_TOLERANCE = 0.25        # the measured rise may differ from the predicted by this, or by the spread if larger


def rise_verdict(claim: str, measured_ms: float, predicted_ms: float, spread_ms: float | None, *,
                 figure: str) -> claims.Verdict:
    """Judge a predicted rise (a difference of two times) against the measured one, only where the noise
    cannot fake the answer.

    The measured rise is a difference of two medians; each one can sit anywhere in its samples' p10-p90
    range, so noise alone can move the difference by up to about ``spread_ms``, the larger of the two
    ranges. Below ``RISE_RESOLVED_SPREADS`` spreads the rise is NOT RESOLVED: a rise of zero could not be
    told from it. Above, TRUE if the measured rise is within ``max(RISE_TOLERANCE, spread / predicted)``
    (at most half the predicted rise) of it: a dispatch that did not slow down is off by 100% and fails.
    """
    rule = (f"{NOT_RESOLVED} if the predicted rise < {RISE_RESOLVED_SPREADS:g} x the p10-p90 spread of the "
            f"samples; else TRUE if the measured rise is within max({RISE_TOLERANCE:.0%}, spread / predicted)")
    for v in (measured_ms, predicted_ms, 0.0 if spread_ms is None else spread_ms):
        if not math.isfinite(v):
            raise ValueError(f"cannot judge {claim!r} from a non-finite time {v!r}. "
                             "HINT: the measurement behind it failed; look at the cell that made it.")
    if spread_ms is None or predicted_ms <= 0 or predicted_ms < RISE_RESOLVED_SPREADS * spread_ms:
        return claims.Verdict(claim, figure, rule, NOT_RESOLVED)
    tol = max(RISE_TOLERANCE, spread_ms / predicted_ms)
    err = abs(measured_ms / predicted_ms - 1.0)
    shown_err, shown_tol = claims.percents(err, tol)  # as many decimals as keep them on the verdict's side
    return claims.Verdict(claim, figure, f"{rule} (off by {shown_err}, allowed {shown_tol})",
                          claims.TRUE if err <= tol else claims.FALSE)


def _skew_spread_ms(s: dict) -> float | None:
    """The larger p10-p90 range of the dispatch samples, uniform router and most skewed; None when the
    recording has no p10/p90 (made before they were recorded)."""
    if "dispatch_p10_ms" not in s:
        return None
    return max(s["dispatch_p90_ms"][i] - s["dispatch_p10_ms"][i] for i in (0, -1))


def moe_verdicts(a2a: dict, data: dict) -> list[claims.Verdict]:
    d, s = data["dispatch"], data["skew"]
    small, large = d["dispatch_ms"][0] / d["rows_only_ms"][0], d["dispatch_ms"][-1] / d["rows_only_ms"][-1]
    predicted = skew_dispatch_predicted_ms(a2a, s)
    rise, predicted_rise = s["dispatch_ms"][-1] - s["dispatch_ms"][0], predicted[-1] - predicted[0]
    spread = _skew_spread_ms(s)
    rows_ratio = s["max_expert_rows"][-1] / s["max_expert_rows"][0]
    layer_ratio = s["layer_ms"][-1] / s["layer_ms"][0]
    share = f"expert 0's share {s['hot_share'][0]:.0%} -> {s['hot_share'][-1]:.0%}"
    noise = "p10-p90 spread not recorded" if spread is None else f"p10-p90 spread {spread * 1e3:.0f} us"
    return [
        claims.at_least("on a small dispatch the bookkeeping (sort, counts exchanged and waited for, permutation) "
                        "costs more than moving the rows", small, 2.0,
                        figure=f"dispatch / rows-only all_to_all = {small:.2f}x at {d['tokens'][0]} tokens per rank"),
        claims.at_most("on a large dispatch moving the rows is most of the time", large, 2.0,
                       figure=f"dispatch / rows-only all_to_all = {large:.2f}x at {d['tokens'][-1]} tokens per rank"),
        rise_verdict("a skewed router slows the dispatch by what section 1's alpha-beta fit predicts for the "
                     "busiest link's extra bytes", rise, predicted_rise, spread,
                     figure=f"{share} at {s['tokens']} tokens per rank: dispatch rise {rise * 1e3:.0f} us, "
                            f"predicted {predicted_rise * 1e3:.0f} us (uniform {s['dispatch_ms'][0]:.3f} ms; "
                            f"{noise})"),
        claims.within("a skewed router slows the MoE layer as much as the busiest expert's rows grow",
                      layer_ratio, rows_ratio, 0.25,
                      figure=f"{share}: layer {layer_ratio:.2f}x slower, busiest expert {rows_ratio:.2f}x the rows"),
    ]


def _mib(b: float) -> str:
    return f"{b / 2**20:.0f} MiB"


def sp_verdicts(data: dict) -> list[claims.Verdict]:
    """``09_sp_block``: the activation memory of TP and SP at one layer size (their time is judged at every
    size measured, by ``sp_time_verdicts``)."""
    tp, sp = data["memory"]["TP"], data["memory"]["SP"]
    out = [claims.compare("sequence parallelism keeps less activation memory than tensor parallelism",
                          sp["held_bytes"] / tp["held_bytes"], "<", 1.0,
                          figure=f"held after forward: SP {_mib(sp['held_bytes'])}, TP {_mib(tp['held_bytes'])} "
                                 f"(predicted {sp['predicted_held_bytes'] / tp['predicted_held_bytes']:.2f}x)")]
    for name, m in (("TP", tp), ("SP", sp)):
        out.append(claims.within(f"{name}: the memory a forward keeps follows from the shapes",
                                 m["held_bytes"], m["predicted_held_bytes"], 0.05,
                                 figure=f"measured {_mib(m['held_bytes'])}, "
                                        f"predicted {_mib(m['predicted_held_bytes'])}"))
    return out


SP_TIME_CLAIM = "sequence parallelism costs no more time than tensor parallelism"
SP_TIME_LIMIT = 1.05   # SP / TP, forward + backward: "no more" allows the run-to-run spread of a step


def sp_time_points(runs: dict) -> dict[str, float]:
    """SP / TP forward + backward time at every token count of every run: ``{what: data}`` ->
    ``{"512 tokens (what)": ratio, ...}``."""
    return {f"{t} tokens ({what})": sp / tp for what, data in runs.items()
            for t, tp, sp in zip(data["tokens"], data["time_ms"]["TP"], data["time_ms"]["SP"])}


def sp_time_verdicts(block: dict, dtensor: dict) -> list[claims.Verdict]:
    """``("09_sp_block", "09_dtensor")``: SP against TP on every layer size the lab timed both at -- the
    SP block's run and the DTensor sweep's hand-written columns -- by one rule: TRUE only if SP takes at
    most ``SP_TIME_LIMIT`` x TP's time at each of them."""
    points = sp_time_points({"SP block run": block, "DTensor sweep": dtensor})
    return [claims.every(SP_TIME_CLAIM, points, "<=", SP_TIME_LIMIT, unit="x")]


def dtensor_verdicts(data: dict) -> list[claims.Verdict]:
    t, tokens = data["time_ms"], data["tokens"]
    out = []
    for kind in ("TP", "SP"):
        large, small = t[f"DTensor {kind}"][-1] / t[kind][-1], t[f"DTensor {kind}"][0] / t[kind][0]
        out.append(claims.at_most(f"DTensor {kind} is as fast as the hand-written {kind} on a large layer",
                                  large, 1.1, figure=f"DTensor / hand-written = {large:.2f}x at {tokens[-1]} tokens"))
        out.append(claims.at_least(f"DTensor {kind} adds a visible overhead on a small layer", small, 1.1,
                                   figure=f"DTensor / hand-written = {small:.2f}x at {tokens[0]} tokens"))
    m = data["memory"]
    out.append(claims.within("DTensor SP keeps the same activation memory as the hand-written SP",
                             m["DTensor SP"]["held_bytes"], m["SP"]["held_bytes"], 0.10,
                             figure=f"held after forward: DTensor {_mib(m['DTensor SP']['held_bytes'])}, "
                                    f"hand-written {_mib(m['SP']['held_bytes'])}"))
    return out


CLAIMS = {"09_a2a_sweep": a2a_verdicts, ("09_a2a_sweep", "09_moe"): moe_verdicts, "09_sp_block": sp_verdicts,
          "09_dtensor": dtensor_verdicts}


def dtensor_one_rank_verdicts(data: dict) -> list[claims.Verdict]:
    """``09_dtensor_one_rank``: DTensor against the hand-written layers on a one-rank mesh (nothing on the wire)."""
    t, tokens, out = data["time_ms"], data["tokens"], []
    for kind in ("TP", "SP"):
        small, large = t[f"DTensor {kind}"][0] / t[kind][0], t[f"DTensor {kind}"][-1] / t[kind][-1]
        extra_ms = t[f"DTensor {kind}"][0] - t[kind][0]
        out.append(claims.at_least(f"on a one-rank mesh, where nothing crosses a link, DTensor {kind} still adds a "
                                   "visible overhead on a small layer", small, 1.1,
                                   figure=f"DTensor / hand-written = {small:.2f}x at {tokens[0]} tokens "
                                          f"({extra_ms:+.3f} ms a step)"))
        out.append(claims.at_most(f"on a one-rank mesh, DTensor {kind} is as fast as the hand-written {kind} on a "
                                  "large layer", large, 1.1,
                                  figure=f"DTensor / hand-written = {large:.2f}x at {tokens[-1]} tokens"))
    return out


CLAIMS["09_dtensor_one_rank"] = dtensor_one_rank_verdicts
CLAIMS[("09_sp_block", "09_dtensor")] = sp_time_verdicts


def dtensor_cpu_floor_verdicts(many: dict, one: dict) -> list[claims.Verdict]:
    """``("09_dtensor", "09_dtensor_one_rank")``: DTensor SP's step on one rank at the smallest layer (paced by
    its CPU work: nothing crosses a link, and little runs on the GPU) against the hand-written SP's step on
    several ranks at the largest layer."""
    floor, step = one["time_ms"]["DTensor SP"][0], many["time_ms"]["SP"][-1]
    return [claims.at_least(f"DTensor SP's CPU work alone outlasts the hand-written SP's step on {many['world_size']} "
                            f"GPUs at the largest layer, so DTensor SP is paced by the CPU there", floor / step, 1.0,
                            figure=f"one rank, {one['tokens'][0]} tokens: DTensor SP {floor:.2f} ms; "
                                   f"{many['world_size']} ranks, {many['tokens'][-1]} tokens: hand-written SP "
                                   f"{step:.2f} ms ({floor / step:.2f}x)")]


CLAIMS[("09_dtensor", "09_dtensor_one_rank")] = dtensor_cpu_floor_verdicts
