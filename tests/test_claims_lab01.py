"""Lab 01's verdicts judged at every size or count measured: each on data where it must come out TRUE, on data
where one point alone makes it FALSE, and on the committed recordings."""
import json
import pathlib

from labutils.labs.lab01_cuda_comm import claims as lab_claims

RECORDED = pathlib.Path(__file__).resolve().parents[1] / "notebooks" / "recorded"
t = lambda ms: {"median_ms": ms}  # noqa: E731


def _recording(name):
    return json.loads((RECORDED / f"{name}.json").read_text())["data"]


def _one(verdicts, words):
    found = [v for v in verdicts if words in v.claim]
    assert len(found) == 1, (words, [v.claim for v in verdicts])
    return found[0]


def _many(loop, coalesced, flat=0.05):
    return {"total_bytes": 16 << 20, "counts": [1, 8, 4096], "loop": [t(x) for x in loop],
            "coalesced": [t(x) for x in coalesced], "flat": t(flat)}


def test_coalesced_against_the_loop_at_every_count_above_one():
    ok = lab_claims.many_verdicts(_many([0.05, 0.4, 200.0], [0.05, 0.1, 20.0]))
    assert _one(ok, "faster than a loop").verdict == "TRUE" and _one(ok, "tip 3").verdict == "TRUE"
    # 8 tensors: the loop is only 1.5x the coalesced call -- the claim fails there, however large the gain at 4096
    v = _one(lab_claims.many_verdicts(_many([0.05, 0.15, 200.0], [0.05, 0.1, 20.0])), "faster than a loop")
    assert v.verdict == "FALSE" and "worst 1.5x at k = 8" in v.figure


def test_coalesced_like_flat_at_every_count():
    assert _one(lab_claims.many_verdicts(_many([0.05, 0.4, 200.0], [0.05, 0.06, 0.09])),
                "does the work").verdict == "TRUE"
    v = _one(lab_claims.many_verdicts(_many([0.05, 0.4, 200.0], [0.05, 0.3, 0.09])), "does the work")
    assert v.verdict == "FALSE" and "at k = 8" in v.figure          # the largest count alone would pass


def _redundant(pair_ms, all_ms, out_ms):
    names = ["broadcast to the other GPUs", "broadcast to all GPUs (source included)",
             "broadcast(out=) on the other GPUs", "broadcast(out=) incl. one on the source GPU",
             "reduce_add + broadcast", "nccl.all_reduce"]
    small = [0.03, all_ms[0], 0.03, out_ms[0], pair_ms[0], 0.03]
    big = [0.2, all_ms[1], 0.2, out_ms[1], pair_ms[1], 0.2]
    return {"sizes": [1 << 16, 64 << 20], "cases": {n: [t(a), t(b)] for n, a, b in zip(names, small, big)}}


PROFILE = {"ops": {"comm.broadcast(out=) incl. source GPU": [{"kind": "peer copy", "count": 1}]}}


def test_tip4_verdicts_at_both_sizes():
    v = lab_claims.redundant_verdicts(_redundant((0.09, 0.4), (0.04, 0.3), (0.04, 0.3)), PROFILE)
    assert [_one(v, w).verdict for w in ("tip 4", "listing the source", "makes broadcast(out=) slower")] == [
        "TRUE", "TRUE", "TRUE"]
    # each holds at 64 MiB, but not at 64 KiB: FALSE, naming 64 KiB
    v = lab_claims.redundant_verdicts(_redundant((0.03, 0.4), (0.03, 0.3), (0.03, 0.3)), PROFILE)
    for words in ("tip 4", "listing the source", "makes broadcast(out=) slower"):
        assert _one(v, words).verdict == "FALSE" and "at 64 KiB" in _one(v, words).figure, words


def test_peer_copy_at_every_large_size():
    sizes = [1 << 20, 64 << 20, 1 << 30]
    sweep = {"sizes": sizes, "n_devices": 2,
             "ops": {"comm.broadcast": {"median_ms": [0.05, 0.3, 3.0]}, "x.to(peer)": {"median_ms": [0.01, 0.28, 2.9]}}}
    assert _one(lab_claims.peer_copy_verdicts(sweep), "peer copy").verdict == "TRUE"
    sweep["ops"]["x.to(peer)"]["median_ms"] = [0.01, 0.35, 2.9]      # slower at 64 MiB only
    v = _one(lab_claims.peer_copy_verdicts(sweep), "peer copy")
    assert v.verdict == "FALSE" and "at 64 MiB" in v.figure and "1 MiB" not in v.figure   # small sizes not judged


def test_the_recordings_judge_every_point():
    many = lab_claims.many_verdicts(_recording("01_many_small"))
    assert _one(many, "does the work").figure.count("k = ") == len(_recording("01_many_small")["counts"]) + 1
    red = lab_claims.redundant_verdicts(_recording("01_redundant"), _recording("01_profile"))
    assert _one(red, "makes broadcast(out=) slower").verdict == "FALSE"   # 64 MiB misses the bar
    assert not any("few MiB" in v.claim for v in lab_claims.tip1_verdicts(_recording("01_bandwidth_sweep")))
