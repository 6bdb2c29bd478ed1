"""Lab 00 on real GPUs: the copy sweeps return what the verdicts read, and the topology record has what
the notebook's table shows (NVML's remote ends where nvidia-ml-py is installed). No timing asserts.

Run: pytest tests/gpu/test_lab00_gpu.py -q     (>= 2 GPUs; a few seconds)
"""
from __future__ import annotations

import json

import pytest

from labutils import hw
from labutils.labs.lab00_setup import claims as lab_claims
from labutils.labs.lab00_setup import measure

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)

pytestmark = pytest.mark.gpu
SIZES = [2**k for k in range(12, 27, 2)]   # 4 KiB ... 64 MiB: enough for a fit, quick


@needs_gpus(2)
def test_sweeps_and_topology_feed_every_verdict():
    info = hw.describe()
    local = measure.measure_local(SIZES)
    peer = measure.measure_peer(SIZES, info)
    assert json.loads(json.dumps(peer)) == peer
    assert all(t > 0 for kind in measure.PEER_KINDS for t in peer["time_ms"][kind])
    topo = peer["topology"]
    assert topo["link"] == info.links.get((0, 1)) and topo["peer_access"] == peer["peer_access"]
    if info.nvlinks:                                   # NVML answered: what the links end at is recorded
        assert sum(topo["nvlink_remote"].values()) == info.nvlinks[0]["links"]
    verdicts = lab_claims.all_verdicts(local, peer)
    assert len(verdicts) >= 4 and all(v.verdict in ("TRUE", "FALSE") for v in verdicts)
    assert measure.topology_rows(topo)["nvidia-smi topo -m, GPU0-GPU1"] == (topo["link"] or "no GPU pair")


@needs_gpus(2)
def test_two_way_sweep_feeds_the_duplex_verdict():
    sizes = [2**k for k in range(12, 29, 2)]   # 4 KiB ... 256 MiB
    data = measure.measure_bidirectional(sizes, repeat=3)
    assert json.loads(json.dumps(data)) == data
    assert set(data["time_ms"]) == set(measure.BIDIRECTIONAL_KINDS)
    assert all(t > 0 for kind in measure.BIDIRECTIONAL_KINDS for t in data["time_ms"][kind])
    assert data["copies"] == [measure.copies_for(s) for s in sizes]
    verdicts = lab_claims.duplex_verdicts(data)
    assert len(verdicts) == 1 and verdicts[0].verdict in ("TRUE", "FALSE")
