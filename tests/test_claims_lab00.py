"""Lab 00's verdicts, each judged on every point its claim covers, against the recordings where they hold the
data (TRUE or FALSE as recorded) and against the same data changed at one point (the other outcome).

Run: pytest tests/test_claims_lab00.py -q -p no:nbval     (under a second)
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from labutils import bandwidth
from labutils.labs.lab00_setup import claims as lab_claims
from labutils.labs.lab00_setup import measure

REC = Path(__file__).resolve().parent.parent / "notebooks" / "recorded"
pytestmark = pytest.mark.skipif(not (REC / "00_copy_bandwidth.json").exists(), reason="no recording yet")


@pytest.fixture()
def rec():
    local = json.loads((REC / "00_copy_local.json").read_text())["data"]
    peer = json.loads((REC / "00_copy_bandwidth.json").read_text())["data"]
    return local, peer


def _verdict(local, peer, words):
    found = [v for v in lab_claims.all_verdicts(local, peer) if words in v.claim]
    assert len(found) == 1, [v.claim for v in lab_claims.all_verdicts(local, peer)]
    return found[0]


def test_bandwidth_claims_are_judged_where_the_copies_are_bandwidth_bound(rec):
    local, peer = rec
    p2p = bandwidth.AlphaBeta(**peer["fits"][lab_claims.PEER]).half_bw_bytes
    sizes = lab_claims.bandwidth_bound(peer, [lab_claims.PEER])
    assert sizes and all(s >= 8 * p2p for s in sizes) and min(sizes) / 4 < 8 * p2p   # every such size, no other
    v = _verdict(local, peer, "orders of magnitude")
    assert all(bandwidth.format_size(s) in v.figure for s in sizes if s in lab_claims.bandwidth_bound(local, ["H2D pinned"]))


def test_orders_of_magnitude_false_as_recorded_true_with_a_slower_pcie(rec):
    local, peer = rec
    assert _verdict(local, peer, "orders of magnitude").verdict == "FALSE"
    slow = copy.deepcopy(local)
    slow["gbps"]["H2D pinned"] = [g / 2 for g in slow["gbps"]["H2D pinned"]]
    assert _verdict(slow, peer, "orders of magnitude").verdict == "TRUE"
    # one bandwidth-bound size that misses the threshold makes it FALSE
    one = copy.deepcopy(slow)
    one["gbps"]["H2D pinned"][-1] *= 2
    assert _verdict(one, peer, "orders of magnitude").verdict == "FALSE"


def test_pinned_true_as_recorded_false_where_one_bandwidth_bound_size_gains_little(rec):
    local, peer = rec
    assert _verdict(local, peer, "pageable").verdict == "TRUE"
    worse = copy.deepcopy(local)
    i = worse["size_bytes"].index(lab_claims.bandwidth_bound(local, ["H2D pinned"])[0])
    worse["gbps"]["H2D pageable"][i] = worse["gbps"]["H2D pinned"][i] / 1.2
    assert _verdict(worse, peer, "pageable").verdict == "FALSE"


def test_symmetry_true_as_recorded_false_when_one_size_differs(rec):
    local, peer = rec
    v = _verdict(local, peer, "symmetric")
    assert v.verdict == "TRUE" and "4 KiB" in v.figure and "1 GiB" in v.figure   # every size measured
    skew = copy.deepcopy(peer)
    skew["gbps"][lab_claims.BACK][0] *= 0.8      # the smallest size only
    assert _verdict(local, skew, "symmetric").verdict == "FALSE"


def test_held_out_prediction_true_as_recorded_false_when_the_size_left_out_is_off(rec):
    local, peer = rec
    v = _verdict(local, peer, "predicts")
    assert v.verdict == "TRUE" and "without 256 MiB" in v.figure
    off = copy.deepcopy(peer)
    off["time_ms"][lab_claims.PEER][off["size_bytes"].index(lab_claims.PREDICTED_SIZE)] *= 1.3
    assert _verdict(local, off, "predicts").verdict == "FALSE"


def test_data_rate_judged_at_the_best_size(rec):
    local, peer = rec
    v = _verdict(local, peer, "data rate")
    assert v.verdict == "TRUE" and "best size 1 GiB" in v.figure
    low = copy.deepcopy(peer)
    low["gbps"][lab_claims.PEER] = [g * 0.8 for g in low["gbps"][lab_claims.PEER]]
    assert _verdict(local, low, "data rate").verdict == "FALSE"


def _bidir(both_factor: float, at_one: int | None = None) -> dict:
    """A two-way sweep with exact one-way times (alpha 20 us, beta 400 GB/s); both at once takes
    ``both_factor`` x the one-way time (``at_one``: only at that size index, else 1)."""
    sizes = [2**k for k in range(12, 31, 2)]
    one = [bandwidth.AlphaBeta(20.0, 400.0, 0.0).predict_ms(s) for s in sizes]
    both = [t * (both_factor if at_one in (None, i) else 1.0) for i, t in enumerate(one)]
    times = {lab_claims.PEER: one, lab_claims.BACK: list(one), lab_claims.BOTH: both}
    return {"size_bytes": sizes, "time_ms": times, "copies": [measure.copies_for(s) for s in sizes],
            "gbps": {k: [bandwidth.algbw_gbps(s, t) for s, t in zip(sizes, v)] for k, v in times.items()}}


def test_duplex_true_when_both_ways_keep_the_one_way_speed_false_when_they_share_it():
    [v] = lab_claims.duplex_verdicts(_bidir(1.02))
    assert v.verdict == "TRUE" and "full duplex" in v.claim
    assert "4 KiB" not in v.figure and "1 GiB" in v.figure          # judged where bandwidth-bound only
    assert lab_claims.duplex_verdicts(_bidir(2.0))[0].verdict == "FALSE"          # half duplex
    assert lab_claims.duplex_verdicts(_bidir(1.5, at_one=9))[0].verdict == "FALSE"  # one size is enough
    assert lab_claims.duplex_verdicts(_bidir(3.0, at_one=0))[0].verdict == "TRUE"   # 4 KiB is latency-bound


def test_duplex_is_in_claims_only_with_its_recording():
    assert ("00_copy_bidirectional" in lab_claims.CLAIMS) == (REC / "00_copy_bidirectional.json").exists()
