"""Lab 01's analysis, pure (no GPU): alpha-beta fits of a sweep, profiler kernel names, and the
verdicts on the source's four claims, all computed from recorded or live JSON data::

    from labutils.labs.lab01_cuda_comm import analysis
    analysis.fits(sweep)["comm.broadcast"]            # AlphaBeta(alpha_us, beta_gbps)
    analysis.claims(sweep, dtypes, rules, many, redundant, link_peak_gbps=478.1)
"""
from __future__ import annotations

import re

from ... import bandwidth
from ...bandwidth import format_size


def fits(sweep: dict) -> dict:
    """``{op: bandwidth.AlphaBeta}`` fitted to the medians of a ``measure.sweep`` result."""
    return {op: bandwidth.fit_alpha_beta(sweep["sizes"], d["median_ms"]) for op, d in sweep["ops"].items()}


def algbw(sweep: dict, op: str) -> list[float]:
    """Algorithm bandwidth S / t (GB/s) of ``op`` at every size of the sweep."""
    return [bandwidth.algbw_gbps(s, t) for s, t in zip(sweep["sizes"], sweep["ops"][op]["median_ms"])]


def kernel_kind(name: str) -> str:
    """Classify a device activity: ``nccl``, ``peer copy`` (Memcpy PtoP), ``local copy``
    (Memcpy DtoD), ``host copy``, ``memset`` or ``compute kernel``."""
    if "nccl" in name.lower():
        return "nccl"
    if name.startswith("Memcpy"):
        return {"PtoP": "peer copy", "DtoD": "local copy"}.get(name.split()[1] if " " in name else "",
                                                               "host copy")
    return "memset" if name.startswith("Memset") else "compute kernel"


def short_kernel_name(name: str, width: int = 60) -> str:
    """``void at::native::f<4, X<float>>(int, ...)`` -> ``at::native::f<…>``; memcpy/memset
    names are kept; cut to ``width`` characters."""
    if name.startswith(("Memcpy", "Memset")):
        return name[:width]
    name = name[5:] if name.startswith("void ") else name
    out, depth = [], 0
    for ch in name:
        if ch == "(" and depth == 0:
            break
        if ch == "<":
            depth += 1
            if depth == 1:
                out.append("<…>")
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    short = re.sub(r"\s+", " ", "".join(out)).strip()
    return short if len(short) <= width else short[:width - 1] + "…"


def device_kernels(events) -> list[dict]:
    """Device-side activities of profiler ``events`` grouped by (kind, short name, device):
    ``[{"kind", "name", "device", "count", "time_us"}]`` sorted by device, kind, name."""
    agg: dict = {}
    for e in events:
        if "CUDA" not in str(e.device_type) or getattr(e, "is_user_annotation", False):
            continue
        key = (kernel_kind(e.name), short_kernel_name(e.name), int(e.device_index))
        row = agg.setdefault(key, {"kind": key[0], "name": key[1], "device": key[2], "count": 0,
                                   "time_us": 0.0})
        row["count"] += 1
        row["time_us"] += float(e.time_range.elapsed_us())
    return sorted(agg.values(), key=lambda r: (r["device"], r["kind"], r["name"]))


def _ms(timing_dict: dict) -> float:
    return float(timing_dict["median_ms"])


def headline(sweep: dict, many: dict) -> dict:
    """The closing note's numbers: peak broadcast bandwidth (GB/s, and at which size) and how
    much slower a loop of broadcasts over the most tensors is than ``broadcast_coalesced``."""
    bw = algbw(sweep, "comm.broadcast")
    i = max(range(len(bw)), key=bw.__getitem__)
    return {"peak_broadcast_gbps": bw[i], "peak_broadcast_size": sweep["sizes"][i],
            "many_small_count": many["counts"][-1],
            "loop_over_coalesced": _ms(many["loop"][-1]) / _ms(many["coalesced"][-1]),
            "coalesced_over_flat": _ms(many["coalesced"][-1]) / _ms(many["flat"])}


CLAIMS = ("1. Use larger blocks: fewer communications, more speed",
          "2. Use one dtype, else cuda.comm converts and slows down",
          "3. Avoid many input blocks, use a single block",
          "4. Avoid redundant transfers")


def claims(sweep: dict, dtypes: dict, rules: dict, many: dict, redundant: dict,
           link_peak_gbps: float | None = None) -> list[dict]:
    """Verdict on each of the source's four tips, with the measured numbers behind it.

    Args: the results of ``measure.sweep``, ``dtype_costs``, ``many_small``,
        ``redundant`` and ``verify.dtype_rules``; ``link_peak_gbps`` the NVLink peak per
        direction (None if unknown).

    Returns:
        ``[{"claim", "verdict", "evidence"}]`` in the source's order. Verdicts: TRUE / FALSE /
        IT DEPENDS, decided by the thresholds in the code below (never typed in by hand).
    """
    rows = []
    # 1. larger blocks: bandwidth at 4 KiB vs the best one, and where the fit says it saturates
    fit, bw, sizes = fits(sweep)["comm.broadcast"], algbw(sweep, "comm.broadcast"), sweep["sizes"]
    small = min(range(len(sizes)), key=lambda i: abs(sizes[i] - 4096))
    top = headline(sweep, many)
    ratio = top["peak_broadcast_gbps"] / bw[small]
    link = f" ({top['peak_broadcast_gbps'] / link_peak_gbps:.0%} of the {link_peak_gbps:.0f} GB/s " \
           "link)" if link_peak_gbps else ""
    rows.append({"claim": CLAIMS[0],
                 "verdict": "TRUE, up to a point" if ratio >= 10 else ("FALSE" if ratio < 2 else "IT DEPENDS"),
                 "evidence": f"broadcast: {bw[small]:.2g} GB/s at {format_size(sizes[small])}, "
                             f"{top['peak_broadcast_gbps']:.0f} GB/s at "
                             f"{format_size(top['peak_broadcast_size'])}{link}; fit {fit}: half of "
                             f"beta from {format_size(fit.half_bw_bytes)} on, little gain beyond"})
    # 2. dtypes: does the NCCL path convert (it raises), what does the fallback cost
    c = {k: _ms(v) for k, v in dtypes["cases"].items()}
    t32, t16 = c["reduce_add fp32 (NCCL)"], c["reduce_add fp16 (NCCL)"]
    mixed_fb, same_fb = c["fallback fp32 + fp16 (non-contiguous, converts)"], c["fallback fp32 + fp32 (non-contiguous)"]
    raises = rules["reduce_add fp32 (GPU 0) + fp16 (GPU 1)"]["outcome"].startswith("raises")
    rows.append({"claim": CLAIMS[1],
                 "verdict": "FALSE as stated" if raises else "IT DEPENDS",
                 "evidence": f"NCCL path: mixed dtypes {'raise' if raises else 'run'}, nothing is converted; "
                             f"the fallback path converts inside its add: {mixed_fb:.2f} ms mixed vs "
                             f"{same_fb:.2f} ms same dtype vs {t32:.2f} ms NCCL "
                             f"({format_size(4 * dtypes['numel'])} fp32); a cast alone "
                             f"{c['cast fp16 -> fp32 alone (GPU 1)']:.3f} ms; fp16 payload "
                             f"{t16 / t32:.2f}x the fp32 time"})
    # 3. many blocks: loop of broadcasts vs broadcast_coalesced vs one flat tensor
    loop, coal, flat = _ms(many["loop"][-1]), _ms(many["coalesced"][-1]), _ms(many["flat"])
    rows.append({"claim": CLAIMS[2],
                 "verdict": "TRUE" if loop / flat >= 2 else "IT DEPENDS",
                 "evidence": f"{format_size(many['total_bytes'])} as {many['counts'][-1]} tensors: "
                             f"loop of broadcasts {loop:.1f} ms, broadcast_coalesced {coal:.2f} ms "
                             f"({loop / coal:.0f}x less), one flat tensor {flat:.2f} ms"})
    # 4. redundant transfers, at the largest size measured
    r = {k: _ms(v[-1]) for k, v in redundant["cases"].items()}
    rb = r["reduce_add + broadcast"] / r["nccl.all_reduce"]
    src = r["broadcast to all GPUs (source included)"] / r["broadcast to the other GPUs"]
    out_local = r["broadcast(out=) incl. one on the source GPU"] / r["broadcast(out=) on the other GPUs"]
    rows.append({"claim": CLAIMS[3],
                 "verdict": "TRUE" if max(rb, out_local) >= 1.3 else "IT DEPENDS",
                 "evidence": f"at {format_size(redundant['sizes'][-1])}: reduce_add + broadcast "
                             f"{rb:.1f}x one nccl.all_reduce; an out= tensor on the source GPU "
                             f"{out_local:.1f}x (NCCL off, copies); listing the source GPU in "
                             f"broadcast {src:.2f}x (it is returned, not copied)"})
    return rows


def markdown_table(rows: list[dict]) -> str:
    """Rows of ``claims`` as a Markdown table (claim | verdict | measured)."""
    def cell(s):
        return str(s).replace("|", "\\|")
    lines = ["| claim (source) | verdict | measured |", "| --- | --- | --- |"]
    lines += [f"| {cell(r['claim'])} | **{cell(r['verdict'])}** | {cell(r['evidence'])} |" for r in rows]
    return "\n".join(lines)
