"""The verdicts of the one-GPU tracks of labs 03, 05, 06 and 09, on made-up data that sits on each side of their
rules (the recorded data is judged by tests/test_claims.py), and the pure parts of lab 03's stream harness."""
from __future__ import annotations

import copy

import pytest

from labutils import claims
from labutils.labs.lab03_async_p2p import streams
from labutils.labs.lab03_async_p2p.claims import CLAIMS as C03
from labutils.labs.lab05_debugging.claims import CLAIMS as C05, DUPLICATE_GPU
from labutils.labs.lab06_capstone.claims import CLAIMS as C06
from labutils.labs.lab09_all_to_all.claims import CLAIMS as C09


def _words(verdicts) -> list[str]:
    return [v.verdict for v in verdicts]


STREAMS = {"size_bytes": 1 << 28, "cases": [
    {"compute": "matmul", "transfer": "host -> GPU copy_", "k": 8, "compute_ms": 5.0, "comm_ms": 5.0,
     "serial_ms": 10.0, "overlapped_ms": 5.5, "efficiency": 0.9},
    {"compute": "matmul", "transfer": "GPU -> host copy_", "k": 8, "compute_ms": 5.0, "comm_ms": 5.0,
     "serial_ms": 10.0, "overlapped_ms": 9.0, "efficiency": 0.2}],
    "race": {"delay_ms": 20.0, "trials": 3, "unsynced_delayed": 1.0, "fixed_delayed": 0.0, "unsynced": 0.4,
             "fixed": 0.0}}


def test_lab03_one_gpu_verdicts_follow_efficiency_and_the_race():
    assert _words(C03["03_one_gpu_streams"](STREAMS)) == ["TRUE", "PARTLY", "TRUE", "TRUE"]
    broken = copy.deepcopy(STREAMS)
    broken["race"].update(unsynced_delayed=0.0, fixed=0.001)   # no race shown; the fix let one element through
    assert _words(C03["03_one_gpu_streams"](broken))[2:] == ["FALSE", "FALSE"]


def test_lab03_repeats_match_the_transfer_and_stay_bounded():
    assert streams.repeats_to_match(0.2, 5.0) == 25
    assert streams.repeats_to_match(10.0, 1.0) == 1
    assert streams.repeats_to_match(1e-6, 5.0) == streams.MAX_REPEATS
    assert streams.repeats_to_match(0.0, 5.0) == 1


ERROR = {"outcome": "error", "seconds": 5.0, "message": f"rank 1 raised DistBackendError: ... {DUPLICATE_GPU} : "
         "rank 1 and rank 0 both on CUDA device 1a000", "nccl_warn": [], "leftover_ranks": 0}


def test_lab05_two_ranks_on_one_gpu_verdicts():
    assert _words(C05["05_two_ranks_one_gpu"](ERROR)) == ["TRUE", "TRUE", "TRUE"]
    hang = dict(ERROR, outcome="hang", message="ranks [0, 1] did not finish within 9 s", leftover_ranks=2)
    assert _words(C05["05_two_ranks_one_gpu"](hang)) == ["FALSE", "FALSE", "FALSE"]
    warned = dict(ERROR, message="rank 0 raised DistBackendError: invalid usage",
                  nccl_warn=[f"[rank 0] h:1:1 [0] init.cc:1 NCCL WARN {DUPLICATE_GPU} : rank 0 and rank 1"])
    assert _words(C05["05_two_ranks_one_gpu"](warned))[1] == "TRUE"     # NCCL's WARN line counts too


ONE_RANK_LOG = "\n".join([
    "[rank 0] h:1:1 [0] NCCL INFO NCCL version 2.28.3+cuda13.0",
    "[rank 0] h:1:1 [0] NCCL INFO comm 0x5555 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 MNNVL 0"])


def test_lab05_one_rank_log_verdicts():
    good = {"log": ONE_RANK_LOG, "error": "", "results": [1.0]}
    assert _words(C05["05_nccl_one_rank"](good)) == ["TRUE", "TRUE"]
    failed = {"log": "", "error": "RankError: rank 0 raised ...", "results": []}
    assert _words(C05["05_nccl_one_rank"](failed)) == ["FALSE", "FALSE"]


LAUNCH = {"kernel": "x.add_(1.0) on 2 float32", "calls": 100, "correct": True, "eager_us": 6.0, "host_us": 5.5,
          "device_us": 1.2, "graph_us": 1.5}


def test_lab06_one_gpu_launch_verdicts():
    assert _words(C06["06_one_gpu_launch"](LAUNCH)) == ["TRUE", "TRUE", "TRUE"]   # correctness: printed beside
    device_bound = dict(LAUNCH, eager_us=10.0, host_us=3.0, device_us=9.5, graph_us=9.0, correct=False)
    assert _words(C06["06_one_gpu_launch"](device_bound)) == ["FALSE", "FALSE", "FALSE"]


@pytest.mark.parametrize("share", [0.2504, 0.2496])
def test_lab06_device_share_printed_on_the_side_of_its_verdict(share):
    v = C06["06_one_gpu_launch"](dict(LAUNCH, eager_us=10.0, device_us=10.0 * share))[0]
    printed = float(v.figure.split("= ")[1].split("%")[0]) / 100
    assert (printed <= 0.25) == (v.verdict == claims.TRUE)


def test_lab09_one_rank_verdicts():
    data = {"tokens": [512, 8192], "time_ms": {"TP": [1.0, 10.0], "SP": [1.0, 10.0], "DTensor TP": [2.0, 10.5],
                                                  "DTensor SP": [1.05, 12.0]}}
    assert _words(C09["09_dtensor_one_rank"](data)) == ["TRUE", "TRUE", "FALSE", "FALSE"]


def test_lab09_cpu_floor_of_dtensor_sp_against_the_multi_gpu_step():
    many = {"world_size": 2, "tokens": [512, 8192], "time_ms": {"SP": [2.7, 6.0]}}
    one = {"tokens": [512, 8192], "time_ms": {"DTensor SP": [7.4, 10.5]}}
    fn = C09[("09_dtensor", "09_dtensor_one_rank")]
    assert _words(fn(many, one)) == ["TRUE"]
    assert _words(fn(many, dict(one, time_ms={"DTensor SP": [5.0, 10.5]}))) == ["FALSE"]
