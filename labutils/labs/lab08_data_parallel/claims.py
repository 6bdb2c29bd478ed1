"""Lab 08's verdicts, from the recordings ``08_build_ddp`` (``build_measure``), ``08_ddp``, ``08_zero`` and
``08_fsdp`` (see ``measure``).

``CLAIMS`` maps each recording to the function that judges it; the notebook prints exactly these
lines and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/``. The overlap of DDP's
all-reduce is judged on the kernel timeline (``overlap``), which exists on GPUs only: from CPU ranks
those verdicts say NOT MEASURED.
"""
from __future__ import annotations

from labutils import claims, recorded

from . import overlap
from .memory import formula

GIB = 2**30
NOT_MEASURED = "NOT MEASURED"

# Thresholds (the notebook's markdown says why each is where it is).
SPEEDUP_MIN = 1.85        # DDP throughput on 2 GPUs >= 1.85x one GPU's
OVERLAP_MIN = 0.70        # at the best configuration, >= 70% of the NCCL kernel time runs beside compute
EXPOSED_MAX = 0.30        # what communicating costs the step, as a share of the all-reduces alone
ACCOUNTED_TOL = 0.30      # stretch + tail = the traced step's excess over no_sync, within 30%
TAIL_MAX = 0.10           # the wait before the optimizer, as a share of the all-reduces alone
WRAPPER_OVERHEAD_MAX = 0.02    # DDP's hooks without communication: within 2% of the plain step
BUCKET_VIEW_TOL = 0.10    # the memory gradient_as_bucket_view saves: 4 bytes per parameter, within 10%
HIDDEN_MIN, ONE_BUCKET_HIDDEN_MAX = 0.70, 0.25  # the judgement of recordings without a timeline
COMM_SHARE_SMALL = 0.10   # "a small part of the step": the all-reduce alone <= 10% of the best step

# 08_build_ddp (the learner's naive, overlapped and bucketed steps on a communication-heavy workload)
COMM_FRACTION_MIN = 0.20  # precondition: the all-reduces alone >= 20% of a step without overlap
HIDDEN_SHARE_MIN = 0.50   # overlap hides at least half of what the naive step exposes
DDP_PARITY_MAX = 1.10     # your bucketed step within 10% of DDP's with the same cap
NOT_JUDGED = "NOT JUDGED"


def _not_measured(claim: str, rule: str) -> claims.Verdict:
    return claims.Verdict(claim, "no kernel timeline: it is traced on GPUs only", rule, NOT_MEASURED)


def _timeline_verdicts(best: dict, one: dict) -> list[claims.Verdict]:
    """The verdicts read from the kernel timeline (NOT MEASURED where the ranks ran on CPUs)."""
    where = f"{overlap.label(best)}"
    texts = [
        (f"At the best configuration, backward hides >= {OVERLAP_MIN:.0%} of the gradient all-reduce: that share "
         "of the NCCL kernels' time has a compute kernel running beside it", f"TRUE if >= {OVERLAP_MIN:g}"),
        ("The compute kernels' stretch plus the tail before the optimizer account for the traced step's excess "
         "over no_sync", f"TRUE if within {ACCOUNTED_TOL:.0%}"),
        (f"The tail (compute stopped, waiting for the last all-reduce) is <= {TAIL_MAX:.0%} of the all-reduces "
         "alone", f"TRUE if <= {TAIL_MAX:g}"),
    ]
    if not (overlap.has_timeline(best) and overlap.has_timeline(one)):
        return [_not_measured(claim, rule) for claim, rule in texts]
    accounted = best["stretch_ms"] + best["tail_ms"]
    share = one["comm_ms"] / best["step_ms"]
    return [
        claims.at_least(texts[0][0], best["overlap_fraction"], OVERLAP_MIN,
                        figure=f"{best['overlap_fraction']:.0%} of the NCCL kernels' time beside compute ({where}), "
                               f"on a step whose whole all-reduce alone is {share:.1%} of it"),
        claims.within(texts[1][0], accounted, best["excess_ms"], ACCOUNTED_TOL,
                      figure=f"stretch {best['stretch_ms']:.2f} ms + tail {best['tail_ms']:.2f} ms vs traced excess "
                             f"{best['excess_ms']:.2f} ms (timed: {best['exposed_ms']:.2f} ms; {where})"),
        claims.at_most(texts[2][0], best["tail_ms"] / best["comm_ms"], TAIL_MAX,
                       figure=f"{best['tail_ms']:.2f} ms of {best['comm_ms']:.2f} ms ({where})"),
    ]


def comm_share_verdict(data: dict) -> claims.Verdict:
    """What overlap can buy this workload at most: the whole gradient all-reduce alone (one bucket), as a
    share of the best step; beside it, what one bucket -- no overlap at all -- cost over the best step."""
    best, one = overlap.best(data), overlap.one_bucket(data)
    share = one["comm_ms"] / best["step_ms"]
    return claims.at_most(
        f"On this workload the gradients' all-reduce is a small part of the step (<= {COMM_SHARE_SMALL:.0%}), so "
        "overlapping it can save little here", share, COMM_SHARE_SMALL,
        figure=f"the all-reduce alone (one bucket) {one['comm_ms']:.2f} ms = {share:.1%} of the best step "
               f"{best['step_ms']:.1f} ms; one bucket, no overlap: {one['step_ms']:.1f} ms "
               f"({one['step_ms'] / best['step_ms'] - 1:+.1%})")


def _speedup_verdict(data: dict, best: dict) -> claims.Verdict:
    n, plain, s = data["world_size"], data["compute_ms"], overlap.speedup(data)
    return claims.at_least(f"DDP on {n} GPUs trains a compute-bound transformer at >= {SPEEDUP_MIN}x one GPU's "
                           "throughput", s, SPEEDUP_MIN,
                           figure=f"{s:.2f}x = {n} x {plain:.1f} ms (one GPU) / {best['step_ms']:.1f} ms "
                                  f"(DDP, {overlap.label(best)})")


def _wrapper_verdict(data: dict, best: dict) -> claims.Verdict:
    extra = best["no_sync_ms"] / data["compute_ms"] - 1
    return claims.at_most(f"DDP's wrapper alone (no_sync: hooks, no all-reduce) costs <= {WRAPPER_OVERHEAD_MAX:.0%} "
                          "over the plain model's step", extra, WRAPPER_OVERHEAD_MAX,
                          figure=f"{extra:+.1%}: no_sync {best['no_sync_ms']:.1f} ms vs plain "
                                 f"{data['compute_ms']:.1f} ms ({overlap.label(best)})")


def ddp_verdicts(data: dict) -> list[claims.Verdict]:
    """Verdicts on ``08_ddp`` (a recording without the paired difference and the timeline gets the
    verdicts it was printed with)."""
    if not overlap.measures_exposed(data):
        return _no_timeline_verdicts(data)
    best, one = overlap.best(data), overlap.one_bucket(data)
    cost = best["exposed_ms"] / best["comm_ms"]
    tl = _timeline_verdicts(best, one)
    out = [
        _speedup_verdict(data, best),
        tl[0],
        claims.at_most(f"At the best configuration, communicating costs the step <= {EXPOSED_MAX:.0%} of the "
                       "all-reduces' own time (step - no_sync, paired samples)", cost, EXPOSED_MAX,
                       figure=f"{best['exposed_ms']:.2f} ms of {best['comm_ms']:.2f} ms = {cost:.0%} "
                              f"({overlap.label(best)})"),
        *tl[1:],
        comm_share_verdict(data),
        _wrapper_verdict(data, best),
    ]
    return out + [_bucket_view_verdict(data)]


def cta_comparison(data: dict) -> str | None:
    """Fewer CTAs against NCCL's default at the CTA sweep's cap, as a line of text (None where no CTA sweep
    ran): the prediction's answer, shown without a verdict."""
    sweep = overlap.cta_sweep(data)
    if len(sweep) < 2 or sweep[0].get("ctas") is not None:
        return None
    default, few = sweep[0], min(sweep[1:], key=lambda r: r["step_ms"])
    gain = (default["step_ms"] - few["step_ms"]) / default["step_ms"]
    return (f"{overlap.ctas_label(few['ctas'])} vs NCCL's default at a {default['bucket_cap_mb']:g} MB cap: step "
            f"{few['step_ms']:.1f} vs {default['step_ms']:.1f} ms ({-gain:+.1%}), exposed "
            f"{_exposed(few):.2f} vs {_exposed(default):.2f} ms")


def _exposed(row: dict) -> float:
    """The paired exposed time where the recording has it, else step - no_sync."""
    return row["exposed_ms"] if row.get("exposed_ms") is not None else row["step_ms"] - row["no_sync_ms"]


def _bucket_view_verdict(data: dict) -> claims.Verdict:
    mem = data["memory"]
    saved = mem["no_view"]["state_bytes"] - mem["view"]["state_bytes"]
    grads = 4 * data["n_params"]
    return claims.within("gradient_as_bucket_view=True saves one copy of the gradients (4 bytes per parameter)",
                         saved, grads, BUCKET_VIEW_TOL, figure=f"{saved / GIB:.2f} GiB saved; 4Ψ = {grads / GIB:.2f} GiB")


def _no_timeline_verdicts(data: dict) -> list[claims.Verdict]:
    """The verdicts of a recording made before the paired difference and the kernel timeline, as they
    were printed: hidden share = (no_sync + all-reduces alone - step) / all-reduces alone."""
    best, one = overlap.best(data), overlap.one_bucket(data)
    h_best, h_one = overlap.hidden(data, best), overlap.hidden(data, one)
    out = [
        _speedup_verdict(data, best),
        claims.at_least(f"At the best configuration (bucket cap x NCCL CTAs), backward hides >= {HIDDEN_MIN:.0%} "
                        "of the gradient all-reduce", h_best, HIDDEN_MIN,
                        figure=f"{h_best:.0%} of {best['comm_ms']:.1f} ms hidden ({overlap.label(best)}: step "
                               f"{best['step_ms']:.1f} ms, no_sync {best['no_sync_ms']:.1f} ms)"),
        claims.at_most("With a cap above the model's size the all-reduce waits for the whole backward: little is hidden",
                       h_one, ONE_BUCKET_HIDDEN_MAX,
                       figure=f"{h_one:.0%} of {one['comm_ms']:.1f} ms hidden ({overlap.label(one)}, "
                              f"all-reduce calls: {one['n_buckets']})"),
        _wrapper_verdict(data, best),
    ]
    return out + [_bucket_view_verdict(data)]


def zero_verdicts(data: dict) -> list[claims.Verdict]:
    out = []
    for row in data["rows"]:
        out.append(claims.within(
            f"{row['scheme']}: peak memory per rank = {formula(row['scheme'])} (fp32 Adam, ZeRO paper's counting)",
            row["peak_bytes"], row["predicted_bytes"], 0.10,
            figure=f"measured {row['peak_bytes'] / GIB:.2f} GiB, predicted {row['predicted_bytes'] / GIB:.2f} GiB"))
    worst = max(abs(r["volume_psi"] / 2.0 - 1) for r in data["rows"])
    out.append(claims.at_most(
        "DDP by hand, ZeRO-1 and ZeRO-2 all communicate 2Ψ per step", worst, 0.02,
        figure=", ".join(f"{r['scheme']} {r['volume_psi']:.3f}Ψ" for r in data["rows"]) + f" (worst off by {worst:.1%})"))
    return out


def fsdp_rows(data: dict) -> dict:
    return {r["name"]: r for r in data["rows"]}


def fsdp_verdicts(data: dict) -> list[claims.Verdict]:
    rows = fsdp_rows(data)
    ddp, f = rows["DDP"], rows["FSDP2"]
    keep = rows["FSDP2, reshard_after_forward=False"]
    pre_name = next(k for k in rows if "prefetch" in k)
    pre = rows[pre_name]
    ratio = f["state_bytes"] / ddp["state_bytes"]
    return [
        claims.at_most("FSDP2 holds <= 0.55x DDP's per-GPU memory for weights + gradients + Adam state", ratio, 0.55,
                       figure=f"{ratio:.2f}x: {f['state_bytes'] / GIB:.2f} GiB vs {ddp['state_bytes'] / GIB:.2f} GiB "
                              f"on each of {data['world_size']} GPUs"),
        claims.within("FSDP2 (ZeRO-3) communicates 3Ψ per step", f["volume_psi"], 3.0, 0.02,
                      figure=f"{f['volume_psi']:.3f}Ψ"),
        claims.within("reshard_after_forward=False skips the backward all-gathers: 2Ψ per step",
                      keep["volume_psi"], 2.0, 0.02, figure=f"{keep['volume_psi']:.3f}Ψ"),
        claims.compare("reshard_after_forward=False raises the peak memory (full weights kept for backward)",
                       keep["peak_bytes"] / f["peak_bytes"], ">", 1.0,
                       figure=f"peak {keep['peak_bytes'] / GIB:.2f} GiB vs {f['peak_bytes'] / GIB:.2f} GiB"),
        claims.at_least(f"{pre_name} makes the step >= 2% faster than FSDP2's default", f["step_ms"] / pre["step_ms"],
                        1.02, figure=f"{pre['step_ms']:.1f} ms vs {f['step_ms']:.1f} ms"),
    ]


STATE_TOL = 0.05          # model states = 16 bytes per parameter within 5%: the rest is KiB of step counters
STATES_MOST = 0.5         # "most of the peak": the model states at least half of the step's peak memory


def plain_verdicts(data: dict) -> list[claims.Verdict]:
    """The plain model on one GPU (``one_gpu.plain_step``): what it holds against the ZeRO paper's 16Ψ."""
    psi, state, peak, pred = data["n_params"], data["state_bytes"], data["peak_bytes"], data["predicted_state_bytes"]
    if not (state and peak):
        return [claims.Verdict("Between steps, plain AdamW training holds 16 bytes per parameter",
                               "no allocator statistics: measured on GPUs only", "TRUE if within 5%",
                               NOT_MEASURED)]
    return [
        claims.within(f"Between steps, plain AdamW training holds the model states the ZeRO paper counts: "
                      f"{formula('DDP')} = 16Ψ bytes", state, pred, STATE_TOL,
                      figure=f"{state / GIB:.2f} GiB held, 16Ψ = {pred / GIB:.2f} GiB (Ψ = {psi / 1e6:.0f} M); "
                             f"weights alone {data['weights_bytes'] / psi:.2f} bytes per parameter"),
        claims.at_least("The model states (what ZeRO shards) are most of the plain step's peak memory",
                        state / peak, STATES_MOST,
                        figure=f"model states {state / GIB:.2f} GiB of a {peak / GIB:.2f} GiB peak "
                               f"({state / peak:.0%}); activations and temporaries {(peak - state) / GIB:.2f} GiB "
                               f"({data['config']['batch_per_rank']} x {data['config']['seq']} tokens)"),
    ]


def build_rows(data: dict) -> dict:
    return {r["name"]: r for r in data["rows"]}


def build_verdicts(data: dict) -> list[claims.Verdict]:
    """Verdicts on ``08_build_ddp``: the precondition (communication is a large part of the step), then
    what overlap hid -- judged only where the precondition holds and the design is the learner's."""
    rows, frac = build_rows(data), data["comm_fraction"]
    naive = rows["naive"]
    out = [claims.at_least(
        f"On this workload the gradients' all-reduce is >= {COMM_FRACTION_MIN:.0%} of a step without overlap",
        frac, COMM_FRACTION_MIN,
        figure=f"{frac:.0%}: the all-reduces alone {data['comm_ms']:.2f} ms, the no_sync step "
               f"{rows['no_sync']['step_ms']:.2f} ms ({data['n_params'] / 1e6:.0f} M parameters, "
               f"{data['gradient_bytes'] / 2**20:.0f} MiB of gradients)")]
    for design, what in (("overlapped", "(b) one all-reduce per parameter, started from its hook"),
                         ("bucketed", "(c) one all-reduce per bucket, started when the bucket is full")):
        claim = (f"Overlapping the all-reduce with backward hides >= {HIDDEN_SHARE_MIN:.0%} of what the naive step "
                 f"exposes: {what}")
        rule = f"TRUE if <= {1 - HIDDEN_SHARE_MIN:g} of the naive step's exposed time"
        r = rows[design]
        if data["standins"].get(design) or data["standins"].get("naive"):
            out.append(claims.Verdict(claim, "measured with a checker's stand-in, not your code", rule, NOT_JUDGED))
        elif frac < COMM_FRACTION_MIN or naive["exposed_ms"] <= 0:
            out.append(claims.Verdict(claim, f"precondition not met: the all-reduce is {frac:.0%} of the step "
                                             f"(naive exposes {naive['exposed_ms']:.2f} ms)", rule, NOT_JUDGED))
        else:
            out.append(claims.at_most(claim, r["exposed_ms"] / naive["exposed_ms"], 1 - HIDDEN_SHARE_MIN,
                                      figure=f"exposed {r['exposed_ms']:.2f} ms vs naive {naive['exposed_ms']:.2f} ms "
                                             f"(step {r['step_ms']:.2f} vs {naive['step_ms']:.2f} ms; "
                                             f"{r['all_reduces']} vs {naive['all_reduces']} all-reduces)"))
    b, d = rows["bucketed"], rows["DDP"]
    claim = f"Your bucketed step is as fast as DDP's with the same bucket cap (within {DDP_PARITY_MAX - 1:.0%})"
    if data["standins"].get("bucketed"):
        out.append(claims.Verdict(claim, "measured with a checker's stand-in, not your code",
                                  f"TRUE if <= {DDP_PARITY_MAX:g}", NOT_JUDGED))
    else:
        out.append(claims.at_most(claim, b["step_ms"] / d["step_ms"], DDP_PARITY_MAX,
                                  figure=f"{b['step_ms']:.2f} ms vs DDP {d['step_ms']:.2f} ms "
                                         f"({data['config']['bucket_cap_mb']:g} MB cap; {b['all_reduces']} vs "
                                         f"{d['all_reduces']} all-reduces)"))
    return out


# Measurements shown with recorded.live_or_none: judged where they run live, and in CLAIMS -- whose every name
# tests/test_claims.py re-derives from notebooks/recorded/ -- once a 2-GPU run has recorded them.
AWAITING_RECORDING = {"08_build_ddp": build_verdicts}

CLAIMS = {"08_ddp": ddp_verdicts, "08_zero": zero_verdicts, "08_fsdp": fsdp_verdicts,
          "08_plain_one_gpu": plain_verdicts}
CLAIMS.update(recorded.awaiting(AWAITING_RECORDING))
