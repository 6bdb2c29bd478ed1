"""Lab 03 on the CPU: the notebook's own fixed exchanges (taken from its source) and the reference rings
against torch's collectives at world sizes 2 and 3; the source's program and its defects; the standalone
reproducer's harness (start, wait, classify, nothing left behind) on tiny scripts, and the notebook's
reproducer script itself; wait() on gloo; the overlap and ring measurement code paths; the verdicts'
thresholds; and the checkers. Real gloo ranks, no mocks of torch.distributed.

Run: pytest tests/test_p2p.py -q     (about a minute on 2 cores, mostly rank start-up and two deliberate hangs)
"""
from __future__ import annotations

import ast
import math
import sys
import textwrap
import time

import cloudpickle
import jupytext
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils import compat
from labutils.checks import ExerciseError
from labutils.checks import lab03 as check
from labutils.config import rank_device
from labutils.labs.lab03_async_p2p import claims as lab_claims
from labutils.labs.lab03_async_p2p import exchange, measure, overlap, repro, wait
from labutils import checks
from labutils.solutions import lab03 as solution

from notebook_defs import ROOT, cell_magic_body, load_definitions

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the ranks cannot import this file

STEM = "03_async_p2p"
nb = load_definitions(STEM)
FIXES = {"ordered send/recv": nb.gather_ordered, "batch_isend_irecv (P2POp)": nb.gather_batched,
         "all_gather_into_tensor": nb.gather_collective}


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


def test_source_findings_name_blocks_by_checksum():
    summaries = [{"shape": [1500, 1000], "tensor_sum": 1.5, "result_sum": 10.0, "block_sums": [10.0, None, 20.0]},
                 {"shape": [1500, 1000], "tensor_sum": 2.5, "result_sum": 20.0, "block_sums": [20.0, 10.0, 0.0]}]
    assert exchange.diagnose_source(summaries) == [
        "final_result shape: (1500, 1000) on every rank (the gathered tensor is (1000, 1000))",
        "all ranks drew the same torch.randn(1000, 1000): False"]
    blocks = exchange.source_blocks(summaries)
    assert blocks.loc["rank 0"].tolist() == ["chunk 0", "never written", "chunk 1"]
    assert blocks.loc["rank 1"].tolist() == ["chunk 1", "chunk 0", "never written"]


def test_fixes_table_is_false_if_any_rank_differs():
    ok = {"shape": [1000, 1000], "equal": True}
    table = exchange.fixes_table([{"a": ok, "b": ok}, {"a": {**ok, "equal": False}, "b": ok}])
    assert table["equals tensor * 2 on every rank"].to_dict() == {"a": False, "b": True}
    assert table.loc["a", "shape"] == "(1000, 1000)"


# ---- the reproducer's harness, on tiny scripts (no torch: they start in milliseconds) -----------
TOY = textwrap.dedent('''
    import os, sys, time
    rank, what = int(os.environ["RANK"]), sys.argv[1]
    print(f"rank {rank}: started on port {os.environ['MASTER_PORT']} of {os.environ['WORLD_SIZE']}", flush=True)
    if what == "ok":
        print(f"rank {rank}: COMPLETED", flush=True)
    elif what == "hang":
        print(f"rank {rank}: HANG: not finished", flush=True)
        os._exit(3)
    elif what == "blocked":
        time.sleep(600)
    elif what == "crash" and rank == 1:
        print("CUDA error: an illegal memory access was encountered", file=sys.stderr, flush=True)
        os.abort()
    elif what == "crash":
        time.sleep(600)
    elif what == "env":
        print(f"rank {rank}: COMPLETED {os.environ.get('MARK')}", flush=True)
''')


def test_harness_runs_variants_at_once_classifies_them_and_leaves_nothing(tmp_path):
    script = tmp_path / "toy.py"
    script.write_text(TOY)
    t0 = time.monotonic()
    runs = repro.start(script, {"ok": ("ok", {}), "hang": ("hang", {}), "blocked": ("blocked", {}),
                                "crash": ("crash", {}), "env": ("env", {"MARK": "x"})}, timeout_s=4)
    time.sleep(2)  # as in the notebook, other cells run before wait(): each run keeps its own end time
    result = runs.wait()
    assert time.monotonic() - t0 < 4 + 5
    v = result["variants"]
    assert {name: r["status"] for name, r in v.items()} == {
        "ok": "COMPLETED", "hang": "HANG", "blocked": "HANG", "crash": "CRASH", "env": "COMPLETED"}
    assert v["hang"]["evidence"] == "rank 0: HANG: not finished"
    assert v["blocked"]["evidence"].startswith("rank 0: still running at the 4 s timeout (host blocked) after: started")
    assert v["crash"]["evidence"].startswith("rank 1 (killed by SIGABRT): CUDA error: an illegal memory access")
    assert [r["outcome"] for r in v["crash"]["ranks"]] == ["HANG", "CRASH"]  # the crash comes first
    assert v["env"]["ranks"][1]["steps"][-1] == "COMPLETED x" and v["env"]["env"] == {"MARK": "x"}
    ports = {r["steps"][0].split()[3] for name in ("ok", "hang") for r in v[name]["ranks"]}
    assert len(ports) == 2  # one rendezvous port per variant
    assert v["ok"]["elapsed_s"] < 1.5 <= 3.5 <= v["blocked"]["elapsed_s"], {n: r["elapsed_s"] for n, r in v.items()}
    assert runs.wait() is result
    assert repro.leftover_processes(script) == []
    table = repro.table(result)
    assert table.loc["crash", "outcome"] == "CRASH" and table.loc["ok", "rank 0's steps"].endswith("COMPLETED")


def test_a_reproducer_gets_torchruns_environment_and_nothing_of_labutils():
    """repro starts plain scripts with procs.torchrun_env; labutils' own ranks get rank_env, built on it."""
    import os
    from labutils import procs
    env = procs.torchrun_env(1, 3, 29511, {"NCCL_CUMEM_ENABLE": 0})
    torchrun = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "3", "LOCAL_WORLD_SIZE": "3",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    assert {k: env[k] for k in torchrun} == torchrun and env["NCCL_CUMEM_ENABLE"] == "0"
    for labutils_only in ("LABUTILS_RANK", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_CPP_LOG_LEVEL", "PYTHONPATH"):
        assert env.get(labutils_only) == os.environ.get(labutils_only), labutils_only
    rank = procs.rank_env(1, 3, 29511, "gloo", {"NCCL_CUMEM_ENABLE": 0})
    assert {k: rank[k] for k in torchrun} == torchrun and rank["LABUTILS_RANK"] == "1"
    assert rank["TORCH_NCCL_ASYNC_ERROR_HANDLING"] and rank["NCCL_CUMEM_ENABLE"] == "0"


def test_harness_rejects_bad_arguments(tmp_path):
    script = tmp_path / "toy.py"
    script.write_text(TOY)
    with pytest.raises(ValueError, match="no variants"):
        repro.start(script, {})
    with pytest.raises(ValueError, match="world_size must be an int >= 2"):
        repro.start(script, {"ok": ("ok", {})}, world_size=1)
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        repro.start(script, {"ok": ("ok", {})}, timeout_s=0)
    with pytest.raises(FileNotFoundError, match="run the cell that writes it first"):
        repro.start(tmp_path / "missing.py", {"ok": ("ok", {})})


def test_classify_prefers_a_crash_and_keeps_nccls_warning():
    nccl = "host:1:1 [0] transport.cc:235 NCCL WARN Cuda failure 'an illegal memory access was encountered'"
    out = repro.classify([{"rc": -6, "killed": False, "stdout": "rank 0: isend returned\n", "stderr": nccl},
                          {"rc": 3, "killed": False, "stdout": "rank 1: HANG: the exchange\n", "stderr": ""}], 9)
    assert out["status"] == "CRASH" and "illegal memory access" in out["evidence"]
    assert out["nccl_warning"].startswith("NCCL WARN Cuda failure")
    assert out["ranks"][0]["steps"] == ["isend returned"]
    exited = repro.classify([{"rc": 1, "killed": False, "stdout": "", "stderr": "Traceback\nValueError: bad\n"}], 9)
    assert exited["evidence"] == "rank 0 (exit code 1): ValueError: bad"
    assert repro.classify([{"rc": 0, "killed": False, "stdout": "rank 0: done\n", "stderr": ""}], 9)["status"] == "CRASH"


def test_classify_finds_nccls_warning_on_stdout_and_keeps_it_out_of_the_steps():
    # rank 1's standard output in the 2xH200 recording: NCCL writes its log there (NCCL_DEBUG_FILE unset)
    stdout = ("rank 1: isend returned\n[2026-11-30 13:30:13] vm:1991:1991 [1] transport.cc:235 NCCL WARN Cuda "
              "failure 'an illegal memory access was encountered'\n")
    out = repro.classify([{"rc": -6, "killed": False, "stdout": "NCCL version 2.28.9+cuda13.0\n", "stderr": ""},
                          {"rc": -6, "killed": False, "stdout": stdout, "stderr": ""}], 9)
    assert out["nccl_warning"] == "NCCL WARN Cuda failure 'an illegal memory access was encountered'"
    assert [r["steps"] for r in out["ranks"]] == [[], ["isend returned"]]


def test_evidence_is_cut_at_words_and_says_so():
    line = ("[rank0]:[E1130 13:30:13.000 ProcessGroupNCCL.cpp:2057] [PG ID 0 PG GUID 0(default_pg) Rank 0] "
            "Process group watchdog thread terminated with exception: CUDA error: an illegal memory access was "
            "encountered " + "x" * 300)
    out = repro.classify([{"rc": -6, "killed": False, "stdout": "", "stderr": line}], 9)
    evidence = out["evidence"].split(": ", 1)[1]
    assert evidence.startswith("… ") and evidence.endswith("encountered …"), evidence
    assert all(word in line.split() for word in evidence.strip("… ").split()), evidence  # whole words only
    assert repro.clip("hello world foo", 2, 9) == "… world …"
    assert repro.clip("hello world", 0, 11) == "hello world" and repro.clip("hello world", 0, 7) == "hello …"


# ---- the notebook's reproducer script --------------------------------------------------------------
def test_notebook_reproducer_is_standalone_and_knows_every_variant():
    source = cell_magic_body(STEM, "writefile")
    tree = ast.parse(source)
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [ast.alias(n.module or "")])}
    assert imported <= {"os", "sys", "time", "torch"}  # no labutils in the reproducer
    notebook = jupytext.read(ROOT / "notebooks" / "src" / f"{STEM}.py")
    cell = next(c.source for c in notebook.cells if c.source.startswith("VARIANTS = {"))
    variants = eval(cell.split("=", 1)[1].split("\nEXCHANGE_RUNS")[0])  # noqa: S307 - our own notebook's literal
    for arg, _ in variants.values():
        assert arg == "as_written" or f'"{arg}"' in source, arg
    statuses = {"as_written": "CRASH", "preconnected": "COMPLETED", "batched": "COMPLETED", "recv_first": "HANG"}
    data = {"variants": {name: {"arg": arg, "env": env, "status": "HANG" if env else statuses[arg]}
                         for name, (arg, env) in variants.items()}}
    verdicts = lab_claims.exchange_verdicts(data)
    assert [v.verdict for v in verdicts] == ["FALSE", "TRUE", "TRUE", "TRUE"]  # every variant found


# ---- verdict thresholds ----------------------------------------------------------------------------
def _variants(**statuses):
    args = {"written": ("as_written", {}), "cumem": ("as_written", {"NCCL_CUMEM_ENABLE": "0"}),
            "pre": ("preconnected", {}), "batched": ("batched", {}), "recv": ("recv_first", {})}
    return {"variants": {k: {"arg": a, "env": e, "status": statuses.get(k, "COMPLETED")} for k, (a, e) in args.items()}}


def test_exchange_verdicts_follow_the_statuses():
    words = lambda d: [v.verdict for v in lab_claims.exchange_verdicts(d)]  # noqa: E731
    assert words(_variants(written="CRASH", cumem="HANG", recv="HANG")) == ["FALSE", "TRUE", "TRUE", "TRUE"]
    assert words(_variants(written="CRASH", cumem="CRASH", recv="HANG"))[1] == "FALSE"   # transport did not matter
    assert words(_variants(written="CRASH", pre="HANG", recv="HANG"))[1] == "FALSE"      # connecting did not help
    assert words(_variants(written="HANG", batched="CRASH", recv="COMPLETED")) == ["FALSE", "FALSE", "FALSE", "FALSE"]
    assert words(_variants(written="NOT RECORDED"))[:2] == ["NO DATA", "NO DATA"]


def _case(compute, transfer, e):
    return {"compute": compute, "transfer": transfer, "k": 2, "efficiency": e}


def test_overlap_verdicts_follow_their_thresholds():
    data = {"cases": [_case("matmul (bf16)", "send/recv (NCCL)", 0.8), _case("memory-bound (x)", "send/recv (NCCL)", 0.8),
                      _case("matmul (bf16)", overlap.PEER_COPY, 0.1), _case("matmul (bf16)", overlap.PEER_MEMCPY, 0.79)],
            "profiles": {overlap.PEER_COPY: {"gpu": [{"name": "Memcpy PtoP", "engine": "copy engine"}],
                                             "runtime": {"cudaStreamWaitEvent": 2}},
                         overlap.PEER_MEMCPY: {"gpu": [], "runtime": {"cudaMemcpyAsync": 1}}}}
    verdicts = lab_claims.overlap_verdicts(data)
    assert [v.verdict for v in verdicts] == ["TRUE", "PARTLY", "PARTLY", "TRUE", "TRUE"]
    data["profiles"][overlap.PEER_COPY]["gpu"].append({"name": "elementwise_kernel", "engine": "SMs"})
    data["profiles"][overlap.PEER_MEMCPY]["runtime"]["cudaStreamWaitEvent"] = 1
    assert [v.verdict for v in lab_claims.overlap_verdicts(data)][-2:] == ["FALSE", "FALSE"]
    assert len(lab_claims.overlap_verdicts({"cases": data["cases"][:1]})) == 1  # an older recording: fewer verdicts


def test_wait_verdicts_follow_their_thresholds():
    wait_data = {"wait_ms": 10.0, "sync_ms": 100.0, "after_wait_ok": True}
    assert [v.verdict for v in lab_claims.wait_verdicts(wait_data)] == ["TRUE", "TRUE"]
    assert [v.verdict for v in lab_claims.wait_verdicts({**wait_data, "wait_ms": 10.1, "after_wait_ok": False})] == [
        "FALSE", "FALSE"]


# ---- integration with real gloo ranks -----------------------------------------------------------
def _rings_and_fixes(rank, world_size, fixes):
    """Everything that must equal torch's own collectives, in one call per world size (any backend)."""
    dev = rank_device()
    out = {"fixes": exchange.verify_fixes(rank, world_size, fixes), "all_gather": [], "all_reduce": []}
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


def check_rings_and_fixes(res):
    table = exchange.fixes_table([r["fixes"] for r in res])
    assert table["equals tensor * 2 on every rank"].all() and (table["shape"] == "(1000, 1000)").all()
    for r in res:
        assert all(r["all_gather"]) and all(r["all_reduce"])
        assert r["errors"] == [True, True, True]
    if len(res) >= 3:
        assert res[1]["group"] and res[2]["group"]


def test_notebook_fixes_and_rings_equal_the_collectives(gloo2, gloo3):
    for ranks in (gloo2, gloo3):  # 3 ranks: uneven chunks (334, 334, 332), a subgroup, left != right
        check_rings_and_fixes(ranks.run(_rings_and_fixes, FIXES))


def _wrong_gather(result, rows):  # the source's mistake: every rank's own chunk first
    return torch.cat([result] + [result.new_zeros(r, result.shape[1]) for i, r in enumerate(rows) if i != dist.get_rank()])


def test_verify_fixes_catches_a_wrong_gather(gloo2):
    table = exchange.fixes_table(gloo2.run(exchange.verify_fixes, {"wrong": _wrong_gather}))
    assert not table.loc["wrong", "equals tensor * 2 on every rank"]


def test_source_as_written_on_gloo_shows_its_defects(gloo2):
    res = gloo2.run(exchange.source_as_written)
    lines = exchange.diagnose_source(res)
    assert lines[0].startswith("final_result shape: (1500, 1000) on every rank")
    assert lines[-1].endswith("False")  # unseeded: every rank drew its own tensor
    blocks = exchange.source_blocks(res)
    assert blocks.loc["rank 0"].tolist() == ["chunk 0", "never written", "chunk 1"]
    assert blocks.loc["rank 1"].tolist() == ["chunk 1", "chunk 0", "never written"]


def test_source_as_written_aborts_with_uneven_chunks(no_leaks):
    out = exchange.attempt(labutils.launch, exchange.source_as_written, backend="gloo", world_size=3, timeout=60,
                           output="quiet")
    assert out["status"] == "RankError", out
    assert "size" in out["message"] and out["elapsed_s"] < 60 and out["tail"]


def _blocking_send_first(rank, world_size):
    dist.send(torch.ones(4), dst=1 - rank)  # gloo's send waits for the receiver: both wait forever


def test_a_blocking_send_on_every_rank_deadlocks_gloo(no_leaks):
    timeout = 8.0
    out = exchange.attempt(labutils.launch, _blocking_send_first, backend="gloo", world_size=2, timeout=timeout,
                           output="quiet")
    assert out["status"] == "RankTimeout" and out["elapsed_s"] < timeout + 6, out  # no_leaks: nothing left


def test_attempt_reports_a_completed_run(gloo2):
    out = exchange.attempt(gloo2.run, lambda rank, world_size: {"rank": rank, "t": torch.ones(1)})
    assert out["status"] == "completed" and out["value"] == [{"rank": 0, "t": None}, {"rank": 1, "t": None}]


def test_wait_blocks_the_host_on_gloo_and_races_are_real(gloo2):
    res = gloo2.run(wait.wait_semantics_gloo, 0.3)
    assert res[0] == {}
    assert res[1]["wait_ms"] >= 150 and res[1]["early_read_stale"] and res[1]["after_wait_ok"]
    assert res[1]["send_race_fraction"] > 0


def _serial_step(compute, transfer, side):  # waits before it computes: nothing in flight during compute
    for w in transfer():
        w.wait()
    compute()


def _never_waits(compute, transfer, side):
    transfer()
    compute()


def _overlap_spans(rank, world_size, step):
    """The notebook's all_reduce overlapped by ``step`` on gloo: (compute span, transfer span) of the last sample."""
    x, a, b = torch.ones(1 << 14), torch.randn(64, 64), torch.randn(64, 64)
    res = overlap.measure_overlap(lambda: torch.mm(a, b), lambda: [dist.all_reduce(x, async_op=True)], step,
                                  warmup=0, repeat=2)
    spans = {s["lane"]: s for s in res["spans"]}
    return spans["overlapped: compute"], spans["overlapped: transfer"]


def test_the_notebooks_step_computes_while_the_transfer_is_in_flight(gloo3):
    for compute, transfer in gloo3.run(_overlap_spans, nb.overlapped_step):
        assert transfer["end_ms"] >= compute["end_ms"]                 # waited for after computing
    for compute, transfer in gloo3.run(_overlap_spans, _serial_step):   # the harness marks where the step waits
        assert transfer["end_ms"] <= compute["end_ms"]                 # (compute's span starts with the step)
    with pytest.raises(labutils.RankError, match=r"did not wait for the transfer.*HINT: works = transfer\(\)"):
        gloo3.run(_overlap_spans, _never_waits)


def test_overlap_experiment_code_path_on_gloo(gloo2):
    data = gloo2.run(overlap.overlap_experiment, nb.overlapped_step, 1 << 16, 0, 2)[0]
    assert data["world_size"] == 2 and data["size_bytes"] == 1 << 16 and data["profiles"] == {}
    assert {(c["compute"], c["transfer"]) for c in data["cases"]} == {
        (c, t) for c in ("matmul", "memory-bound") for t in ("all_reduce (gloo)", "send/recv (gloo)")}
    for c in data["cases"]:
        assert 1 <= c["k"] <= overlap.MAX_REPEATS
        assert c["efficiency"] == pytest.approx(overlap.overlap_efficiency(c["compute_ms"], c["comm_ms"], c["overlapped_ms"]))
        lanes = {s["lane"] for s in c["spans"]}
        assert lanes == {"back to back: compute", "back to back: transfer", "overlapped: compute", "overlapped: transfer"}
        assert all(0 <= s["start_ms"] <= s["end_ms"] for s in c["spans"])


def test_ring_vs_collective_code_path_on_gloo(gloo3):
    d = gloo3.run(measure.ring_vs_collective, solution.ring_all_gather, [1 << 10, 1 << 14], 1, 2, 2)[0]
    assert d["ring_correct"] and d["world_size"] == 3 and d["host_correct"] is None and d["host_ms"] == []
    assert d["size_bytes"] == [4 * 3 * (1024 // 12), 4 * 3 * (16384 // 12)]
    assert all(v > 0 for k in ("ring_busbw_gbps", "collective_busbw_gbps") for v in d[k])


# ---- checkers -----------------------------------------------------------------------------------
def _stub(*args):
    raise NotImplementedError


@pytest.fixture(scope="module")
def gloo4():
    """Four gloo ranks: the checkers' rules must hold for any ring size, not just the notebook's 3."""
    with labutils.RankPool(world_size=4, backend="gloo", output="quiet") as p:
        yield p


@pytest.fixture(params=[3, 4])
def checkers(request, gloo3, gloo4):
    return {3: gloo3, 4: gloo4}[request.param]


def test_checker_stub_is_not_attempted_and_gets_torchs_collective_as_stand_in(capsys, gloo3):
    fn = check.ring_all_gather(_stub, pool=gloo3)
    assert fn is check.torch_all_gather and checks.is_standin(fn)
    out, err = capsys.readouterr()
    assert out == "" and "not attempted" in err and "torch's dist.all_gather_into_tensor" in err
    assert "solutions" not in err
    assert check.ring_all_reduce(_stub, pool=gloo3) is check.torch_all_reduce
    d = gloo3.run(measure.ring_vs_collective, fn, [1 << 10], 1, 2, 2)[0]  # the stand-in does the job
    assert d["ring_correct"]


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


def test_checkers_accept_correct_rings_and_say_what_they_sent(capsys, checkers):
    n = checkers.world_size
    assert check.ring_all_reduce(_my_ring_all_reduce, pool=checkers) is _my_ring_all_reduce
    assert check.ring_all_gather(solution.ring_all_gather, pool=checkers) is solution.ring_all_gather
    reduce_line, gather_line = capsys.readouterr().out.splitlines()
    assert reduce_line.startswith(f"✓ ring all-reduce matches all_reduce on every rank of {n}")
    assert f"each rank sent {2 * (n - 1)} messages, all to its right neighbour" in reduce_line
    size = 4 << 16   # the largest case: 65536 float32; rank 0 sends every chunk but (r+1)'s and (r+2)'s
    sizes = [c.numel() * 4 for c in torch.empty(1 << 16).tensor_split(n)]
    assert f"{2 * size - sizes[1] - sizes[2 % n]} B for S = {size} B (2(n-1)/n of S" in reduce_line
    assert f"each rank sent {n - 1} messages" in gather_line
    assert f"{(n - 1) * 250 * 8 * 4} B for S = {n * 250 * 8 * 4} B ((n-1)/n of S" in gather_line


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


def _disguised_all_reduce(tensor):  # the right sum: the whole tensor to every peer, then add
    r, n = dist.get_rank(), dist.get_world_size()
    bufs = {p: torch.empty_like(tensor) for p in range(n) if p != r}
    ops = [op for p, buf in bufs.items() for op in (dist.P2POp(dist.isend, tensor, p), dist.P2POp(dist.irecv, buf, p))]
    for q in dist.batch_isend_irecv(ops):
        q.wait()
    for buf in bufs.values():
        tensor.add_(buf)


def _whole_tensor_to_the_neighbour(tensor):  # the right sum, a ring of whole tensors: on 2 ranks it IS the ring
    r, n = dist.get_rank(), dist.get_world_size()
    passing, total = tensor.clone(), tensor.clone()
    for _ in range(n - 1):
        incoming = torch.empty_like(tensor)
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, passing, (r + 1) % n),
                                         dist.P2POp(dist.irecv, incoming, (r - 1) % n)]):
            q.wait()
        total += incoming
        passing = incoming
    tensor.copy_(total)


def _all_gather_to_everyone(output, input):  # the right result and the ring's bytes, but every peer
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = output.view(n, -1)
    chunks[r].copy_(input.reshape(-1))
    ops = [op for p in range(n) if p != r
           for op in (dist.P2POp(dist.isend, chunks[r], p), dist.P2POp(dist.irecv, chunks[p], p))]
    for q in dist.batch_isend_irecv(ops):
        q.wait()


def _ring_the_wrong_way(output, input):  # the right result: every chunk sent to the left neighbour
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = output.view(n, -1)
    chunks[r].copy_(input.reshape(-1))
    for s in range(n - 1):
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, chunks[(r + s) % n], (r - 1) % n),
                                        dist.P2POp(dist.irecv, chunks[(r + s + 1) % n], (r + 1) % n)]):
            q.wait()


def _whole_output_each_step(output, input):  # the right result: the whole output buffer every step
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = output.view(n, -1)
    chunks[r].copy_(input.reshape(-1))
    incoming = torch.empty_like(output)
    for s in range(n - 1):
        for q in dist.batch_isend_irecv([dist.P2POp(dist.isend, output, (r + 1) % n),
                                        dist.P2POp(dist.irecv, incoming, (r - 1) % n)]):
            q.wait()
        k = (r - s - 1) % n
        chunks[k].copy_(incoming.view(n, -1)[k])


def _two_messages_a_step(output, input):  # the right result and bytes, each chunk in two halves
    r, n = dist.get_rank(), dist.get_world_size()
    chunks = output.view(n, -1)
    chunks[r].copy_(input.reshape(-1))
    for s in range(n - 1):
        send, recv = chunks[(r - s) % n].tensor_split(2), chunks[(r - s - 1) % n].tensor_split(2)
        for q in dist.batch_isend_irecv([dist.P2POp(op, t, peer) for a, b in zip(send, recv)
                                         for op, t, peer in ((dist.isend, a, (r + 1) % n), (dist.irecv, b, (r - 1) % n))]):
            q.wait()


@pytest.mark.parametrize("checker, fn, pattern", [
    (check.ring_all_gather, _wrong_order, r"chunk\(s\) \[.*\] differ from all_gather_into_tensor.*HINT: chunk k must hold"),
    (check.ring_all_gather, _uses_the_collective, r"raised RuntimeError.*called dist\.all_gather_into_tensor"),
    (check.ring_all_reduce, _never_writes, r"output was never written.*HINT: write the sums back"),
    (check.ring_all_reduce, _disguised_all_reduce,
     r"case \(65536,\) float32, rank 0 of \d: the result is right, but this rank sent 786432 B|"
     r"case \(65536,\) float32, rank 0 of 3: the result is right, but this rank sent 524288 B in 2 message\(s\) "
     r"to rank\(s\) \[1, 2\], 1\.50x the 349536 B a ring sends.*HINT: .*1\.50x the time.*costs \(n-1\) S per rank"),
    (check.ring_all_reduce, _whole_tensor_to_the_neighbour, r"the result is right, but this rank sent \d+ B in \d "
     r"message\(s\) to rank\(s\) \[1\], \d\.\d\dx the \d+ B a ring sends.*HINT: where the links limit"),
    (check.ring_all_gather, _all_gather_to_everyone, r"rank 0 of \d: this rank sent to rank\(s\) \[1, 2.*\]; in a "
     r"ring it sends only to its right neighbour, rank 1.*HINT: a ring uses the n links between neighbours"),
    (check.ring_all_gather, _ring_the_wrong_way, r"rank 0 of (3: this rank sent to rank\(s\) \[2\]|4: this rank "
     r"sent to rank\(s\) \[3\]); in a ring it sends only to its right neighbour, rank 1"),
    (check.ring_all_gather, _whole_output_each_step, r"the result is right, but this rank sent \d+ B.*\d\.\d\dx "
     r"the \d+ B a ring sends \(\(n-1\)/n of S, the gathered output.*HINT: .*Send chunks\[\(r - s\) % n\]"),
    (check.ring_all_gather, _two_messages_a_step, r"this rank sent (4|6) and received (4|6) non-empty message\(s\); the "
     r"ring has (2|3) steps, one message each way per step. HINT: one batch per step"),
])
def test_checker_rejects_wrong_answers(checker, fn, pattern, checkers):
    with pytest.raises(ExerciseError, match=pattern):
        checker(fn, pool=checkers)


def _deadlocks(output, input):
    r, n = dist.get_rank(), dist.get_world_size()
    dist.send(input.reshape(-1), dst=(r + 1) % n)  # a blocking send on every rank: nobody receives
    dist.recv(output.view(n, -1)[(r - 1) % n], src=(r - 1) % n)


def test_checker_turns_a_deadlock_into_a_hint(no_leaks):
    with pytest.raises(ExerciseError, match=r"did not finish within 8 s.*HINT: post each step's send and receive together"):
        check.ring_all_gather(_deadlocks, timeout=8)   # its own launch: 3 gloo ranks


def test_checker_wants_a_function_one_way_to_run_and_three_gloo_ranks(gloo2):
    with pytest.raises(ExerciseError, match="expected a function"):
        check.ring_all_reduce(42, backend="gloo")
    with pytest.raises(ValueError, match="either pool= or backend="):
        check.ring_all_gather(_stub, pool=object(), backend="gloo")
    for bad in ({"pool": gloo2}, {"world_size": 2}, {"backend": "nccl"}):
        with pytest.raises(ValueError, match=r"judges a ring on 3 or more gloo ranks.*HINT: on 2 ranks sending the "
                                             r"whole tensor"):
            check.ring_all_reduce(_my_ring_all_reduce, **bad)


# ---- the overlap exercise: a pipelined all-reduce --------------------------------------------------------------
def _pipelined(chunks, produce):  # a learner's correct answer
    works = []
    for i, chunk in enumerate(chunks):
        produce(i)
        works.append(dist.all_reduce(chunk, async_op=True))
    for w in reversed(works):     # any order, once everything is produced
        w.wait()


def _blocking(chunks, produce):
    for i, chunk in enumerate(chunks):
        produce(i)
        dist.all_reduce(chunk)


def _waits_at_once(chunks, produce):
    for i, chunk in enumerate(chunks):
        produce(i)
        dist.all_reduce(chunk, async_op=True).wait()


def _starts_after_everything(chunks, produce):
    for i in range(len(chunks)):
        produce(i)
    for w in [dist.all_reduce(chunk, async_op=True) for chunk in chunks]:
        w.wait()


def _never_waits_for_the_last(chunks, produce):
    works = []
    for i, chunk in enumerate(chunks):
        produce(i)
        works.append(dist.all_reduce(chunk, async_op=True))
    for w in works[:-1]:
        w.wait()
    works[-1].is_completed()  # looked at, never waited for
    dist.barrier()


def _one_call_for_everything(chunks, produce):
    for i in range(len(chunks)):
        produce(i)
    flat = torch.cat([c.reshape(-1) for c in chunks])
    dist.all_reduce(flat, async_op=True).wait()
    for c, part in zip(chunks, flat.split([c.numel() for c in chunks])):
        c.copy_(part.view_as(c))


def test_pipelined_all_reduce_three_states(capsys, checkers):
    assert check.pipelined_all_reduce(_pipelined, pool=checkers) is None
    out = capsys.readouterr().out
    assert out.startswith(f"✓ pipelined all-reduce: every chunk summed on every rank of {checkers.world_size} "
                          "(4 chunk(s), 1 chunk(s)); each chunk's all_reduce started right after it was produced")
    check.pipelined_all_reduce(solution.pipelined_all_reduce, pool=checkers)
    assert check.pipelined_all_reduce(_stub, pool=checkers) is None
    out, err = capsys.readouterr()
    assert out.startswith("✓ pipelined") and "not attempted: your pipelined all-reduce" in err and "solutions" not in err


@pytest.mark.parametrize("fn, pattern", [
    (_blocking, r"rank 0: an all_reduce was called without async_op=True. HINT: a blocking all_reduce returns only"),
    (_waits_at_once, r"the work of chunk\(s\) \[0, 1, 2\] was waited for before the last chunk was produced\. "
                     r"HINT: wait only once every chunk is produced"),
    (_starts_after_everything, r"chunk 0's all_reduce started only after produce\(1\)\. HINT: start it right after "
                               r"produce\(0\)"),
    (_never_waits_for_the_last, r"4 chunk\(s\), rank 0: the work of chunk\(s\) \[3\] was never waited for"),
    (_one_call_for_everything, r"it all-reduced 1 tensor\(s\) of \[5192\] B; the chunks are \[4000, 148, 1024, 20\] B\. "
                               r"HINT: all-reduce each chunk itself, in place"),
])
def test_pipelined_all_reduce_rejects_wrong_answers(fn, pattern, checkers):
    with pytest.raises(ExerciseError, match=pattern):
        check.pipelined_all_reduce(fn, pool=checkers)


def test_pipelined_all_reduce_wants_three_gloo_ranks(gloo2):
    with pytest.raises(ValueError, match=r"3 or more gloo ranks.*HINT"):
        check.pipelined_all_reduce(_pipelined, pool=gloo2)
    with pytest.raises(ExerciseError, match="expected a function"):
        check.pipelined_all_reduce("my_fn")
