"""Lab 03's verdicts, each from a recording through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps recording names to functions of their ``data`` dicts; the notebook prints their lines and
``tests/test_claims.py`` re-derives them from ``notebooks/recorded/03_*.json``. A case a recording does not
hold (one made by an older version of the lab) gives no verdict rather than a wrong one.
"""
from __future__ import annotations

from ... import claims
from ...bandwidth import format_size
from .overlap import PEER_COPY, PEER_COPY_ONE, PEER_MEMCPY
from .repro import COMPLETED, CRASH, HANG, NOT_RECORDED

HIDDEN, PARTLY = 0.8, 0.1   # overlap efficiency E: the shorter activity hidden / at least partly hidden
NO_DATA = "NO DATA"


# ---- the source's exchange on GPUs (standalone reproducer) ----------------------------------------------

def _holds(claim: str, figure: str, rule: str, ok: bool) -> claims.Verdict:
    return claims.Verdict(claim, figure, rule, claims.TRUE if ok else claims.FALSE)


def _variant(data: dict, arg: str, env: dict | None = None) -> dict | None:
    """The run of the reproducer with argument ``arg`` and exactly the extra environment ``env``."""
    return next((v for v in data["variants"].values() if v["arg"] == arg and v["env"] == (env or {})), None)


def _status_verdict(claim: str, runs: list, rule: str, holds) -> claims.Verdict:
    """TRUE if ``holds(*statuses)``; NO DATA if a run is missing or was never recorded."""
    statuses = [r["status"] if r else NOT_RECORDED for r in runs]
    figure = "; ".join(f"{r['arg']}{' ' + ' '.join(f'{k}={v}' for k, v in r['env'].items()) if r['env'] else ''}: "
                       f"{r['status']}" for r in runs if r) or "not recorded"
    if NOT_RECORDED in statuses:
        return claims.Verdict(claim, figure, rule, NO_DATA)
    return _holds(claim, figure, rule, holds(*statuses))


def exchange_verdicts(data: dict) -> list[claims.Verdict]:
    written, cumem_off = _variant(data, "as_written"), _variant(data, "as_written", {"NCCL_CUMEM_ENABLE": "0"})
    pre, batched, recv_first = (_variant(data, a) for a in ("preconnected", "batched", "recv_first"))
    return [
        _status_verdict("the source's exchange (every isend, then every irecv) completes on CUDA tensors",
                        [written], f"TRUE if {COMPLETED}", lambda s: s == COMPLETED),
        _status_verdict("the failure lies in NCCL setting up the connection, not in the program's tensors: "
                        "the same exchange on a connected pair completes, and another NCCL transport changes "
                        "the failure", [written, pre, cumem_off],
                        f"TRUE if as written {CRASH}, pre-connected {COMPLETED}, CUMEM off not {CRASH}",
                        lambda w, p, c: w == CRASH and p == COMPLETED and c != CRASH),
        _status_verdict("the same requests in one batch_isend_irecv complete", [batched],
                        f"TRUE if {COMPLETED}", lambda s: s == COMPLETED),
        _status_verdict("two ranks that both receive first wait for each other forever (a deadlock by design)",
                        [recv_first], f"TRUE if {HANG}", lambda s: s == HANG),
    ]


def source_verdicts(data: dict) -> list[claims.Verdict]:
    """The source's program as written (CPU tensors) under NCCL."""
    message = data["message"].split(". HINT")[0]
    return [_holds("the source's program runs as written under NCCL (its tensors are on the CPU)",
                   f"{data['status']}: {message[:160]}", "TRUE if completed", data["status"] == "completed")]


# ---- what wait() guarantees ------------------------------------------------------------------------------

def wait_verdicts(data: dict) -> list[claims.Verdict]:
    share = data["wait_ms"] / data["sync_ms"]
    return [
        claims.at_most("under NCCL, req.wait() returns before the data has arrived (it orders the current "
                       "stream, not the host)", share, 0.1,
                       figure=f"host in wait() {data['wait_ms']:.3f} ms, until synchronize() "
                              f"{data['sync_ms']:.1f} ms ({share:.1%})"),
        claims.compare("after wait(), work on the current stream sees the received data",
                       int(data["after_wait_ok"]), ">=", 1, figure=f"correct after wait(): {data['after_wait_ok']}"),
    ]


# ---- overlap ---------------------------------------------------------------------------------------------

def _cases(data: dict) -> dict:
    return {(c["compute"].split(" (")[0], c["transfer"]): c for c in data["cases"]}


def _level(e: float) -> str:
    return claims.TRUE if e >= HIDDEN else "PARTLY" if e >= PARTLY else claims.FALSE


def overlap_verdict(claim: str, case: dict) -> claims.Verdict:
    """TRUE if E >= HIDDEN, PARTLY if E >= PARTLY, else FALSE."""
    e = case["efficiency"]
    return claims.Verdict(claim, f"E = {e:+.2f} ({case['compute']} + {case['transfer']}, k = {case['k']})",
                          f"TRUE if E >= {HIDDEN:g}, PARTLY if >= {PARTLY:g}", _level(e))


def overlap_every(claim: str, cases: list) -> claims.Verdict:
    """A claim stated for any compute, judged on every case measured for it: the worst E decides (TRUE if every
    E >= HIDDEN, PARTLY if every E >= PARTLY)."""
    worst = min(cases, key=lambda c: c["efficiency"])
    figure = (f"worst E = {worst['efficiency']:+.2f} ({worst['compute']} + {worst['transfer']}); all: "
              + ", ".join(f"{c['compute'].split(' (')[0]} {c['efficiency']:+.2f}" for c in cases))
    return claims.Verdict(claim, figure, f"TRUE if every E >= {HIDDEN:g}, PARTLY if every E >= {PARTLY:g}",
                          _level(worst["efficiency"]))


COPY_ENGINE = (PEER_COPY, PEER_COPY_ONE, PEER_MEMCPY)


def copy_vs_nccl_verdict(data: dict) -> claims.Verdict | None:
    """Next to the memory-bound kernel, every copy-engine case against every NCCL case: the lowest copy E must
    beat the highest NCCL E by PARTLY (a real difference, not a sample's spread). None without both kinds."""
    mem = [c for c in data["cases"] if c["compute"].startswith("memory-bound")]
    copies = [c for c in mem if c["transfer"] in COPY_ENGINE]
    nccl = [c for c in mem if c["transfer"].endswith("(NCCL)")]
    if not copies or not nccl:
        return None
    low, high = min(copies, key=lambda c: c["efficiency"]), max(nccl, key=lambda c: c["efficiency"])
    gap = low["efficiency"] - high["efficiency"]
    return claims.at_least(
        "next to a memory-bound kernel a copy-engine copy hides more than an NCCL transfer", gap, PARTLY,
        figure=f"lowest copy-engine E {low['efficiency']:+.2f} ({low['transfer']}) - highest NCCL E "
               f"{high['efficiency']:+.2f} ({high['transfer']}) = {gap:+.2f}, over {len(copies)} copy and "
               f"{len(nccl)} NCCL cases")


def overlap_verdicts(data: dict) -> list[claims.Verdict]:
    cases, out = _cases(data), []
    lib = "NCCL" if any(t.endswith("(NCCL)") for _, t in cases) else "gloo"
    p2p = [c for c in data["cases"] if c["transfer"] == f"send/recv ({lib})"]
    if p2p:   # the source's claim names no compute: judged beside every compute measured
        out.append(overlap_every("isend/irecv: while the data moves, the GPU keeps computing (source 5.2)", p2p))
    wanted = [("asynchronous all_reduce hides behind a matmul", "matmul", f"all_reduce ({lib})"),
              ("a copy-engine copy hides behind a matmul when one rank copies (copy_)", "matmul", PEER_COPY_ONE),
              ("a copy-engine copy hides behind a matmul when every rank copies with copy_", "matmul", PEER_COPY),
              ("a copy-engine copy hides behind a matmul when every rank copies without copy_'s barrier",
               "matmul", PEER_MEMCPY)]
    for claim, compute, transfer in wanted:
        if (compute, transfer) in cases:
            out.append(overlap_verdict(claim, cases[(compute, transfer)]))
    versus = copy_vs_nccl_verdict(data)
    if versus is not None:
        out.append(versus)
    prof = data.get("profiles", {})
    if PEER_COPY in prof:
        p = prof[PEER_COPY]
        copies = [g for g in p["gpu"] if g["engine"] == "copy engine"]
        kernels = [g for g in p["gpu"] if g["engine"] == "SMs"]
        out.append(_holds("a peer copy_ runs on the copy engines, with no kernel on the SMs",
                          f"profiler: {', '.join(sorted({g['name'] for g in copies})) or 'no memcpy'} "
                          f"x{len(copies)}, kernels x{len(kernels)}", "TRUE if >= 1 memcpy and 0 kernels",
                          len(copies) >= 1 and not kernels))
        waits = p["runtime"].get("cudaStreamWaitEvent", 0)
        raw = prof.get(PEER_MEMCPY, {}).get("runtime", {}).get("cudaStreamWaitEvent", 0)
        out.append(_holds("copy_ between GPUs makes streams on both devices wait for each other; a bare "
                          "cudaMemcpyAsync does not", f"cudaStreamWaitEvent per call: copy_ {waits}, "
                          f"cudaMemcpyAsync {raw}", "TRUE if copy_ >= 2 and cudaMemcpyAsync 0",
                          waits >= 2 and raw == 0))
    return out


# ---- NCCL against a hand-written ring and against no GPU library at all ------------------------------------

SMALL_BYTES, LARGE_BYTES = 4 << 20, 64 << 20   # the ring's "small" and "large" messages, fixed before measuring


def ring_verdicts(data: dict) -> list[claims.Verdict]:
    """Each claim on every size of its class: small (<= 4 MiB gathered), large (>= 64 MiB), any (the source's)."""
    sizes, n = data["size_bytes"], data["world_size"]
    fmt = format_size
    small = {fmt(s): r / c for s, r, c in zip(sizes, data["ring_ms"], data["collective_ms"]) if s <= SMALL_BYTES}
    large = {fmt(s): r / c for s, r, c in zip(sizes, data["ring_busbw_gbps"], data["collective_busbw_gbps"])
             if s >= LARGE_BYTES}
    out = []
    if small:
        out.append(claims.every(f"on small messages (up to {fmt(SMALL_BYTES)}) NCCL's all-gather (one call) beats "
                                f"the hand-written ring (a local copy and {n - 1} batched send/recv step(s) from "
                                "Python): ring / NCCL time", small, ">=", 1.5, unit="x"))
    if large:
        out.append(claims.every(f"on large messages (from {fmt(LARGE_BYTES)}) the ring gets within 15% of NCCL's "
                                "busbw (both bound by the links): ring / NCCL busbw", large, ">=", 0.85))
    if data.get("host_busbw_gbps"):
        ratios = {fmt(s): c / h for s, c, h in zip(sizes, data["collective_busbw_gbps"], data["host_busbw_gbps"])}
        out.append(claims.every("use an efficient library such as NCCL (source 4.2): NCCL beats moving GPU data "
                                "without it (host memory + gloo) at every size: NCCL / host-path busbw", ratios,
                                ">=", 2.0, unit="x"))
    return out


CLAIMS = {"03_source_on_nccl": source_verdicts, "03_exchange_variants": exchange_verdicts,
          "03_wait_nccl": wait_verdicts, "03_overlap": overlap_verdicts, "03_ring_vs_nccl": ring_verdicts}


# ---- one GPU: copies beside a matmul on a side stream, and the race without wait_stream ----------------------

RACE_SHOWN = 0.5   # "the overwrite reaches the copy": at least half of the saved elements hold step 2's value


def one_gpu_verdicts(data: dict) -> list[claims.Verdict]:
    """``03_one_gpu_streams``: each host <-> GPU copy beside a matmul, and the race with and without the fix."""
    out = [overlap_verdict(f"on one GPU, a {c['transfer']} on a side stream hides behind a matmul (a copy engine "
                           "needs no SMs)", c) for c in data["cases"]]
    race = data["race"]
    worst_fixed = max(race["fixed_delayed"], race["fixed"])
    out += [
        claims.at_least("without main.wait_stream(side), the current stream's overwrite reaches the side stream's "
                        "copy", race["unsynced_delayed"], RACE_SHOWN,
                        figure=f"{race['unsynced_delayed']:.1%} of the saved elements hold step 2's value (side "
                               f"stream busy {race['delay_ms']:g} ms first)"),
        claims.at_most("with main.wait_stream(side) before the overwrite, the copy holds step 1's data",
                       worst_fixed, 0.0, figure=f"at most {worst_fixed:.1%} overwritten, side stream busy first "
                                                f"or not ({race['trials']} runs each)"),
    ]
    return out


CLAIMS["03_one_gpu_streams"] = one_gpu_verdicts
