"""Lab 00's verdicts, each from the copy sweeps through a written threshold (see ``labutils.claims``).

``CLAIMS`` maps the recordings ``00_copy_local`` (host<->GPU, on one GPU) and ``00_copy_bandwidth``
(GPU to GPU, with the topology of the machine that measured it) to ``copy_verdicts``, and
``00_copy_bidirectional`` (both directions of the GPU pair at once) to ``duplex_verdicts``; the notebook
prints their lines and ``tests/test_claims.py`` re-derives them from ``notebooks/recorded/00_*.json``.

The host<->GPU sweep needs one GPU and the GPU-to-GPU one two, so on one GPU the first is live and the
second recorded: ``sources=(local, peer)`` (the two ``Measurement``s) gives each verdict the source of the
numbers it rests on, and the one verdict that divides one by the other a ``MIXED`` source naming both.

One rule for one kind of claim. A claim about a link's *bandwidth* is judged at every size where the
copies are bandwidth-bound by their own fit -- ``S >= BANDWIDTH_BOUND x n1/2``, where the model puts at
least 8/9 of the time in S / beta -- and a claim stated without a size (the two directions agree) at every
size measured.
"""
from __future__ import annotations

from ... import claims, recorded
from ...bandwidth import AlphaBeta, fit_alpha_beta, format_size

PEER, BACK, H2D, PAGEABLE = "cuda:0 -> cuda:1", "cuda:1 -> cuda:0", "H2D pinned", "H2D pageable"
BOTH = "both at once"
PREDICTED_SIZE = 256 * 2**20   # the size the fit on the other sizes predicts

# Thresholds (the notebook's markdown says why each is where it is).
ORDER_OF_MAGNITUDE = 10.0   # "one to two orders of magnitude slower" starts at 10x
MOST_OF_DATA_RATE = 0.8     # a copy within 20% of the payload ceiling: nothing else stands in the way
FIT_TOLERANCE = 0.25        # one alpha and one beta describe every size within 25%
PINNED_GAIN = 1.5           # the bounce buffer costs at least a third of the bandwidth
SAME_BOTH_WAYS = 0.10       # the two directions within 10% of each other (run-to-run noise)
FULL_DUPLEX = 0.9           # both at once, each direction keeps 90% of its one-way speed
PREDICTION_TOLERANCE = 0.10
BANDWIDTH_BOUND = 8.0       # S >= 8 n1/2: alpha is at most 1/9 of the modelled time


def bandwidth_bound(data: dict, kinds) -> list[int]:
    """The sizes of ``data`` at which every copy of ``kinds`` is bandwidth-bound by its own fit."""
    n_half = max(AlphaBeta(**data["fits"][k]).half_bw_bytes for k in kinds)
    return [s for s in data["size_bytes"] if s >= BANDWIDTH_BOUND * n_half]


def _at(data: dict, kind: str, size: int, key: str = "gbps") -> float:
    return data[key][kind][data["size_bytes"].index(size)]


def _sourced(verdicts: list[claims.Verdict], source) -> list[claims.Verdict]:
    return verdicts if source is None else claims.sourced(verdicts, source)


def held_out_fit(data: dict, kind: str, size: int) -> AlphaBeta:
    """The alpha-beta fit of ``kind`` on every size but ``size`` (which it then predicts)."""
    pts = [(s, t) for s, t in zip(data["size_bytes"], data["time_ms"][kind]) if s != size]
    return fit_alpha_beta([s for s, _ in pts], [t for _, t in pts])


def copy_verdicts(local: dict, peer: dict, sources: tuple | None = None) -> list[claims.Verdict]:
    """The copies' verdicts; with ``sources=(local_measurement, peer_measurement)`` each carries its source."""
    local_src, peer_src = sources or (None, None)
    both = None if sources is None else {"GPU0 -> GPU1": peer_src, "host -> GPU": local_src}
    fit = AlphaBeta(**peer["fits"][PEER])
    # both sweeps measure the same sizes; bandwidth-bound for both copies
    sizes = [s for s in bandwidth_bound(peer, [PEER]) if s in bandwidth_bound(local, [H2D])]
    out = []
    if sizes:
        out = _sourced([claims.every(
            "a copy over PCIe (host -> GPU, pinned) is one to two orders of magnitude slower than GPU -> GPU "
            "over NVLink, wherever both are bandwidth-bound",
            {format_size(s): _at(peer, PEER, s) / _at(local, H2D, s) for s in sizes}, ">=", ORDER_OF_MAGNITUDE,
            unit="x")], both)
    data_peak = (peer.get("topology") or {}).get("link_data_peak_gbps")
    line_peak = (peer.get("topology") or {}).get("link_peak_gbps")
    if data_peak:
        best = max(peer["gbps"][PEER])
        at = format_size(peer["size_bytes"][peer["gbps"][PEER].index(best)])
        line = f", {best / line_peak:.0%} of the {line_peak:.0f} GB/s line rate" if line_peak else ""
        out.append(claims.at_least(
            "a GPU -> GPU copy reaches most of NVLink's data rate (datasheet, per direction)",
            best / data_peak, MOST_OF_DATA_RATE,
            figure=f"best size {at}: {best:.0f} GB/s = {best / data_peak:.0%} of the {data_peak:.0f} GB/s "
                   f"data rate{line}"))
    out.append(claims.at_most(
        "t = alpha + S / beta describes a GPU -> GPU copy at every size measured", fit.max_rel_err, FIT_TOLERANCE,
        figure=f"{fit}; n1/2 = {format_size(fit.half_bw_bytes)}; largest deviation {fit.max_rel_err:.0%} "
               f"over {len(peer['size_bytes'])} sizes"))
    pinned_sizes = bandwidth_bound(local, [H2D])
    if pinned_sizes:
        out += _sourced([claims.every(
            "pinned host memory copies faster than pageable memory (no bounce buffer), wherever the pinned "
            "copy is bandwidth-bound",
            {format_size(s): _at(local, H2D, s) / _at(local, PAGEABLE, s) for s in pinned_sizes}, ">=",
            PINNED_GAIN, unit="x")], local_src)
    out.append(claims.every(
        "the two directions of the GPU pair, each copied alone, are equally fast (a symmetric link; relative "
        "difference of their bandwidths)",
        {format_size(s): abs(b / a - 1) for s, a, b in zip(peer["size_bytes"], peer["gbps"][PEER],
                                                           peer["gbps"][BACK])},
        "<=", SAME_BOTH_WAYS, unit="", digits=2))
    if PREDICTED_SIZE in peer["size_bytes"] and len(peer["size_bytes"]) > 2:
        measured = _at(peer, PEER, PREDICTED_SIZE, "time_ms")
        held = held_out_fit(peer, PEER, PREDICTED_SIZE)
        predicted = held.predict_ms(PREDICTED_SIZE)
        out.append(claims.within(
            f"a fit on the other sizes predicts the {format_size(PREDICTED_SIZE)} GPU -> GPU copy", predicted,
            measured, PREDICTION_TOLERANCE,
            figure=f"{held} (without {format_size(PREDICTED_SIZE)}): predicted {predicted:.3f} ms, "
                   f"measured {measured:.3f} ms"))
    return _sourced(out, peer_src)   # the rest rest on the GPU-to-GPU sweep alone


def all_verdicts(local: dict, peer: dict, sources: tuple | None = None) -> list[claims.Verdict]:
    """Every verdict of the copy sweeps (kept under this name for the summary)."""
    return copy_verdicts(local, peer, sources)


def duplex_verdicts(bidir: dict) -> list[claims.Verdict]:
    """Full duplex, from ``measure.measure_bidirectional``: with both directions copying at once, each
    keeps its one-way speed, at every size where the one-way copies are bandwidth-bound (their own fit)."""
    fits = {k: fit_alpha_beta(bidir["size_bytes"], bidir["time_ms"][k]) for k in (PEER, BACK)}
    n_half = max(f.half_bw_bytes for f in fits.values())
    sizes = [s for s in bidir["size_bytes"] if s >= BANDWIDTH_BOUND * n_half]
    if not sizes:
        return []
    # per size: the slower one-way time over the time of a pair of copies, one each way, at once
    ratio = {format_size(s): max(_at(bidir, PEER, s, "time_ms"), _at(bidir, BACK, s, "time_ms"))
             / _at(bidir, BOTH, s, "time_ms") for s in sizes}
    return [claims.every("NVLink is full duplex: copying both ways at once, each direction keeps its one-way "
                         "speed (one-way time / two-way time)", ratio, ">=", FULL_DUPLEX, unit="x", digits=2)]


CLAIMS = {("00_copy_local", "00_copy_bandwidth"): all_verdicts}
# Measurements shown with recorded.live_or_none: judged in CLAIMS once a 2-GPU run has recorded them.
AWAITING_RECORDING = {"00_copy_bidirectional": duplex_verdicts}
CLAIMS.update(recorded.awaiting(AWAITING_RECORDING))
