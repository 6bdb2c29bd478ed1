"""Lab 03 on the CPU: the source's program and its fixes, the rings against torch's collectives at
world sizes 2, 3 and 4, the deadlock machinery (step log, timeout, verdict, no process left),
wait() on gloo, the overlap measurement code path, the pure overlap arithmetic, and the checkers.
Real gloo ranks, no mocks of torch.distributed.

Run: pytest tests/test_p2p.py -q     (about a minute on 2 cores, mostly rank start-up)
"""
from __future__ import annotations

import math
import sys
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils import compat, procs
from labutils.config import rank_device
from labutils.labs.lab03_async_p2p import exchange, hang, measure, overlap, wait
from labutils.solutions import lab03 as solution
from labutils.checks import ExerciseError
from labutils.checks import lab03 as check

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file


# ---- pure helpers -------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", range(1, 9))
def test_chunk_rows_matches_torch_chunk(world_size):
    assert exchange.chunk_rows(1000, world_size) == [c.shape[0] for c in torch.chunk(torch.empty(1000), world_size)]


def test_chunk_rows_uneven_and_too_few_pieces():
    assert exchange.chunk_rows(1000, 3) == [334, 334, 332]
    with pytest.raises(ValueError, match="fewer than 4 pieces.*HINT"):
        exchange.chunk_rows(5, 4)  # torch.chunk gives 2, 2, 1: rank 3 would get nothing


@pytest.mark.parametrize("tc, tm, to, expected", [
    (10.0, 4.0, 10.0, 1.0),     # the transfer completely hidden
    (10.0, 4.0, 14.0, 0.0),     # as slow as back to back
    (10.0, 4.0, 16.0, -0.5),    # slower than back to back
    (4.0, 10.0, 12.0, 0.5),     # symmetric in compute / comm
    (3.0, 3.0, 4.5, 0.5),
])
def test_overlap_efficiency(tc, tm, to, expected):
    assert overlap.overlap_efficiency(tc, tm, to) == pytest.approx(expected)


@pytest.mark.parametrize("bad", [(0.0, 1.0, 1.0), (1.0, -1.0, 1.0), (1.0, 1.0, float("inf")),
                                 (1.0, 1.0, float("nan")), (1.0, None, 1.0)])
def test_overlap_efficiency_rejects_bad_times(bad):
    with pytest.raises(ValueError, match="positive and finite"):
        overlap.overlap_efficiency(*bad)


def test_describe_efficiency_thresholds():
    assert [overlap.describe_efficiency(e) for e in (1.0, 0.8, 0.5, 0.05, -0.05, -0.5)] == [
        "shorter activity hidden", "shorter activity hidden", "partly hidden", "no overlap",
        "no overlap", "slower than back to back"]


def test_diagnose_source_names_blocks_by_checksum():
    summaries = [{"shape": [1500, 1000], "tensor_sum": 1.5, "result_sum": 10.0, "block_sums": [10.0, None, 20.0]},
                 {"shape": [1500, 1000], "tensor_sum": 2.5, "result_sum": 20.0, "block_sums": [20.0, 10.0, 0.0]}]
    lines = exchange.diagnose_source(summaries)
    assert lines[0] == "final_result shape: (1500, 1000) on every rank (the gathered tensor is (1000, 1000))"
    assert lines[1] == ("rank 0 concatenates: result = chunk 0, received_results[0] = never written, "
                        "received_results[1] = chunk 1")
    assert lines[2].endswith("received_results[0] = chunk 0, received_results[1] = never written")
    assert lines[-1] == "all ranks drew the same torch.randn(1000, 1000): False"


def test_report_fixes_is_false_if_any_rank_differs():
    ok = {"shape": [1000, 1000], "equal": True}
    lines = exchange.report_fixes([{"a": ok}, {"a": {**ok, "equal": False}}])
    assert lines == ["a                           shape (1000, 1000), equals tensor * 2 on every rank: False"]


def test_step_log_round_trip(tmp_path):
    log = hang.StepLog(str(tmp_path), 3)
    log.mark("start", "gloo\ton cpu\nsecond line")
    log.mark("isend")
    steps = hang.read_steps(str(tmp_path))
    assert list(steps) == [3]
    assert [(s["step"], s["detail"]) for s in steps[3]] == [("start", "gloo on cpu second line"), ("isend", "")]


def _outcome(status, steps, **kw):
    return {"init": "eager", "status": status, "elapsed_s": 15.4, "timeout_s": 15, "poll_s": 1.0, "world_size": 2,
            "message": kw.pop("message", ""),
            "steps": {str(r): [{"t_s": 0.0, "step": s, "detail": d} for s, d in seq] for r, seq in steps.items()}}


GPU_HANG = [("start", ""), ("isend", ""), ("irecv", ""), ("wait", ""), ("p2p_done", "0/2"),
            ("all_reduce", ""), ("all_reduce_done", "False")]


def test_hang_verdict_gpu_hang():
    text = hang.hang_verdict(_outcome("RankTimeout", {0: GPU_HANG, 1: GPU_HANG}))
    assert text == ("eager init: HANG -- isend, irecv and wait() returned on every rank's host, but after "
                    "1 s the GPU had completed 0/2 requests; an all_reduce issued afterwards completed: "
                    "False; torch.cuda.synchronize() (what print(final_result) needs) never returned; "
                    "labutils killed every rank at the 15 s timeout (RankTimeout) (15 s in all).")
    assert hang.describe_steps(_outcome("RankTimeout", {0: GPU_HANG}))[0].endswith("all_reduce complete: False -> (stopped here)")


def test_hang_verdict_other_outcomes():
    done = GPU_HANG[:4] + [("p2p_done", "2/2"), ("all_reduce", ""), ("all_reduce_done", "True"), ("synchronized", "")]
    assert "COMPLETED" in hang.hang_verdict(_outcome("completed", {0: done, 1: done}))
    assert "INCONCLUSIVE" in hang.hang_verdict(_outcome("RankTimeout", {0: GPU_HANG}))  # rank 1 never started
    host = hang.hang_verdict(_outcome("RankTimeout", {0: [("start", "")], 1: GPU_HANG}))
    assert host.startswith("eager init: HANG on the host inside isend (ranks [0])")
    crash = hang.hang_verdict(_outcome("RankError", {0: GPU_HANG, 1: GPU_HANG},
                                      message="rank 1 was killed by SIGABRT before returning a result. HINT: x"))
    assert crash.startswith("eager init: CRASH --")
    assert "then rank 1 was killed by SIGABRT before returning a result" in crash and "HINT" not in crash
    after_wait = hang.hang_verdict(_outcome("RankError", {0: GPU_HANG[:4], 1: GPU_HANG}, message="m"))
    assert after_wait == "eager init: CRASH after wait() (ranks [0]); then m."


def test_describe_steps_lists_each_warning_once():
    warn = ("warning", "An unbatched P2P op (send/recv) was called")
    outcome = _outcome("RankTimeout", {0: GPU_HANG[:2] + [warn], 1: GPU_HANG[:2] + [warn]})
    outcome["where"] = {"0": "torch/cuda/__init__.py:1 in synchronize"}
    assert hang.describe_steps(outcome) == [
        "rank 0: started -> isend returned -> (stopped here)",
        "rank 1: started -> isend returned -> (stopped here)",
        "warning caught: An unbatched P2P op (send/recv) was called",
        "rank 0 at the timeout: torch/cuda/__init__.py:1 in synchronize"]


# ---- integration with real gloo ranks -----------------------------------------------------------
def _rings_and_fixes(rank, world_size):
    """Everything that must equal torch's own collectives, in one launch per world size (any backend)."""
    dev = rank_device()
    out = {"fixes": exchange.fixed_versions(rank, world_size), "all_gather": [], "all_reduce": []}
    for shape, dtype in (((5,), torch.float32), ((3, 4), torch.int64), ((1,), torch.float64)):
        inp = (torch.arange(math.prod(shape)) + 100 * rank).reshape(shape).to(dtype).to(dev)
        ref = inp.new_empty((world_size * shape[0], *shape[1:]))
        compat.all_gather_into_tensor(ref, inp)
        got = torch.zeros_like(ref)
        solution.ring_all_gather(got, inp)
        out["all_gather"].append(torch.equal(got.cpu(), ref.cpu()))
    for numel in (1, 3, 7, 1000):  # fewer elements than ranks, uneven chunks
        t = (torch.arange(numel) + 10 * rank).float().to(dev)
        ref = t.clone()
        dist.all_reduce(ref)
        solution.ring_all_reduce(t)
        out["all_reduce"].append(torch.equal(t.cpu(), ref.cpu()))
    t = torch.randn(4097, generator=torch.Generator().manual_seed(rank)).to(dev)
    ref = t.clone()
    dist.all_reduce(ref)
    solution.ring_all_reduce(t)
    torch.testing.assert_close(t, ref)  # float sums in another order: close, not equal
    errors = []
    for bad in (lambda: solution.ring_all_gather(torch.empty(3), torch.empty(2)),
                lambda: solution.ring_all_gather(torch.empty(world_size, 4).t(), torch.empty(4)),
                lambda: solution.ring_all_reduce(torch.empty(4, 4).t())):
        try:
            bad()
        except ValueError as exc:
            errors.append("contiguous" in str(exc))
    out["errors"] = errors
    if world_size >= 3:  # a ring over a subgroup: peers are global ranks
        group = dist.new_group([1, 2])
        if rank in (1, 2):
            inp = torch.full((2,), float(rank), device=dev)
            ref, got = torch.empty(4, device=dev), torch.empty(4, device=dev)
            compat.all_gather_into_tensor(ref, inp, group=group)
            solution.ring_all_gather(got, inp, group=group)
            t = torch.full((5,), float(rank), device=dev)
            solution.ring_all_reduce(t, group=group)
            out["group"] = torch.equal(got.cpu(), ref.cpu()) and torch.equal(t.cpu(), torch.full((5,), 3.0))
    return out


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_fixes_and_rings_equal_the_collectives(world_size, no_leaks):
    res = labutils.launch(_rings_and_fixes, world_size=world_size, backend="gloo", output="quiet")
    assert all(line.endswith("every rank: True") for line in exchange.report_fixes([r["fixes"] for r in res]))
    assert all(r["fixes"][name]["shape"] == [1000, 1000] for r in res for name in exchange.FIXES)
    for r in res:
        assert all(r["all_gather"]) and all(r["all_reduce"])
        assert r["errors"] == [True, True, True]
    if world_size >= 3:
        assert res[1]["group"] and res[2]["group"]


def test_source_as_written_on_gloo_shows_its_defects(no_leaks):
    res = labutils.launch(exchange.source_as_written, backend="gloo", world_size=2, output="quiet")
    lines = exchange.diagnose_source(res)
    assert lines[0].startswith("final_result shape: (1500, 1000) on every rank")
    assert lines[1].startswith("rank 0 concatenates: result = chunk 0, received_results[0] = never written")
    assert lines[2].startswith("rank 1 concatenates: result = chunk 1, received_results[0] = chunk 0")
    assert lines[-1].endswith("False")  # unseeded: every rank drew its own tensor


def test_source_as_written_aborts_with_uneven_chunks(no_leaks):
    out = hang.try_launch(exchange.source_as_written, backend="gloo", world_size=3, timeout=60, output="quiet")
    assert out["status"] == "RankError", out
    assert "size" in out["message"] and out["elapsed_s"] < 60


def test_hang_demo_on_gloo_completes(no_leaks):
    out = hang.hang_demo(timeout_s=60, inits=("eager",), backend="gloo", poll_s=5)["eager"]
    assert out["status"] == "completed" and out["value"] == [True, True]
    assert [s["step"] for s in out["steps"]["1"]] == ["start", "isend", "irecv", "wait", "p2p_done",
                                                      "all_reduce", "all_reduce_done", "synchronized"]
    assert hang.hang_verdict(out).startswith("eager init: COMPLETED")


def _blocking_send_first(rank, world_size, log_dir, poll_s):
    log = hang.StepLog(log_dir, rank)
    log.mark("start")
    dist.send(torch.ones(4), dst=1 - rank)  # gloo's send waits for the receiver: both wait forever
    log.mark("isend")


def test_deadlock_costs_its_timeout_and_leaves_nothing(no_leaks):
    timeout = 8.0
    t0 = time.monotonic()
    out = hang.hang_demo(timeout_s=timeout, inits=("lazy",), backend="gloo", rank_fn=_blocking_send_first)["lazy"]
    assert out["status"] == "RankTimeout"
    assert time.monotonic() - t0 < timeout + 6  # + labutils' diagnostics and the kill
    assert hang.hang_verdict(out) .startswith("lazy init: HANG on the host inside isend (ranks [0, 1])")
    assert procs.leftover_ranks() == []


def test_wait_blocks_the_host_on_gloo_and_races_are_real(no_leaks):
    res = labutils.launch(wait.wait_semantics_gloo, 0.3, backend="gloo", world_size=2, output="quiet")
    assert res[0] == {}
    assert res[1]["wait_ms"] >= 150 and res[1]["early_read_stale"] and res[1]["after_wait_ok"]
    assert res[1]["send_race_fraction"] > 0


def test_overlap_experiment_code_path_on_gloo(no_leaks):
    res = labutils.launch(overlap.overlap_experiment, 1 << 16, 0, 2, backend="gloo", output="quiet")
    data = res[0]
    assert data["world_size"] == 2 and data["size_bytes"] == 1 << 16
    assert {(c["compute"], c["transfer"]) for c in data["cases"]} == {
        (c, t) for c in ("matmul", "memory-bound") for t in ("all_reduce (gloo)", "send/recv (gloo)")}
    for c in data["cases"]:
        assert 1 <= c["k"] <= overlap.MAX_REPEATS
        assert c["efficiency"] == pytest.approx(overlap.overlap_efficiency(c["compute_ms"], c["comm_ms"], c["overlapped_ms"]))
        lanes = {s["lane"] for s in c["spans"]}
        assert lanes == {"back to back: compute", "back to back: transfer", "overlapped: compute", "overlapped: transfer"}
        assert all(0 <= s["start_ms"] <= s["end_ms"] for s in c["spans"])
    assert [c["efficiency"] for c in res[1]["cases"]] == [c["efficiency"] for c in data["cases"]]  # slowest rank


def test_ring_vs_collective_code_path_on_gloo(no_leaks):
    res = labutils.launch(measure.ring_vs_collective, solution.ring_all_gather, [1 << 10, 1 << 14], 1, 2, 2,
                          backend="gloo", world_size=3, output="quiet")
    d = res[0]
    assert d["ring_correct"] and d["world_size"] == 3
    assert d["size_bytes"] == [4 * 3 * (1024 // 12), 4 * 3 * (16384 // 12)]
    assert all(v > 0 for k in ("ring_busbw_gbps", "collective_busbw_gbps") for v in d[k])


# ---- checkers -----------------------------------------------------------------------------------
def _stub(*args):
    raise NotImplementedError


def test_checker_stub_checks_the_reference(capsys, no_leaks):
    fn = check.ring_all_gather(_stub, backend="gloo")
    assert fn is solution.ring_all_gather
    out = capsys.readouterr().out
    assert "not attempted" in out and "labutils.solutions.lab03.ring_all_gather" in out
    assert "✓ ring all-gather (reference solution) matches all_gather_into_tensor on every rank" in out


def _my_ring_all_reduce(tensor):  # a learner's correct answer: reduce-scatter + all-gather
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).tensor_split(n)
    for s in range(n - 1):
        buf = torch.empty_like(chunks[(r - s - 1) % n])
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[(r - s) % n], (r + 1) % n),
                                       dist.P2POp(dist.irecv, buf, (r - 1) % n)])
        for q in reqs:
            q.wait()
        chunks[(r - s - 1) % n].add_(buf)
    for s in range(n - 1):
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[(r + 1 - s) % n], (r + 1) % n),
                                       dist.P2POp(dist.irecv, chunks[(r - s) % n], (r - 1) % n)])
        for q in reqs:
            q.wait()


def test_checker_accepts_a_correct_answer_and_returns_it(capsys, no_leaks):
    assert check.ring_all_reduce(_my_ring_all_reduce, backend="gloo", world_size=3) is _my_ring_all_reduce
    assert capsys.readouterr().out.startswith("✓ ring all-reduce matches all_reduce on every rank")


def _wrong_order(output, input):  # receives into the wrong chunk
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = output.view(n, -1)
    chunks[r].copy_(input.reshape(-1))
    for s in range(n - 1):
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[(r - s) % n], (r + 1) % n),
                                        dist.P2POp(dist.irecv, chunks[(r + s + 1) % n], (r - 1) % n)]):
            q.wait()


def _uses_the_collective(output, input):
    dist.all_gather_into_tensor(output, input)


def _never_writes(tensor):
    pass


@pytest.mark.parametrize("checker, fn, world_size, pattern", [
    (check.ring_all_gather, _wrong_order, 3, r"chunk\(s\) \[.*\] differ from all_gather_into_tensor.*HINT: chunk k must hold"),
    (check.ring_all_gather, _uses_the_collective, 2, r"raised RuntimeError.*called dist\.all_gather_into_tensor"),
    (check.ring_all_reduce, _never_writes, 2, r"output was never written.*HINT: write the sums back"),
])
def test_checker_rejects_wrong_answers(checker, fn, world_size, pattern, no_leaks):
    with pytest.raises(ExerciseError, match=pattern):
        checker(fn, backend="gloo", world_size=world_size)


def _deadlocks(output, input):
    r = dist.get_rank()
    dist.send(input.reshape(-1), dst=1 - r)  # blocking send on both ranks
    dist.recv(output.view(2, -1)[1 - r], src=1 - r)


def test_checker_turns_a_deadlock_into_a_hint(no_leaks):
    with pytest.raises(ExerciseError, match=r"did not finish within 8 s.*HINT: post each step's send and receive together"):
        check.ring_all_gather(_deadlocks, backend="gloo", world_size=2, timeout=8)


def test_checker_wants_a_function():
    with pytest.raises(ExerciseError, match="expected a function"):
        check.ring_all_reduce(42, backend="gloo")


@pytest.mark.parametrize("coll, head, state", [
    ([40.0, 400.0], "**True.**", "NCCL ahead"),
    ([40.0, 101.0], "**True below 1 GiB.**", "a tie"),
    ([40.0, 80.0], "**True below 1 GiB.**", "the ring ahead"),
    ([9.0, 80.0], "**No.**", "the ring ahead"),
])
def test_library_verdict_follows_the_measurement(coll, head, state):
    d = {"size_bytes": [1 << 20, 1 << 30], "ring_busbw_gbps": [10.0, 100.0],
         "collective_busbw_gbps": coll, "world_size": 4}
    text = measure.library_verdict(d)
    assert text.startswith(head) and text.rstrip(".").endswith(state), text
    assert f"{coll[0] / 10:.2f}× at 1 MiB" in text
    assert "2 ranks" not in text
    # the 2-rank explanation appears exactly when NCCL does not win the largest size
    assert ("With 2 ranks" in measure.library_verdict({**d, "world_size": 2})) == (state != "NCCL ahead")
