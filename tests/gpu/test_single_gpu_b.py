"""The one-GPU tracks of labs 03, 05, 06 and 09 on a real GPU: each new measurement runs once (smaller where
it can), its data survives a JSON round trip (what a recording stores), and its verdicts are computed from it.
Correctness is asserted; speeds are not (they are the verdicts' business). Skipped without CUDA.

Run: pytest -n 0 tests/gpu/test_single_gpu_b.py -q -s   (one GPU; about a minute, mostly rank start-up;
     -s prints each measurement's verdicts)
"""
from __future__ import annotations

import json
import sys

import cloudpickle
import pytest

from labutils import claims, debugging
from labutils.labs.lab03_async_p2p import streams
from labutils.labs.lab03_async_p2p.claims import CLAIMS as CLAIMS_03
from labutils.labs.lab05_debugging.claims import CLAIMS as CLAIMS_05
from labutils.labs.lab06_capstone.claims import CLAIMS as CLAIMS_06
from labutils.labs.lab09_all_to_all.claims import CLAIMS as CLAIMS_09
from labutils.solutions import lab09 as solution09

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)
from notebook_defs import load_definitions

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

pytestmark = [pytest.mark.gpu, needs_gpus(1)]


def _recorded(data: dict) -> dict:
    """What a recording would hold: JSON types only."""
    return json.loads(json.dumps(data))


def _verdicts(fn, data: dict) -> list:
    verdicts = fn(data)
    assert verdicts and all(isinstance(v, claims.Verdict) for v in verdicts)
    print("\n" + "\n".join(claims.lines(claims.sourced(verdicts, "live on this test's GPU"))))
    return verdicts


def test_lab03_copies_beside_a_matmul_and_the_missing_wait_stream():
    nb = load_definitions("03_async_p2p")
    data = _recorded(nb.one_gpu_overlap(64 << 20))
    data["race"] = _recorded(streams.race_outcome(nb.copy_then_overwrite, delay_ms=20.0, trials=2))
    assert [c["transfer"] for c in data["cases"]] == ["host -> GPU copy_", "GPU -> host copy_"]
    for c in data["cases"]:
        assert c["k"] >= 1
        assert all(c[key] > 0 for key in ("compute_ms", "comm_ms", "serial_ms", "overlapped_ms")), c
    race = data["race"]
    assert race["fixed"] == 0.0 and race["fixed_delayed"] == 0.0, race        # the fix is always right
    assert race["unsynced_delayed"] > 0.5, race    # the side stream busy first: the overwrite wins, every time
    _verdicts(CLAIMS_03["03_one_gpu_streams"], data)


def test_lab03_full_measurement_runs():
    nb = load_definitions("03_async_p2p")
    data = _recorded(nb.one_gpu_streams())
    assert data["size_bytes"] == 256 << 20 and len(data["cases"]) == 2
    _verdicts(CLAIMS_03["03_one_gpu_streams"], data)


def test_lab05_two_ranks_on_one_gpu_fail_and_leave_nothing():
    nb = load_definitions("05_debugging")
    data = _recorded(nb.cause_two_ranks_one_gpu(60, 30))
    print(data)
    assert data["outcome"] == "error", data
    assert data["leftover_ranks"] == 0, data
    verdicts = _verdicts(CLAIMS_05["05_two_ranks_one_gpu"], data)
    assert verdicts[0].verdict == claims.TRUE


def test_lab05_one_rank_nccl_debug_log():
    nb = load_definitions("05_debugging")
    data = _recorded(nb.nccl_debug_log(world_size=1))
    assert not data["error"], data["error"]
    assert data["results"] == [1.0]
    log = debugging.parse_nccl_log(data["log"])
    assert log.version and log.nranks == 1, data["log"][:2000]
    _verdicts(CLAIMS_05["05_nccl_one_rank"], data)


def test_lab06_small_kernel_launch_split_and_graph_replay():
    nb = load_definitions("06_capstone")
    data = _recorded(nb.small_kernel_split(calls=50, repeat=5))
    assert data["correct"] is True
    assert all(data[k] > 0 for k in ("eager_us", "host_us", "device_us", "graph_us")), data
    _verdicts(CLAIMS_06["06_one_gpu_launch"], data)


def test_lab09_dtensor_on_a_one_rank_mesh():
    nb = load_definitions("09_all_to_all_and_sequence_parallel")
    data = _recorded(nb.measure_dtensor_one_rank(solution09.sp_plan, solution09.sync_sp_grads, [512, 2048],
                                                 1024, 4096))
    assert data["world_size"] == 1 and data["tokens"] == [512, 2048]
    assert set(data["time_ms"]) == {"TP", "SP", "DTensor TP", "DTensor SP"}
    assert all(t > 0 for ts in data["time_ms"].values() for t in ts)
    _verdicts(CLAIMS_09["09_dtensor_one_rank"], data)
