"""Lab 02's verdicts, each from a recording through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps recording names (or a tuple of them) to functions of their ``data`` dicts; the notebook
prints their lines and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/02_*.json``.
Verdicts that need a field older recordings lack (the link paths, the per-call kernel times) are
left out for such a recording rather than guessed.
"""
from __future__ import annotations

import dataclasses

from ... import bandwidth, claims
from ...bandwidth import format_size
from . import cost_model


def _holds(claim: str, ok: bool, *, figure: str, rule: str) -> claims.Verdict:
    return claims.Verdict(claim, figure, rule, claims.TRUE if ok else claims.FALSE)


def source_verdicts(data: dict) -> list[claims.Verdict]:
    """The source's program, run as written on 2 GPUs (``script.run_program``)."""
    if data["raised"]:
        what = f"{data['exc_type']}: {data['message']}" if data.get("exc_type") else "no exception line"
        if data.get("timed_out"):
            what = f"still running after {data['seconds']:.0f} s, killed"
        figure = what if data.get("timed_out") else f"exit code {data.get('returncode', 'not 0')}; {what}"
    else:
        figure = "exit code 0"
    return [_holds("the source's §1.1 program runs as written", not data["raised"], figure=figure,
                   rule="TRUE if it exits with code 0")]


def collectives_verdicts(data: dict) -> list[claims.Verdict]:
    """The sweep (section 2) and, in recordings that have them, the link paths at the largest size."""
    return sweep_verdicts(data) + (paths_verdicts(data["paths"]) if data.get("paths") else [])


def sweep_verdicts(data: dict) -> list[claims.Verdict]:
    """Section 2's sweep of the four collectives."""
    ops = data["ops"]
    ag, ar, lst = ops["all_gather_into_tensor"], ops["all_reduce"], ops["all_gather"]
    small, big = format_size(ag["size_bytes"][0]), format_size(ag["size_bytes"][-1])
    out = [
        claims.at_most("many small parts make transfers slow: a small call reaches a tiny share of the "
                       "busbw of a large one", ag["busbw_gbps"][0] / ag["busbw_gbps"][-1], 0.1,
                       figure=f"all_gather_into_tensor busbw {ag['busbw_gbps'][0]:.2f} GB/s at {small}, "
                              f"{ag['busbw_gbps'][-1]:.0f} GB/s at {big}"),
        claims.within("all-reduce and all-gather reach about the same busbw on large messages",
                      ar["busbw_gbps"][-1], ag["busbw_gbps"][-1], 0.10,
                      figure=f"busbw at {big}: all_reduce {ar['busbw_gbps'][-1]:.0f} GB/s, "
                             f"all_gather_into_tensor {ag['busbw_gbps'][-1]:.0f} GB/s"),
        claims.every("all_gather into a list costs more than into one tensor (the extra copies), at every size "
                     "(list / tensor time)", {format_size(sz): a / b for sz, a, b in
                                              zip(ag["size_bytes"], lst["time_ms"], ag["time_ms"])}, ">=", 1.1,
                     unit="x"),
    ]
    peak = data.get("link_peak_gbps")          # NVLink's line rate per direction, as nvidia-smi reports it
    if peak:
        out.append(claims.at_least("NCCL (§4.2's 'efficient library') moves tensors at a large share of the "
                                   "link", ag["busbw_gbps"][-1] / peak, 0.5,
                                   figure=f"all_gather_into_tensor busbw {ag['busbw_gbps'][-1]:.0f} GB/s = "
                                          f"{ag['busbw_gbps'][-1] / peak:.0%} of the NVLink line rate (nvidia-smi), "
                                          f"{peak:.0f} GB/s per direction"))
    return out


def paths_verdicts(paths: dict) -> list[claims.Verdict]:
    """Why all-gather gets less of the link than a copy (``paths.link_paths``)."""
    g = {r["path"]: r["gbps_per_direction"] for r in paths["rows"]}
    size = format_size(paths["size_bytes"])
    one, both = g["copy engine, one way"], g["copy engine, both ways"]
    ag = g["all_gather_into_tensor"]
    most = max((r for r in paths["rows"] if r["ctas"] and r["path"].startswith("all_gather")),
               key=lambda r: r["ctas"])
    spread = max(r["spread"] for r in paths["rows"])
    out = [
        claims.at_least("the link carries both directions at once at nearly the one-way rate", both / one, 0.9,
                        figure=f"copy engine at {size}: {both:.0f} GB/s per direction both ways, {one:.0f} GB/s "
                               "one way"),
        claims.at_most("all-gather's shortfall is not the link: a copy both ways moves more per direction",
                       ag / both, 0.9,
                       figure=f"all_gather_into_tensor {ag:.0f} GB/s busbw vs copy engine both ways {both:.0f} "
                              f"GB/s per direction, NCCL send/recv both ways {g['NCCL send/recv, both ways']:.0f} "
                              f"GB/s"),
    ]
    out.append(claims.at_least("all-gather is limited by how many channels NCCL gives it: more CTAs, more busbw",
                               most["gbps_per_direction"] / ag, 1.1,
                               figure=f"all_gather_into_tensor busbw {ag:.0f} GB/s with NCCL's choice, "
                                      f"{most['gbps_per_direction']:.0f} GB/s with {most['ctas']} CTAs "
                                      f"(largest p10-p90 spread of any path {spread:.0%})"))
    return out


def object_verdicts(data: dict) -> list[claims.Verdict]:
    """Tensor path vs object (pickle) path, and the NVLink bytes each put on the wire."""
    link, last = data["link"], data["rows"][-1]
    claim = "GPU-to-GPU transfers pay for serialisation (§1.2): the tensor path puts more than its bytes on NVLink"
    b = link.get("tensor_link_bytes_per_call") if link else None
    if b is None:
        serial = claims.Verdict(claim, "NVML's NVLink byte counter is not available on the recording machine",
                                "TRUE if NVLink bytes / payload >= 1.1", "UNTESTED")
    else:
        serial = claims.at_least(claim, b / link["payload_bytes_per_call"], 1.1,
                                 figure=f"NVLink carried {b / link['payload_bytes_per_call']:.3f} x the payload "
                                        f"({format_size(link['payload_bytes_per_call'])}) per all_gather")
    slow = last["object_ms"] / last["tensor_ms"]
    return [serial, claims.at_least("pickling a tensor through an object collective costs far more than moving it",
                                    slow, 10.0, figure=f"all_gather_object {slow:.0f}x slower than "
                                                       f"all_gather_into_tensor at {format_size(last['size_bytes'])}")]


def partition_verdicts(data: dict) -> list[claims.Verdict]:
    """Source §4.1 at the largest imbalance factor k: idle fast ranks, and where their idle time goes."""
    d = data["imbalance"]
    k, step = d["factors"][-1], max(d["step_ms"][-1])
    compute, gather = d["compute_ms"][-1], d["all_gather_ms"][-1]
    fast = range(1, d["world_size"])
    waits = [gather[r] - gather[0] for r in fast]          # rank 0's own all_gather is the transfer
    share = min(waits) / step
    extra = compute[0] - max(compute[r] for r in fast)     # rank 0's extra compute
    return [
        claims.at_least("uneven partitions leave GPUs idle (§4.1)", share, 0.25,
                        figure=f"k = {k}: the fast ranks wait {min(waits):.3f} ms of a {step:.3f} ms step "
                               f"({share:.0%})"),
        claims.within("the fast ranks' idle time is spent inside their all_gather (it waits for rank 0)",
                      min(waits), extra, 0.25,
                      figure=f"k = {k}: extra all_gather time {min(waits):.3f} ms, rank 0's extra compute "
                             f"{extra:.3f} ms"),
    ]


def allreduce_fit(collectives: dict) -> bandwidth.AlphaBeta:
    """Alpha-beta fit of section 2's ``all_reduce`` sweep."""
    ar = collectives["ops"]["all_reduce"]
    return bandwidth.fit_alpha_beta(ar["size_bytes"], ar["time_ms"])


def model_train_ms(row: dict, world_size: int, fit: bandwidth.AlphaBeta) -> float:
    """The cost model's forward + backward TP step: t_1 / p + 2 all-reduces from the fit."""
    ar_ms = cost_model.allreduce_ms(row["allreduce_bytes"], world_size, fit.alpha_us, fit.beta_gbps)
    return cost_model.tp_step_ms(row["one_gpu_train_ms"], world_size, ar_ms, 2)


MODEL_TOL = 0.25   # the cost model "predicts" a time within a quarter of the measurement


def model_terms(row: dict, world_size: int, fit: bandwidth.AlphaBeta) -> dict:
    """The cost model's terms for one measured width (forward + backward), next to what was measured:
    ``compute_ms`` (t_1 / p), ``comm_ms`` (2 all-reduces at the fit), ``model_ms`` (their sum),
    ``measured_ms`` (the TP step) and ``beyond_ms`` (what the step takes beyond t_1 / p: the time the
    communication term has to account for)."""
    compute = row["one_gpu_train_ms"] / world_size
    model = model_train_ms(row, world_size, fit)
    return {"hidden": row["hidden"], "compute_ms": compute, "comm_ms": model - compute, "model_ms": model,
            "measured_ms": row["tp_train_ms"], "beyond_ms": row["tp_train_ms"] - compute}


def model_verdicts(rows: list[dict], world_size: int, fit: bandwidth.AlphaBeta) -> list[claims.Verdict]:
    """The cost model t_1 / p + 2 all-reduces, judged at every width measured: the whole step, and its
    communication term alone against what the step takes beyond t_1 / p (at a wide layer t_1 / p is almost
    the whole step, so the step alone cannot tell whether the communication term is right)."""
    terms = [model_terms(r, world_size, fit) for r in rows]
    err = lambda got, want: 100 * abs(got / want - 1)  # noqa: E731
    limit = 100 * MODEL_TOL
    return [
        claims.every("t_1 / p + 2 all-reduces (section 2's fit) predicts the TP step (forward + backward), at every "
                     "width", {f"hidden {t['hidden']}": err(t["measured_ms"], t["model_ms"]) for t in terms}, "<=",
                     limit, unit="% off"),
        claims.every("its communication term, 2 all-reduces at section 2's fit, is what the TP step takes beyond "
                     "t_1 / p, at every width", {f"hidden {t['hidden']}": err(t["beyond_ms"], t["comm_ms"])
                                                 for t in terms}, "<=", limit, unit="% off"),
    ]


def tp_verdicts(collectives: dict, tp: dict) -> list[claims.Verdict]:
    """The TP MLP against one GPU, the cost model, and (where recorded) the all-reduce inside a step."""
    rows, n = tp["rows"], tp["world_size"]
    fit = allreduce_fit(collectives)
    wide, narrow = rows[-1], rows[0]
    speed = lambda r: r["one_gpu_train_ms"] / r["tp_train_ms"]  # noqa: E731
    want = 1 + 0.5 * (n - 1)
    out = [
        claims.at_least("tensor parallelism speeds up a wide MLP (forward + backward)", speed(wide), want,
                        figure=f"{speed(wide):.2f}x on {n} GPUs at hidden {wide['hidden']}"),
        claims.compare("tensor parallelism slows down a narrow MLP", speed(narrow), "<", 1.0,
                       figure=f"{speed(narrow):.2f}x on {n} GPUs at hidden {narrow['hidden']}"),
    ] + model_verdicts(rows, n, fit)
    if wide.get("allreduce_fwd_kernel_ms") is not None:
        size = wide["allreduce_bytes"]
        out.append(claims.within("inside the step, the largest all-reduce transfers as fast as the standalone "
                                 "sweep predicts", wide["allreduce_fwd_kernel_ms"], fit.predict_ms(size), 0.25,
                                 figure=f"{format_size(size)}: kernel {wide['allreduce_fwd_kernel_ms'] * 1e3:.0f} us "
                                        f"(last rank to arrive), sweep fit {fit.predict_ms(size) * 1e3:.0f} us"))
        out.append(wait_verdict(rows))
    return out


WAIT_CLAIM = "inside a step an all-reduce can cost well beyond its transfer (waiting for the slower rank)"
BEYOND = 1.25   # "well beyond": the in-step time at least a quarter above the transfer


def fits_its_step(row: dict) -> bool:
    """Whether a row's profiled in-step all-reduce (the longest rank's kernel, median over calls) fits inside
    the whole forward step timed without the profiler: one that does not was lengthened by profiling."""
    return bool(row.get("allreduce_fwd_kernel_ms")) and row["allreduce_fwd_ms"] <= row["tp_fwd_ms"]


def wait_verdict(rows: list[dict]) -> claims.Verdict:
    """In-step time vs transfer of the forward all-reduce, judged only on the hidden sizes whose profiled
    in-step time fits inside their unprofiled step (``fits_its_step``); at the one with the largest ratio."""
    judged = [r for r in rows if fits_its_step(r)]
    profiled = [r for r in rows if r.get("allreduce_fwd_kernel_ms")]
    rule = f"TRUE if >= {BEYOND:g} at a size whose in-step time fits inside its unprofiled step"
    if not judged:
        return claims.Verdict(WAIT_CLAIM, f"none of {len(profiled)} profiled sizes has an in-step all-reduce that "
                                          "fits inside its unprofiled TP step", rule, "UNTESTED")
    r = max(judged, key=lambda x: x["allreduce_fwd_ms"] / x["allreduce_fwd_kernel_ms"])
    in_step, transfer = r["allreduce_fwd_ms"], r["allreduce_fwd_kernel_ms"]
    v = claims.at_least(WAIT_CLAIM, in_step / transfer, BEYOND,
                        figure=f"at {format_size(r['allreduce_bytes'])}: {in_step * 1e3:.0f} us in the step (whole "
                               f"step {r['tp_fwd_ms'] * 1e3:.0f} us) vs {transfer * 1e3:.0f} us transfer; "
                               f"{len(judged)} of {len(profiled)} sizes fit inside their step")
    return dataclasses.replace(v, rule=rule)


SCALES_WITH_FLOPS = 0.25   # the widest step's time over the next one's, within 25% of their FLOP ratio
ONE_RATE = 0.5             # "one sustained rate" holds if the narrowest layer reaches half the widest's


def baseline_verdicts(base: dict) -> list[claims.Verdict]:
    """The one-GPU MLP (``one_gpu.mlp_baseline``): does one sustained TFLOP/s describe it, as the explorer's
    cost model assumes?"""
    rows = base["rows"]
    wide, wider, narrow = rows[-2], rows[-1], rows[0]
    flop_ratio = (wider["hidden"] * wider["ffn_hidden"]) / (wide["hidden"] * wide["ffn_hidden"])
    return [
        claims.within(f"a wide layer's fwd+bwd time grows with its FLOPs (hidden {wide['hidden']} -> "
                      f"{wider['hidden']}: {flop_ratio:g}x the FLOPs)", wider["train_ms"] / wide["train_ms"],
                      flop_ratio, SCALES_WITH_FLOPS,
                      figure=f"{wide['train_ms']:.2f} ms -> {wider['train_ms']:.2f} ms: "
                             f"{wider['train_ms'] / wide['train_ms']:.2f}x ({base['tokens']} tokens, {base['dtype']})"),
        claims.at_least("one sustained TFLOP/s (the explorer's knob) describes every width: the narrowest layer "
                        "runs at least half the widest's rate", narrow["train_tflops"] / wider["train_tflops"],
                        ONE_RATE,
                        figure=f"fwd+bwd: hidden {narrow['hidden']} {narrow['train_tflops']:.0f} TFLOP/s, hidden "
                               f"{wider['hidden']} {wider['train_tflops']:.0f} TFLOP/s "
                               f"({narrow['train_tflops'] / wider['train_tflops']:.2f}x)"),
    ]


CLAIMS = {"02_mlp_one_gpu": baseline_verdicts, "02_source_nccl_error": source_verdicts, "02_collectives": collectives_verdicts,
          "02_object_vs_tensor": object_verdicts, "02_partitions": partition_verdicts,
          ("02_collectives", "02_tp_mlp"): tp_verdicts}
