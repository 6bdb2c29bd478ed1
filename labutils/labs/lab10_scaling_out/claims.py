"""Lab 10's verdicts, each from data through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps recording names to functions of their ``data``: ``10_cost_vs_n`` is the gloo sweep over n
(live on every machine; recorded by the reference run like every measurement), ``06_bench_sweep`` lab 06's
2-GPU all_reduce sweep, from which the 8-GPU predictions are made.
"""
from __future__ import annotations

from ... import bandwidth, claims
from ...bandwidth import format_size
from . import model, published


def fits(data: dict) -> dict:
    """``{algorithm: {n: AlphaBeta or None}}``: t = alpha + S / beta per algorithm and n (None where the
    times did not grow with the size, so that no bandwidth can be fitted)."""
    out = {}
    for a in data["algorithms"]:
        out[a] = {}
        for n in data["ns"]:
            try:
                out[a][n] = bandwidth.fit_alpha_beta(data["sizes"], data["time_ms"][a][str(n)])
            except ValueError:
                out[a][n] = None
    return out


def ledger_mismatches(data: dict) -> list[str]:
    """Where the ledger's messages or bytes of a rank differ from the model's (empty: none)."""
    size = data["ledger_size_bytes"]
    bad = []
    for a in data["algorithms"]:
        for n in data["ns"]:
            led = data["ledger"][a][str(n)]
            for r in range(n):
                want_bytes = model.sent_bytes(a, r, n, size)
                want_msgs = {"ring": 2 * (n - 1), "tree": model.tree_sends(r, n), "direct": n - 1}[a]
                if abs(led["wire_bytes"][r] - want_bytes) > 1e-6 * size or led["messages"][r] != want_msgs:
                    bad.append(f"{a} n={n} rank {r}")
    return bad


def crossover(data: dict, n: int, a: str = "ring", b: str = "tree") -> int | None:
    """The smallest swept size from which ``a`` is never slower than ``b`` on ``n`` ranks (None: never)."""
    ta, tb = data["time_ms"][a][str(n)], data["time_ms"][b][str(n)]
    for i, size in enumerate(data["sizes"]):
        if all(x <= y for x, y in zip(ta[i:], tb[i:])):
            return size
    return None


def cost_verdicts(data: dict) -> list[claims.Verdict]:
    ns, small, big = data["ns"], 0, -1
    n0, n1 = ns[0], ns[-1]
    ring = data["time_ms"]["ring"]
    bad = ledger_mismatches(data)
    wrong = [f"{a} n={n}" for a in data["algorithms"] for n in ns if not data["correct"][a][str(n)]]
    rounds_ratio = model.rounds("ring", n1) / model.rounds("ring", n0)
    small_ratio = ring[str(n1)][small] / ring[str(n0)][small]
    t_ring, t_tree = ring[str(n1)][big], data["time_ms"]["tree"][str(n1)][big]
    return [
        claims.compare("every algorithm's result is the sum, on every n", len(wrong), "<=", 0,
                       figure=f"{len(wrong)} wrong" + (f" ({', '.join(wrong)})" if wrong else "")),
        claims.compare("the ledger counts the messages and bytes the model gives each rank", len(bad), "<=", 0,
                       figure=f"{len(bad)} of {sum(ns) * len(data['algorithms'])} rank counts differ"),
        claims.at_least(f"the ring's time for a small message grows with its 2 (n-1) rounds (from n = {n0} to {n1}: "
                        f"{rounds_ratio:.0f}x the rounds)", small_ratio, rounds_ratio / 2,
                        figure=f"{format_size(data['sizes'][small])}: {ring[str(n0)][small] * 1e3:.0f} us at "
                               f"n = {n0}, {ring[str(n1)][small] * 1e3:.0f} us at n = {n1} ({small_ratio:.1f}x)"),
        claims.at_most(f"per-link model: on {n1} ranks the ring beats the tree at {format_size(data['sizes'][big])} "
                       "(its busiest rank sends less)", t_ring / t_tree, 1.0,
                       figure=f"ring {t_ring:.1f} ms, tree {t_tree:.1f} ms on {data['cores']} cores "
                              f"(ring / tree {t_ring / t_tree:.2f})"),
    ]


def allreduce_fit_2gpu(bench: dict) -> bandwidth.AlphaBeta:
    """Alpha-beta fit of lab 06's in-place all_reduce sweep on 2 GPUs (eager: the host's launch included)."""
    rows = [r for r in bench["rows"] if r["collective"] == "all_reduce" and r["placement"] == "in-place"]
    return bandwidth.fit_alpha_beta([r["size_bytes"] for r in rows], [r["time_us"] / 1e3 for r in rows])


def predicted_8gpu_busbw(bench: dict) -> tuple[float, int]:
    """(busbw, size): the ring model's busbw on 8 GPUs at lab 06's largest size, from the 2-GPU fit."""
    fit, n = allreduce_fit_2gpu(bench), bench["meta"]["world_size"]
    size = max(r["size_bytes"] for r in bench["rows"] if r["collective"] == "all_reduce")
    return model.ring_busbw_gbps(size, 8, model.per_round_alpha_us(fit.alpha_us, n), fit.beta_gbps), size


PREDICTION_TOLERANCE = 0.25


def prediction_verdicts(bench: dict) -> list[claims.Verdict]:
    pred, size = predicted_8gpu_busbw(bench)
    ring, nvls = published.H100_8GPU_RING_BUSBW, published.H100_8GPU_NVLS_BUSBW
    return [
        claims.within("the 2-GPU fit and the ring's bus factor predict 8-GPU ring all_reduce busbw (published, "
                      "NCCL_ALGO=RING)", pred, ring.value, PREDICTION_TOLERANCE,
                      figure=f"predicted {pred:.0f} GB/s at {format_size(size)}; published {ring.value:.0f} GB/s "
                             "(not measured here)"),
        claims.within("the same ring model predicts NCCL's default on 8 GPUs (published, NVLS on)", pred,
                      nvls.value, PREDICTION_TOLERANCE,
                      figure=f"predicted {pred:.0f} GB/s; published {nvls.value:.0f} GB/s (not measured here)"),
    ]


CLAIMS = {
    "10_cost_vs_n": cost_verdicts,
    "06_bench_sweep": prediction_verdicts,
}


def roofline_model(data: dict) -> dict:
    """From the n-rank roofline sweep: the matmul rate (the highest reached: a roofline's ceiling), the
    all-reduce's alpha-beta fit, and the first swept hidden at which the MLP's compute is at least its
    all-reduce -- measured and modelled."""
    n, tokens, hs = data["n"], data["tokens"], data["hiddens"]
    flops = [2 * 2 * tokens * h * 4 * h / n for h in hs]
    rate = max(f / (t * 1e-3) for f, t in zip(flops, data["compute_ms"]))
    fit = bandwidth.fit_alpha_beta([tokens * h * 4 for h in hs], data["comm_ms"])
    modelled = [(f / rate * 1e3, fit.predict_ms(tokens * h * 4)) for f, h in zip(flops, hs)]
    first = lambda pairs: next((h for h, (c, m) in zip(hs, pairs) if c >= m), None)  # noqa: E731
    return {"flops_per_s": rate, "fit": fit, "measured": first(list(zip(data["compute_ms"], data["comm_ms"]))),
            "modelled": first(modelled), "modelled_ms": modelled,
            "h_star_bandwidth_only": model.roofline_hidden(n, rate, fit.beta_gbps, itemsize=4)}


def roofline_verdicts(data: dict) -> list[claims.Verdict]:
    r = roofline_model(data)
    m, p = r["measured"], r["modelled"]
    steps = abs(data["hiddens"].index(m) - data["hiddens"].index(p)) if m and p else len(data["hiddens"])
    return [claims.at_most(f"the roofline (this run's matmul rate and all-reduce fit) places the hidden size where "
                           f"the {data['n']}-rank tensor-parallel MLP stops being communication-bound",
                           steps, 1, figure=f"measured: compute >= all-reduce from hidden {m}; modelled: from {p} "
                                            f"({steps} swept step(s) apart)")]


CLAIMS["10_roofline"] = roofline_verdicts
