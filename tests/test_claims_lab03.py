"""Lab 03's verdicts whose rule judges a claim on every point measured for it: each must come out TRUE on data
where every point holds and FALSE where one point fails -- from the lab's recordings, and from the recordings
changed at one point. (test_claims.py checks that the notebook prints what the recordings give.)

Run: pytest tests/test_claims_lab03.py -q     (a second; no ranks)
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from labutils import claims
from labutils.labs.lab03_async_p2p import claims as lab
from labutils.labs.lab03_async_p2p.overlap import PEER_COPY, PEER_COPY_ONE, PEER_MEMCPY

RECORDED = Path(__file__).resolve().parent.parent / "notebooks" / "recorded"


def _data(name: str) -> dict:
    return json.loads((RECORDED / f"{name}.json").read_text())["data"]


def _verdict(verdicts, start: str) -> claims.Verdict:
    found = [v for v in verdicts if v.claim.startswith(start)]
    assert len(found) == 1, [v.claim for v in verdicts]
    return found[0]


def _case(compute: str, transfer: str, e: float) -> dict:
    return {"compute": compute, "transfer": transfer, "k": 3, "efficiency": e}


# ---- the source's claim (isend/irecv keep the GPU computing): every compute measured, the worst decides ----
SOURCE = "isend/irecv: while the data moves"


@pytest.mark.parametrize("matmul, memory_bound, word", [
    (0.95, 0.85, "TRUE"),       # hidden beside both kinds of compute
    (0.95, 0.16, "PARTLY"),     # hidden beside a matmul, not beside a memory-bound kernel: the worst decides
    (0.95, 0.05, "FALSE"),      # no real gain beside one of them
    (0.10, 0.95, "PARTLY"),     # whichever compute is the worst
])
def test_the_sources_overlap_claim_is_judged_beside_every_compute(matmul, memory_bound, word):
    data = {"cases": [_case("matmul (bf16, 4096^3)", "send/recv (NCCL)", matmul),
                      _case("memory-bound (256 MiB x *= 1)", "send/recv (NCCL)", memory_bound)]}
    v = _verdict(lab.overlap_verdicts(data), SOURCE)
    assert v.verdict == word
    assert f"worst E = {min(matmul, memory_bound):+.2f}" in v.figure and "all: matmul" in v.figure
    assert "memory-bound" in v.figure.split("all:")[1]


def test_the_recorded_overlap_makes_the_sources_claim_partly_true_on_its_worst_compute():
    v = _verdict(lab.overlap_verdicts(_data("03_overlap")), SOURCE)
    assert v.verdict == "PARTLY" and "memory-bound" in v.figure.split(";")[0]   # matmul alone would say PARTLY too


# ---- next to a memory-bound kernel: every copy-engine case against every NCCL case --------------------------
VERSUS = "next to a memory-bound kernel a copy-engine copy hides more"


def _memory_bound(copies: dict, nccl: dict) -> dict:
    mem = "memory-bound (256 MiB x *= 1)"
    return {"cases": [_case(mem, t, e) for t, e in {**copies, **nccl}.items()]
            + [_case("matmul (bf16, 4096^3)", PEER_COPY, -0.5)]}   # a matmul row: not part of this claim


def test_copy_engine_against_nccl_beside_a_memory_bound_kernel_true_on_the_recording():
    v = _verdict(lab.overlap_verdicts(_data("03_overlap")), VERSUS)
    assert v.verdict == "TRUE" and "over 3 copy and 2 NCCL cases" in v.figure


@pytest.mark.parametrize("copies, nccl, word", [
    ({PEER_COPY: 0.78, PEER_COPY_ONE: 1.0, PEER_MEMCPY: 0.82}, {"all_reduce (NCCL)": 0.38, "send/recv (NCCL)": 0.16},
     "TRUE"),
    # one copy case no better than the best NCCL case: "competes like NCCL does" -> FALSE
    ({PEER_COPY: 0.40, PEER_COPY_ONE: 1.0, PEER_MEMCPY: 0.82}, {"all_reduce (NCCL)": 0.38, "send/recv (NCCL)": 0.16},
     "FALSE"),
    # one NCCL case as good as the copies
    ({PEER_COPY: 0.78, PEER_COPY_ONE: 1.0, PEER_MEMCPY: 0.82}, {"all_reduce (NCCL)": 0.75, "send/recv (NCCL)": 0.16},
     "FALSE"),
])
def test_copy_engine_against_nccl_judges_every_pair(copies, nccl, word):
    v = _verdict(lab.overlap_verdicts(_memory_bound(copies, nccl)), VERSUS)
    assert v.verdict == word
    low, high = min(copies.values()), max(nccl.values())
    assert f"= {low - high:+.2f}" in v.figure


def test_copy_engine_against_nccl_needs_both_kinds():
    assert not [v for v in lab.overlap_verdicts(_memory_bound({}, {"all_reduce (NCCL)": 0.4})) if
                v.claim.startswith(VERSUS)]
    gloo = {"cases": [_case("memory-bound", "all_reduce (gloo)", 0.2), _case("matmul", "send/recv (gloo)", 0.2)]}
    assert not [v for v in lab.overlap_verdicts(gloo) if v.claim.startswith(VERSUS)]


# ---- the ring against NCCL: each claim on every size of its class ---------------------------------------------
def test_ring_verdicts_on_the_recording_judge_every_size_of_their_class():
    d = _data("03_ring_vs_nccl")
    small, large, library = lab.ring_verdicts(d)
    assert [small.verdict, large.verdict, library.verdict] == ["TRUE", "TRUE", "TRUE"]
    assert "all: 1 MiB" in small.figure and "4 MiB" in small.figure and "16 MiB" not in small.figure
    assert "all: 64 MiB" in large.figure and "256 MiB" in large.figure and "16 MiB" not in large.figure
    assert all(f"{s} MiB" in library.figure for s in (1, 4, 16, 64, 256))


def _changed(d: dict, key: str, size_bytes: int, factor: float) -> dict:
    d = copy.deepcopy(d)
    i = d["size_bytes"].index(size_bytes)
    d[key][i] *= factor
    return d


@pytest.mark.parametrize("key, size_bytes, factor, which", [
    ("ring_ms", 4 << 20, 0.4, 0),                 # the ring nearly as fast as NCCL at 4 MiB: "small" fails there
    ("ring_busbw_gbps", 64 << 20, 0.85, 1),       # 64 MiB at 0.79 of NCCL's busbw: "large" fails there
    ("host_busbw_gbps", 256 << 20, 400.0, 2),     # the host path close to NCCL at one size: the source's tip fails
])
def test_ring_verdicts_fail_where_one_point_of_their_class_fails(key, size_bytes, factor, which):
    d = _data("03_ring_vs_nccl")
    before = lab.ring_verdicts(d)[which]
    after = lab.ring_verdicts(_changed(d, key, size_bytes, factor))[which]
    assert before.verdict == "TRUE" and after.verdict == "FALSE", after
    assert f"at {size_bytes >> 20} MiB" in after.figure.split(";")[0]   # the worst point is named


def test_a_point_outside_a_class_does_not_decide_it():
    d = _data("03_ring_vs_nccl")
    changed = _changed(_changed(d, "ring_ms", 16 << 20, 0.1), "ring_busbw_gbps", 16 << 20, 0.1)
    assert [v.verdict for v in lab.ring_verdicts(changed)[:2]] == ["TRUE", "TRUE"]   # 16 MiB: in neither class
