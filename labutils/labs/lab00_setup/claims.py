"""Lab 00's verdicts, each from the copy sweeps through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps the recordings ``00_copy_local`` (host<->GPU, on one GPU) and ``00_copy_bandwidth``
(GPU to GPU, with the topology of the machine that measured it) to ``all_verdicts``; the notebook
prints its lines and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/00_*.json``.

The host<->GPU sweep needs one GPU and the GPU-to-GPU one two, so on one GPU the first is live and the
second recorded: ``sources=(local, peer)`` (the two ``Measurement``s) gives each verdict the source of the
numbers it rests on, and the one verdict that divides one by the other a ``MIXED`` source naming both.
"""
from __future__ import annotations

from ... import claims
from ...bandwidth import AlphaBeta, format_size

PEER, BACK, H2D, PAGEABLE = "cuda:0 -> cuda:1", "cuda:1 -> cuda:0", "H2D pinned", "H2D pageable"
PREDICTED_SIZE = 256 * 2**20   # the size the exercise predicts from the fit

# Thresholds (the notebook's markdown says why each is where it is).
ORDER_OF_MAGNITUDE = 10.0   # "one to two orders of magnitude slower" starts at 10x
MOST_OF_DATA_RATE = 0.8     # a copy within 20% of the payload ceiling: nothing else stands in the way
FIT_TOLERANCE = 0.25        # one alpha and one beta describe every size within 25%
PINNED_GAIN = 1.5           # the bounce buffer costs at least a third of the bandwidth
SAME_BOTH_WAYS = 0.10       # the two directions within 10% of each other
PREDICTION_TOLERANCE = 0.10


def _at_largest(data: dict, kind: str) -> float:
    return data["gbps"][kind][-1]


def topology_verdicts(peer: dict) -> list[claims.Verdict]:
    """What joins the GPUs, from the topology stored with the GPU-to-GPU sweep (none if the recording
    predates it, or NVML could not say what the links end at)."""
    topo = peer.get("topology") or {}
    remote = topo.get("nvlink_remote") or {}
    if not remote:
        return []
    links = sum(remote.values())
    ends = ", ".join(f"{n} to {kind}" for kind, n in remote.items())
    return [claims.compare(f"{topo.get('link') or 'NV#'} means GPU 0's NVLinks run directly to GPU 1",
                           remote.get("GPU", 0), ">=", links,
                           figure=f"GPU 0's {links} active NVLinks end at: {ends} (NVML)")]


def _sourced(verdicts: list[claims.Verdict], source) -> list[claims.Verdict]:
    return verdicts if source is None else claims.sourced(verdicts, source)


def copy_verdicts(local: dict, peer: dict, sources: tuple | None = None) -> list[claims.Verdict]:
    """The copies' verdicts; with ``sources=(local_measurement, peer_measurement)`` each carries its source."""
    local_src, peer_src = sources or (None, None)
    both = None if sources is None else {"GPU0 -> GPU1": peer_src, "host -> GPU": local_src}
    big = format_size(peer["size_bytes"][-1])
    p2p, h2d = _at_largest(peer, PEER), _at_largest(local, H2D)
    fit = AlphaBeta(**peer["fits"][PEER])
    out = [claims.at_least(
        "a copy over PCIe (host -> GPU, pinned) is one to two orders of magnitude slower than GPU -> GPU over NVLink",
        p2p / h2d, ORDER_OF_MAGNITUDE,
        figure=f"at {big}: GPU0 -> GPU1 {p2p:.0f} GB/s, host -> GPU {h2d:.0f} GB/s: {p2p / h2d:.1f}x")]
    out = _sourced(out, both)
    data_peak = (peer.get("topology") or {}).get("link_data_peak_gbps")
    line_peak = (peer.get("topology") or {}).get("link_peak_gbps")
    if data_peak:
        line = f", {p2p / line_peak:.0%} of the {line_peak:.0f} GB/s line rate" if line_peak else ""
        out.append(claims.at_least(
            "a GPU -> GPU copy reaches most of NVLink's data rate (datasheet, per direction)",
            p2p / data_peak, MOST_OF_DATA_RATE,
            figure=f"at {big}: {p2p:.0f} GB/s = {p2p / data_peak:.0%} of the {data_peak:.0f} GB/s data rate{line}"))
    out.append(claims.at_most(
        "t = alpha + S / beta describes a GPU -> GPU copy at every size measured", fit.max_rel_err, FIT_TOLERANCE,
        figure=f"{fit}; n1/2 = {format_size(fit.half_bw_bytes)}; largest deviation {fit.max_rel_err:.0%} "
               f"over {len(peer['size_bytes'])} sizes"))
    pageable = _at_largest(local, PAGEABLE)
    out += _sourced([claims.at_least(
        "pinned host memory copies faster than pageable memory (no bounce buffer)", h2d / pageable, PINNED_GAIN,
        figure=f"host -> GPU at {big}: pinned {h2d:.0f} GB/s, pageable {pageable:.0f} GB/s: {h2d / pageable:.1f}x")],
        local_src)
    back = _at_largest(peer, BACK)
    out.append(claims.within(
        "both directions of the GPU pair copy equally fast", back, p2p, SAME_BOTH_WAYS,
        figure=f"at {big}: GPU0 -> GPU1 {p2p:.0f} GB/s, GPU1 -> GPU0 {back:.0f} GB/s"))
    if PREDICTED_SIZE in peer["size_bytes"]:
        measured = peer["time_ms"][PEER][peer["size_bytes"].index(PREDICTED_SIZE)]
        predicted = fit.predict_ms(PREDICTED_SIZE)
        out.append(claims.within(
            f"the fit predicts a {format_size(PREDICTED_SIZE)} GPU -> GPU copy", predicted, measured,
            PREDICTION_TOLERANCE, figure=f"predicted {predicted:.3f} ms, measured {measured:.3f} ms"))
    return _sourced(out, peer_src)   # the rest rest on the GPU-to-GPU sweep alone


def all_verdicts(local: dict, peer: dict, sources: tuple | None = None) -> list[claims.Verdict]:
    """Every verdict of the lab: what joins the GPUs (stored with the GPU-to-GPU sweep), then the copies."""
    return _sourced(topology_verdicts(peer), sources and sources[1]) + copy_verdicts(local, peer, sources)


CLAIMS = {("00_copy_local", "00_copy_bandwidth"): all_verdicts}
