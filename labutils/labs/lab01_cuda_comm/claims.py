"""Lab 01's verdicts: the source's four tips, source 002 §5.1, and the lab's own explanations, each from a
recording through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps recording names (or tuples of them) to functions of their ``data`` dicts; the notebook
prints the same functions' lines section by section, and ``tests/test_claims.py`` re-derives them from
``notebooks/recorded/01_*.json``. Every threshold is a named constant below; the notebook says why.
"""
from __future__ import annotations

from ... import claims
from ...bandwidth import format_size
from .analysis import algbw, fits

BROADCAST, PEER_COPY = "comm.broadcast", "x.to(peer)"

LARGER_GAIN = 10.0        # tip 1 holds if the largest block moves >= 10x faster (GB/s) than a 4 KiB one
FIT_TOLERANCE = 0.25      # one alpha and one beta describe every size within 25%
SHRINK = 4                # float32 -> uint8: a quarter of the bytes
PROPORTIONAL = 0.35       # a quarter of the bytes in <= 0.35 of the time: proportional, with 40% slack
AS_FAST = 1.0             # the peer copy takes no longer than NCCL's broadcast
LARGE = 64 << 20          # "large" for the peer copy comparison: from 64 MiB up
NARROWER = 0.65           # half the bytes (fp16) in <= 0.65 of the time: the ideal 0.5 plus the fixed alpha
SLOWER = 1.1              # "slower": at least 10% more time
CHEAP = 0.5               # a cast costing at most half of the transfer it precedes
ONE_BLOCK_GAIN = 2.0      # tip 3 holds if many blocks take at least twice one block's time
LIKE_ONE_BLOCK = 2.0      # "does the work for you": within 2x of one flat tensor
HOST_SHARE = 0.5          # host steps explain at least half of broadcast_coalesced's extra time
REDUNDANT = 1.2           # listing the source GPU is redundant if it costs >= 20% more
TWICE_THE_BYTES = 1.3     # reduce_add + broadcast vs one all_reduce


def _ms(t: dict) -> float:
    return float(t["median_ms"])


def _nearest(sizes: list, size: int) -> int:
    return min(range(len(sizes)), key=lambda i: abs(sizes[i] - size))


# ---- tip 1 and §5.1: the bandwidth sweep -------------------------------------------------------------
def tip1_verdicts(sweep: dict) -> list[claims.Verdict]:
    sizes, bw = sweep["sizes"], algbw(sweep, BROADCAST)
    small = _nearest(sizes, 4096)
    fit = fits(sweep)[BROADCAST]
    return [
        claims.at_least("tip 1: use larger data blocks: fewer calls, more speed", bw[-1] / bw[small], LARGER_GAIN,
                        figure=f"comm.broadcast: {bw[small]:.2f} GB/s at {format_size(sizes[small])}, "
                               f"{bw[-1]:.0f} GB/s at {format_size(sizes[-1])}"),
        claims.at_most("one alpha + S / beta describes comm.broadcast at every size", fit.max_rel_err, FIT_TOLERANCE,
                       figure=f"{fit}; n1/2 = {format_size(fit.half_bw_bytes)}; largest deviation "
                              f"{fit.max_rel_err:.0%} over {len(sizes)} sizes"),
    ]


def shrink_verdicts(sweep: dict) -> list[claims.Verdict]:
    """Source 002 §5.1 (pre-process to shrink a transfer), judged on the broadcast sweep: a quarter of the
    bytes (float32 -> uint8) at the largest size measured and at the smallest."""
    sizes, t = sweep["sizes"], sweep["ops"][BROADCAST]["median_ms"]
    out = []
    for big in (sizes[-1], sizes[0] * SHRINK):
        if big not in sizes or big // SHRINK not in sizes:
            continue
        i, j = sizes.index(big), sizes.index(big // SHRINK)
        out.append(claims.at_most(
            f"source 002 §5.1: a quarter of the bytes (float32 -> uint8) takes a quarter of the time, "
            f"at {format_size(big)}", t[j] / t[i], PROPORTIONAL,
            figure=f"comm.broadcast {format_size(big)} {t[i] * 1e3:.1f} us, {format_size(big // SHRINK)} "
                   f"{t[j] * 1e3:.1f} us: {t[j] / t[i]:.2f} of the time"))
    return out


def peer_copy_verdicts(sweep: dict) -> list[claims.Verdict]:
    """Between two GPUs, a plain peer copy (copy engine) against NCCL's broadcast kernel, large sizes."""
    if sweep.get("n_devices") != 2 or PEER_COPY not in sweep["ops"]:
        return []
    ratios = {format_size(s): b / p for s, b, p in zip(sweep["sizes"], sweep["ops"][BROADCAST]["median_ms"],
                                                       sweep["ops"][PEER_COPY]["median_ms"]) if s >= LARGE}
    if not ratios:
        return []
    return [claims.every(
        f"between two GPUs, on messages of {format_size(LARGE)} and more, a plain peer copy (x.to, a copy engine) "
        "is as fast as NCCL's broadcast (time of the broadcast / time of the copy)", ratios, ">=", AS_FAST,
        digits=3)]


def sweep_verdicts(sweep: dict) -> list[claims.Verdict]:
    return tip1_verdicts(sweep) + shrink_verdicts(sweep) + peer_copy_verdicts(sweep)


# ---- tip 2: dtypes ------------------------------------------------------------------------------------
def dtype_verdicts(api: dict, dtypes: dict) -> list[claims.Verdict]:
    rules = api["rules"]
    nccl = {k: v for k, v in rules.items() if v["path"] == "NCCL"}
    converted = sum(not v["outcome"].startswith("raises") for v in nccl.values())
    c = {k: _ms(v) for k, v in dtypes["cases"].items()}
    t32, t16 = c["reduce_add fp32 (NCCL)"], c["reduce_add fp16 (NCCL)"]
    mixed, same = c["fallback fp32 + fp16 (non-contiguous, converts)"], c["fallback fp32 + fp32 (non-contiguous)"]
    cast = c["cast fp16 -> fp32 alone (GPU 1)"]
    size = format_size(4 * dtypes["numel"])
    return [
        claims.compare("tip 2: given mixed dtypes, torch.cuda.comm converts them (on its NCCL path)",
                       converted, ">=", 1,
                       figure=f"{converted} of {len(nccl)} mixed-dtype calls on the NCCL path returned; the others raise"),
        claims.at_least("tip 2: the conversion slows the call down (fallback path, mixed vs same dtype)",
                        mixed / same, SLOWER,
                        figure=f"reduce_add of {size} fp32: with an fp16 input {mixed:.3f} ms, all fp32 {same:.3f} ms"),
        claims.at_most("a cast costs little next to the transfer", cast / t32, CHEAP,
                       figure=f"cast fp16 -> fp32 {cast:.3f} ms; reduce_add of {size} fp32 (NCCL) {t32:.3f} ms"),
        claims.at_most("source 002 §5.1: half the bytes (fp16) nearly halves a large reduce_add", t16 / t32, NARROWER,
                       figure=f"NCCL reduce_add of {dtypes['numel'] >> 20} Mi elements: fp16 {t16:.3f} ms, "
                              f"fp32 {t32:.3f} ms ({t16 / t32:.2f})"),
    ]


# ---- tip 3: many small tensors --------------------------------------------------------------------------
def many_verdicts(many: dict) -> list[claims.Verdict]:
    """Tip 3 and ``broadcast_coalesced``, each judged at every tensor count measured (the same bytes split into
    more and more tensors): "many blocks" are the counts above one; "does the work for you" every count."""
    counts, flat = many["counts"], _ms(many["flat"])
    loop = {c: _ms(t) for c, t in zip(counts, many["loop"])}
    coal = {c: _ms(t) for c, t in zip(counts, many["coalesced"])}
    many_counts = [c for c in counts if c > 1] or counts
    what = f"{format_size(many['total_bytes'])} split into k tensors"
    out = [
        claims.every(f"tip 3: one block instead of many input blocks is faster ({what}: time of a loop of "
                     "broadcasts / one flat tensor's)", {f"k = {c}": loop[c] / flat for c in many_counts}, ">=",
                     ONE_BLOCK_GAIN, unit="x"),
        claims.every(f"broadcast_coalesced is faster than a loop of broadcasts ({what}: loop / coalesced)",
                     {f"k = {c}": loop[c] / coal[c] for c in many_counts}, ">=", ONE_BLOCK_GAIN, unit="x"),
        claims.every(f"broadcast_coalesced does the work for you: it costs what one flat tensor costs ({what}: "
                     "coalesced / flat)", {f"k = {c}": coal[c] / flat for c in counts}, "<=", LIKE_ONE_BLOCK,
                     unit="x"),
    ]
    steps = many.get("host_steps")
    coal = coal.get(steps["count"], coal[counts[-1]]) if steps else coal[counts[-1]]   # where they were measured
    if steps and coal > flat:
        host = sum(_ms(v) for v in steps["steps"].values())
        parts = ", ".join(f"{k} {_ms(v):.2f} ms" for k, v in steps["steps"].items())
        out.append(claims.at_least(
            "broadcast_coalesced's extra time is per-tensor work on the host (flatten, a view per tensor)",
            host / (coal - flat), HOST_SHARE,
            figure=f"{steps['count']} tensors: {parts} = {host / (coal - flat):.0%} of its extra "
                   f"{coal - flat:.2f} ms; {(coal - flat) / steps['count'] * 1e3:.1f} us per tensor"))
    return out


# ---- tip 4: redundant transfers ---------------------------------------------------------------------------
def redundant_verdicts(redundant: dict, profile: dict) -> list[claims.Verdict]:
    sizes, cases = redundant["sizes"], redundant["cases"]

    def ratio(a: str, b: str) -> dict[str, float]:
        return {format_size(s): _ms(x) / _ms(y) for s, x, y in zip(sizes, cases[a], cases[b])}
    kernels = profile["ops"]["comm.broadcast(out=) incl. source GPU"]
    nccl = sum(k["count"] for k in kernels if k["kind"] == "nccl")
    copies = ", ".join(f"{k['count']} {k['kind']}" for k in kernels if k["kind"] != "nccl") or "none"
    return [
        claims.every("tip 4: reduce_add + broadcast (every byte sent twice) costs more than one all_reduce "
                     "(time of the pair / time of nccl.all_reduce)",
                     ratio("reduce_add + broadcast", "nccl.all_reduce"), ">=", TWICE_THE_BYTES, unit="x"),
        claims.every("listing the source GPU in broadcast(devices) is a redundant transfer (time to all GPUs / "
                     "time to the others)", ratio("broadcast to all GPUs (source included)",
                                                  "broadcast to the other GPUs"), ">=", REDUNDANT, unit="x"),
        claims.compare("an out= tensor on the source GPU switches NCCL off", nccl, "<=", 0,
                       figure=f"broadcast(out=) incl. the source GPU ran {nccl} NCCL kernels; copies: {copies}"),
        claims.every("an out= tensor on the source GPU makes broadcast(out=) slower (time with it / without)",
                     ratio("broadcast(out=) incl. one on the source GPU", "broadcast(out=) on the other GPUs"),
                     ">=", SLOWER, unit="x"),
    ]


# ---- the "optimised" program on one GPU (one_gpu.profile_program) -----------------------------------------
def optimised_verdicts(optimised: dict) -> list[claims.Verdict]:
    """What the CUDA trace of the source's "optimised" program (both tensors on ``cuda:0``) shows."""
    kernels = optimised["kernels"]
    count = {kind: sum(k["count"] for k in kernels if k["kind"] == kind)
             for kind in ("nccl", "peer copy", "host copy", "local copy", "compute kernel", "memset")}
    moved = count["nccl"] + count["peer copy"] + count["host copy"]
    ran = ", ".join(f"{kind} x{n}" for kind, n in count.items() if n) or "nothing"
    where = ", ".join(f"GPU {d}" for d in optimised["devices"]) or "no GPU"
    compute = sorted({k["name"] for k in kernels if k["kind"] == "compute kernel"})
    return [
        claims.at_least("the source's \"optimised\" program communicates (its calls are broadcast and reduce_add)",
                        moved, 1,
                        figure=f"its CUDA trace: {count['nccl']} NCCL kernels, {count['peer copy']} copies between "
                               f"GPUs, {count['host copy']} host copies; all it ran: {ran} on {where}"),
        claims.at_most("reduce_add of two tensors on one GPU is one elementwise addition (no NCCL: it needs "
                       "distinct devices)", count["nccl"] + count["peer copy"], 0,
                       figure=f"{count['compute kernel']} compute kernels ({'; '.join(compute) or 'none'}), "
                              f"{count['nccl']} NCCL kernels, on {where}"),
    ]


CLAIMS = {
    "01_bandwidth_sweep": sweep_verdicts,
    "01_optimised_one_gpu": optimised_verdicts,
    ("01_api_examples", "01_dtype_costs"): dtype_verdicts,
    "01_many_small": many_verdicts,
    ("01_redundant", "01_profile"): redundant_verdicts,
}
