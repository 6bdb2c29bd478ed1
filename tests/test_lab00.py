"""Lab 00 (setup) on the CPU: the topology record and its table, and every verdict on both sides of its
threshold (synthetic sweeps shaped like the recordings).

Run: pytest tests/test_lab00.py -q -p no:nbval     (under a second)
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from labutils import bandwidth, hw
from labutils.labs.lab00_setup import claims as lab_claims
from labutils.labs.lab00_setup import measure

SIZES = [2**k for k in range(12, 31, 2)]
REC_DIR = Path(__file__).resolve().parent.parent / "notebooks" / "recorded"


def _sweep(kinds: dict) -> dict:
    """A sweep as ``measure.sweep`` returns it, with exact alpha-beta times: kind -> (alpha_us, beta_gbps)."""
    out = {"size_bytes": SIZES, "time_ms": {}, "gbps": {}, "fits": {}}
    for kind, (a, b) in kinds.items():
        fit = bandwidth.AlphaBeta(a, b, 0.0)
        out["time_ms"][kind] = [fit.predict_ms(s) for s in SIZES]
        out["gbps"][kind] = [fit.predict_gbps(s) for s in SIZES]
        f = bandwidth.fit_alpha_beta(SIZES, out["time_ms"][kind])
        out["fits"][kind] = {"alpha_us": f.alpha_us, "beta_gbps": f.beta_gbps, "max_rel_err": f.max_rel_err}
    return out


def _data(h2d_gbps=55.0, pageable_gbps=20.0, p2p_gbps=400.0, back_gbps=400.0, topology=None):
    local = _sweep({"H2D pinned": (12.0, h2d_gbps), "H2D pageable": (17.0, pageable_gbps),
                    "D2H pinned": (14.0, 58.0), "D2D (cuda:0)": (14.0, 2500.0)})
    peer = _sweep({"cuda:0 -> cuda:1": (21.0, p2p_gbps), "cuda:1 -> cuda:0": (21.0, back_gbps)})
    if topology is not None:
        peer["topology"] = topology
    return local, peer


def _verdicts(local, peer) -> dict:
    return {v.claim: v.verdict for v in lab_claims.all_verdicts(local, peer)}


def _one(verdicts: dict, words: str) -> str:
    found = [v for c, v in verdicts.items() if words in c]
    assert len(found) == 1, (words, list(verdicts))
    return found[0]


def _info(**kw) -> hw.HardwareInfo:
    nvlink = hw.parse_nvlink_speeds("GPU 0: H200\n" + "".join(f"\t Link {i}: 26.562 GB/s\n" for i in range(18)))
    base = dict(mode="multi-gpu", gpus=[hw.GPU(0, "H200", 140.0), hw.GPU(1, "H200", 140.0)],
                links={(0, 1): "NV18", (1, 0): "NV18"}, peer_access={(0, 1): True, (1, 0): True},
                nvlink_gbps=nvlink, pcie={0: (5, 16)}, torch_version="2.11", cuda_version="13.0",
                nccl_version="2.28.9", driver_version="580", python_version="3.12", cpu_count=32,
                nvlinks={0: hw.summarize_nvlinks([(2, 6)] * 18)})
    base.update(kw)
    return hw.HardwareInfo(**base)


# ---- topology ---------------------------------------------------------------------------------------
def test_topology_records_both_peaks_and_the_remote_ends():
    topo = measure.topology(_info())
    assert json.loads(json.dumps(topo)) == topo
    assert topo["link"] == "NV18" and topo["nvlinks"] == 18 and topo["nvlink_remote"] == {"NVSwitch": 18}
    assert topo["link_peak_gbps"] == 478.1 and topo["link_data_peak_gbps"] == 450.0
    assert topo["nvlink_version"] == "4.0" and topo["pcie_peak_gbps"] == 63.0
    rows = measure.topology_rows(topo)
    assert rows["where they end (NVML)"] == "18 to NVSwitch"
    assert rows["NVLink data rate"].startswith("450 GB/s per direction")


def test_topology_without_gpus_nvml_or_nvlink_says_unknown():
    topo = measure.topology(_info(gpus=[], links={}, peer_access={}, nvlink_gbps={}, pcie={}, nvlinks={}))
    assert topo["link"] is None and topo["nvlinks"] is None and topo["nvlink_remote"] == {}
    rows = measure.topology_rows(topo)
    assert rows["nvidia-smi topo -m, GPU0-GPU1"] == "no GPU pair"
    assert rows["where they end (NVML)"].startswith("unknown") and rows["NVLink line rate"] == "unknown"


# ---- verdicts on both sides of their thresholds -----------------------------------------------------
def test_orders_of_magnitude_claim():
    assert _one(_verdicts(*_data(h2d_gbps=55.0)), "orders of magnitude") == "FALSE"   # 7x
    assert _one(_verdicts(*_data(h2d_gbps=30.0)), "orders of magnitude") == "TRUE"    # 13x


def test_data_rate_claim_needs_the_topology_and_follows_it():
    assert not any("data rate" in c for c in _verdicts(*_data()))             # an older recording: no line
    topo = {"link_data_peak_gbps": 450.0, "link_peak_gbps": 478.1}
    assert _one(_verdicts(*_data(p2p_gbps=400.0, topology=topo)), "data rate") == "TRUE"    # 0.89
    assert _one(_verdicts(*_data(p2p_gbps=300.0, topology=topo)), "data rate") == "FALSE"   # 0.67


def test_nv18_claim_follows_what_nvml_says_the_links_end_at():
    switch = {"link": "NV18", "nvlink_remote": {"NVSwitch": 18}}
    direct = {"link": "NV4", "nvlink_remote": {"GPU": 4}}
    assert _one(_verdicts(*_data(topology=switch)), "directly") == "FALSE"
    assert _one(_verdicts(*_data(topology=direct)), "directly") == "TRUE"
    assert lab_claims.topology_verdicts({"topology": {"link": "NV18", "nvlink_remote": {}}}) == []


def test_fit_claim():
    local, peer = _data()
    assert _one(_verdicts(local, peer), "describes") == "TRUE"
    peer["fits"]["cuda:0 -> cuda:1"]["max_rel_err"] = 0.4
    assert _one(_verdicts(local, peer), "describes") == "FALSE"


def test_pinned_claim():
    assert _one(_verdicts(*_data(pageable_gbps=20.0)), "pageable") == "TRUE"
    assert _one(_verdicts(*_data(pageable_gbps=50.0)), "pageable") == "FALSE"


def test_both_directions_claim():
    assert _one(_verdicts(*_data(back_gbps=390.0)), "both directions") == "TRUE"
    assert _one(_verdicts(*_data(back_gbps=300.0)), "both directions") == "FALSE"


def test_prediction_claim():
    local, peer = _data()
    assert _one(_verdicts(local, peer), "predicts") == "TRUE"
    i = SIZES.index(lab_claims.PREDICTED_SIZE)
    peer["time_ms"]["cuda:0 -> cuda:1"][i] *= 1.5
    assert _one(_verdicts(local, peer), "predicts") == "FALSE"


@pytest.mark.skipif(not (REC_DIR / "00_copy_bandwidth.json").exists(), reason="no recording yet")
def test_verdicts_of_the_recordings():
    local = json.loads((REC_DIR / "00_copy_local.json").read_text())["data"]
    peer = json.loads((REC_DIR / "00_copy_bandwidth.json").read_text())["data"]
    assert len(lab_claims.all_verdicts(local, peer)) >= 5
