"""Lab 03 on real GPUs (NCCL): the fixes and the rings against NCCL's collectives, the source's
defects (CPU tensors, the deadlock under a short timeout with nothing left behind), what wait()
guarantees, and the overlap / ring-bandwidth code paths (structure only, no timing asserts).
Skipped without 2 GPUs.

Run: pytest tests/gpu/test_p2p_gpu.py -q     (>= 2 GPUs; about 1.5 min, mostly rank start-up)
"""
from __future__ import annotations

import sys
import time

import cloudpickle
import pytest

import labutils
from labutils import procs
from labutils.labs.lab03_async_p2p import exchange, hang, measure, overlap, wait
from labutils.checks import lab03 as check

from conftest import needs_gpus  # tests/conftest.py (pytest puts tests/ on sys.path)
import test_p2p  # the gloo tests' rank functions, reused here on NCCL

pytestmark = pytest.mark.gpu
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@needs_gpus(2)
def test_fixes_and_rings_equal_nccl_collectives(no_leaks):
    res = labutils.launch(test_p2p._rings_and_fixes, backend="nccl", world_size=2, output="quiet")
    assert all(line.endswith("every rank: True") for line in exchange.report_fixes([r["fixes"] for r in res]))
    for r in res:
        assert all(r["all_gather"]) and all(r["all_reduce"]) and r["errors"] == [True, True, True]


@needs_gpus(2)
def test_source_as_written_fails_on_nccl_with_cpu_tensors(no_leaks):
    out = hang.try_launch(exchange.source_as_written, backend="nccl", world_size=2, timeout=90, output="quiet")
    assert out["status"] == "RankError", out
    assert out["exc_type"] == "RuntimeError" and "cpu" in out["message"].lower()


@needs_gpus(2)
def test_source_order_on_nccl_is_stopped_at_the_timeout(no_leaks):
    timeout = 20.0
    t0 = time.monotonic()
    out = hang.hang_demo(timeout_s=timeout, inits=("eager",))["eager"]
    assert time.monotonic() - t0 < timeout + 8  # + diagnostics and the kill, never a freeze
    assert procs.leftover_ranks() == []
    assert all(s and s[0]["step"] == "start" for s in out["steps"].values()), out  # reached the exchange
    verdict = hang.hang_verdict(out)
    assert verdict.startswith({"RankTimeout": "eager init: HANG", "RankError": "eager init: CRASH",
                               "completed": "eager init: COMPLETED"}[out["status"]]), verdict


@needs_gpus(2)
def test_wait_orders_the_stream_not_the_host(no_leaks):
    d = labutils.launch(wait.wait_semantics_nccl, backend="nccl", world_size=2, output="quiet")[1]
    assert d["wait_ms"] < d["sync_ms"]  # the host left wait() before the data was there
    assert d["early_read_stale"] and d["after_wait_ok"]
    # d["other_stream_stale"] is a race (the data may already be there when the side stream
    # runs), so it is reported by the lab, not asserted.
    assert 0.0 <= d["send_race_fraction"] <= 1.0


@needs_gpus(2)
def test_overlap_experiment_structure_on_gpus(no_leaks):
    data = labutils.launch(overlap.overlap_experiment, 16 << 20, 1, 3, backend="nccl", output="quiet")[0]
    transfers = {c["transfer"] for c in data["cases"]}
    assert transfers == {"all_reduce (NCCL)", "send/recv (NCCL)", "peer copy (copy engine)"}
    for c in data["cases"]:
        assert c["compute_ms"] > 0 and c["comm_ms"] > 0 and c["overlapped_ms"] > 0
        assert c["efficiency"] == pytest.approx(overlap.overlap_efficiency(c["compute_ms"], c["comm_ms"], c["overlapped_ms"]))
        assert len(c["spans"]) == 4 and all(0 <= s["start_ms"] <= s["end_ms"] for s in c["spans"])


@needs_gpus(2)
def test_ring_vs_nccl_and_checker_on_gpus(capsys, no_leaks):
    fn = check.ring_all_gather(test_p2p._stub, backend="nccl", world_size=2)
    assert "✓ ring all-gather (reference solution)" in capsys.readouterr().out
    d = labutils.launch(measure.ring_vs_collective, fn, [1 << 20, 16 << 20], backend="nccl", world_size=2,
                        output="quiet")[0]
    assert d["ring_correct"] and all(v > 0 for v in d["ring_busbw_gbps"] + d["collective_busbw_gbps"])
    assert check.ring_all_reduce(test_p2p._my_ring_all_reduce, backend="nccl") is test_p2p._my_ring_all_reduce
