"""``python -m labutils bench`` on CPU: arguments, sizes, table format, CSV/JSON, and the correctness
check with real gloo ranks (no mocks): right collectives give #wrong 0, buggy ones are caught."""
import argparse
import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils import bandwidth
from labutils.bench import analysis, config as bconfig, files, graph, ops, report, sweep
from labutils.commands import bench as bench_cli
from labutils.__main__ import main

ROOT = Path(__file__).resolve().parent.parent
# The rank functions below travel by value: the ranks need not be able to import this test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ---------------------------------------------------------------------------- arguments
@pytest.mark.parametrize("text, size", [("8", 8), ("1K", 1024), ("1k", 1024), ("64M", 64 * 2**20),
                                        ("1G", 2**30), ("1.5M", 3 * 2**19), ("4KiB", 4096), ("2KB", 2048)])
def test_parse_size_binary_units(text, size):
    assert bench_cli.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "1X", "-1", "0", "K", "1.2.3", "0.5"])
def test_parse_size_rejects_with_hint(text):
    with pytest.raises(argparse.ArgumentTypeError, match="HINT: bytes or a binary unit"):
        bench_cli.parse_size(text)


@pytest.mark.parametrize("argv, message", [
    (["-b", "1X"], "invalid size '1X'"),
    (["-f", "1"], "expected an integer >= 2"),
    (["-d", "uint32"], "unknown datatype 'uint32'. HINT"),
    (["-o", "mean"], "unknown reduction 'mean'. HINT"),
    (["--collectives", "allreduce,gossip"], "unknown collective 'gossip'. HINT"),
    (["-b", "1M", "-e", "1K"], "minbytes 1048576 > maxbytes 1024. HINT"),
    (["-o", "avg", "-d", "int32"], "avg of int32 is not defined here. HINT"),
    (["--root", "5"], "--root 5 is not a rank of 2. HINT"),
    (["--world-size", "1"], "expected an integer >= 2"),
    (["--json", "/no/such/folder/r.json"], "folder /no/such/folder does not exist. HINT"),
    (["--backend", "nccl"], "needs CUDA GPUs"),
    (["-G", "-1"], "expected an integer >= 0"),
    (["--cuda-graph", "5", "--backend", "gloo"], "--cuda-graph needs NCCL on GPUs, but the backend is gloo"),
])
def test_bad_arguments_are_usage_errors(argv, message, capsys):
    if message == "needs CUDA GPUs" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as info:
        main(["bench", *argv])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "usage:" not in err and err.endswith("(see python -m labutils bench --help)\n")


def test_help_is_plain_text_that_agrees_with_the_header(capsys):
    for argv in ([], ["bench"], ["run-labs"], ["workspace"], ["hw"]):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        text = capsys.readouterr().out
        assert "``" not in text and ":mod:" not in text, f"reST markup in {argv} --help"
        assert "labutils.bench" not in text and "engine" not in text  # what it does, not how it is built
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert bconfig.AUTO_ITERS in " ".join(capsys.readouterr().out.split())  # -n's help, as the header says


def test_collectives_accept_aliases_and_all():
    args = argparse.ArgumentParser()
    bench_cli.add_arguments(args)
    ns = args.parse_args(["--collectives", "allreduce, all_gather_into_tensor,p2p", "-d", "bf16", "-o", "MAX"])
    assert ns.collectives == ("all_reduce", "all_gather", "send_recv")
    assert (ns.datatype, ns.op) == ("bfloat16", "max")
    assert args.parse_args(["--collectives", "all"]).collectives == bandwidth.OPS


# ---------------------------------------------------------------------------- sizes and iterations
@pytest.mark.parametrize("coll, n, count, size, ins, outs", [
    ("all_reduce", 2, 256, 1024, 256, 256),
    ("all_gather", 2, 128, 1024, 128, 256),       # count = per-rank input, S = gathered output
    ("reduce_scatter", 2, 128, 1024, 256, 128),   # count = per-rank output, S = input
    ("all_to_all", 2, 128, 1024, 256, 256),       # count = per peer, S = one rank's send buffer
    ("all_gather", 3, 85, 1020, 85, 255),         # rounded down to whole elements per rank
    ("all_to_all", 3, 85, 1020, 255, 255),
    ("send_recv", 3, 256, 1024, 256, 256),
    ("all_gather", 4, 0, 0, 0, 0),                # 8 B of float on 4 ranks: nothing per rank
])
def test_layout_matches_nccl_tests(coll, n, count, size, ins, outs):
    s = 8 if count == 0 else 1024
    assert bconfig.layout(coll, s, 4, n) == {"count": count, "size_bytes": size, "in_numel": ins, "out_numel": outs}


def test_auto_iters_more_for_small_fewer_for_big_messages():
    assert [bconfig.auto_iters(s) for s in (8, 2**20, 2**20 + 1, 2**26, 2**27, 2**28, 2**30)] == \
        [100, 100, 20, 20, 10, 5, 5]
    cfg = bconfig.BenchConfig(iters=7)
    assert cfg.iters_for(2**30) == 7 and bconfig.BenchConfig().iters_for(2**30) == 5


@pytest.mark.parametrize("n, roles", [
    (2, [("send", 1), ("recv", 0)]),
    (3, [("send", 1), ("recv", 0), (None, None)]),          # a last odd rank idles
    (4, [("send", 1), ("recv", 0), ("send", 3), ("recv", 2)]),
])
def test_one_way_pairs(n, roles):
    assert [bconfig.one_way_peer(r, n) for r in range(n)] == roles


def test_graph_mode_is_for_nccl_only():
    graph.require_graphs("nccl")
    with pytest.raises(ValueError, match="gloo runs on the CPU and has no CUDA graphs. HINT: drop --cuda-graph"):
        graph.require_graphs("gloo")
    with pytest.raises(ValueError, match="cuda_graph must be an integer >= 0"):
        bconfig.BenchConfig(cuda_graph=-2)


def test_planned_points_skip_empty_sizes():
    cfg = bconfig.BenchConfig(minbytes=8, maxbytes=64, collectives=("all_reduce", "all_gather"))
    assert cfg.sizes() == [8, 16, 32, 64]
    assert bconfig.planned_points(cfg, 2) == 8
    assert bconfig.planned_points(cfg, 4) == 4 + 3  # all_gather of 8 B on 4 ranks has no element


@pytest.mark.parametrize("kw, message", [({"minbytes": 0}, "minbytes must be an integer >= 1"),
                                         ({"iters": 0}, "iters must be an integer >= 1"),
                                         ({"collectives": ()}, "must be distinct and not empty"),
                                         ({"redop": "xor"}, "unknown reduction"),
                                         ({"datatype": "fp8"}, "unknown datatype")])
def test_config_errors(kw, message):
    with pytest.raises(ValueError, match=message):
        bconfig.BenchConfig(**kw)


# ---------------------------------------------------------------------------- the check itself
def test_count_wrong_counts_elements():
    exp = torch.arange(10, dtype=torch.float32)
    got = exp.clone()
    got[[1, 4, 7]] += 1
    assert bconfig.count_wrong(exp.clone(), exp) == 0
    assert bconfig.count_wrong(got, exp) == 3
    got[0] = math.nan
    assert bconfig.count_wrong(got, exp) == 4
    assert bconfig.count_wrong(torch.tensor([1, 2, -3], dtype=torch.int8),
                                 torch.tensor([1, 2, 3], dtype=torch.int8)) == 1
    with pytest.raises(ValueError, match="shape"):
        bconfig.count_wrong(exp[:3], exp)


# ---------------------------------------------------------------------------- table and files
def _row(coll, placement, size, time_us, wrong=0, n=2):
    lay = bconfig.layout(coll, size, 4, n)
    ms = time_us * 1e-3
    return {"collective": coll, "placement": placement, "size_bytes": lay["size_bytes"], "count": lay["count"],
            "type": "float", "redop": "sum" if coll in bconfig.REDUCING else "none",
            "root": 0 if coll in bconfig.ROOTED else -1, "time_us": time_us, "p10_us": time_us,
            "p90_us": time_us, "algbw_gbps": bandwidth.algbw_gbps(lay["size_bytes"], ms),
            "busbw_gbps": bandwidth.busbw_gbps(coll, lay["size_bytes"], ms, n), "wrong": wrong,
            "iters": 20, "repeat": 5}


def _doc(alpha_us=10.0, beta_gbps=100.0, wrong=0):
    """A synthetic run whose times follow t = alpha + S / beta exactly."""
    rows = []
    for coll in ("all_reduce", "all_gather", "send_recv"):
        for k in range(10, 31, 4):
            for p in bconfig.FORMS[coll]:
                rows.append(_row(coll, p, 2**k, alpha_us + 2**k / (beta_gbps * 1e3), wrong if k == 30 else 0))
    cfg = bconfig.BenchConfig(minbytes=1024, maxbytes=2**30, stepfactor=16).to_dict()
    meta = {"world_size": 2, "backend": "nccl", "config": cfg, "nodes": 1, "torch_version": "x",
            "devices": [{"rank": r, "host": "h", "device": f"cuda:{r}", "name": "GPU"} for r in (0, 1)]}
    result = {"meta": meta, "latency": _row("all_reduce", "in-place", 8, 12.5), "rows": rows, "elapsed_s": 1.0}
    return report.make_doc(result, fingerprint="2x GPU | NV18 | torch x", link_peak_gbps=200.0,
                                 command="python -m labutils bench")


def test_row_line_is_nccl_tests_format():
    line = report.row_line([_row("all_gather", "out-of-place", 1024, 12.345),
                                  _row("all_gather", "in-place", 1024, 1234.5, wrong=3)])
    assert line == ("        1024           128     float    none      -1"
                    "    12.35    0.08    0.04      0   1234.5    0.00    0.00      3")
    names = report.block_lines("all_gather")[3]
    assert len(line) == len(names)  # columns line up with the header
    solo = report.row_line([_row("all_reduce", "in-place", 2**30, 25000.0)])
    assert solo.split()[5:9] == ["N/A"] * 4 and solo.split()[9] == "25000"


@pytest.mark.parametrize("us, text", [(1.234, "1.23"), (123.45, "123.5"), (12345.6, "12346"), (None, "N/A")])
def test_time_format(us, text):
    assert report.format_time_us(us) == text


def test_summary_average_peak_latency_and_link():
    doc = _doc()
    s = doc["summary"]
    busbw = [r["busbw_gbps"] for r in doc["rows"]]
    assert s["points"] == len(busbw) and s["avg_busbw_gbps"] == pytest.approx(sum(busbw) / len(busbw))
    assert s["peak"]["busbw_gbps"] == max(busbw)
    assert s["busbw_at_max"]["all_gather"]["size_bytes"] == 2**30
    assert s["latency_us"] == 12.5 and s["wrong_total"] == 0
    assert s["peak_fraction_of_link"] == pytest.approx(max(busbw) / 200.0)
    text = "\n".join(report.summary_lines(s))
    assert "0 OK" in text and "8-byte all_reduce   : 12.50 us timed first" in text and "of the link peak 200.0" in text
    bad = _doc(wrong=7)["summary"]
    assert bad["wrong_total"] == 7 * 4 and "FAILED" in report.summary_lines(bad)[0]


def test_bench_over_bare_latency_and_graph_lines():
    doc = _doc()
    doc["latency"].update(bare_us=12.5 / 1.04, sample_start_us=60.0, iters=100)
    doc["rows"][0]["bare_us"] = doc["rows"][0]["time_us"] / 1.2
    doc["graph_latency"] = {**_row("all_reduce", "in-place", 8, 4.25), "mode": "graph", "replays": 20}
    doc["summary"] = report.summarize(doc)
    assert report.bench_over_bare(doc) == {"latency": pytest.approx(1.04), "all_reduce": pytest.approx(1.2)}
    line = report.latency_line(doc["latency"])
    assert "bare loop 12.02 us, bench/bare 1.04" in line and "per-sample start 60 us = +0.60 us per call" in line
    assert report.latency_line(doc["graph_latency"]).startswith(
        "# 8-byte all_reduce, timed first (CUDA graph): 8 B (2 x float, in place), per call of 20 back to back")
    text = "\n".join(report.table_lines(doc))
    assert "# 8-byte all_reduce   : 4.25 us timed first, replayed from a CUDA graph" in text
    assert "# bench / bare loop    : 8 B all_reduce timed first 1.04 | all_reduce 1.20" in text
    assert "goal <= 1.15 for every one: NOT met" in text
    assert [r["kind"] for r in files.csv_rows(doc)][:2] == ["latency", "latency"]
    assert "replayed from a CUDA graph: 4.25 us" in report.link_note(doc)
    old = _doc()  # a recording made before bare loops and graphs: nothing to show, nothing breaks
    assert report.bench_over_bare(old) == {} and "bench / bare" not in "\n".join(report.table_lines(old))


def test_header_says_mode_and_send_recv_forms():
    doc = _doc()
    head = "\n".join(report.header_lines(doc))
    assert "# mode: eager: `iters` calls back to back between two CUDA events" in head
    assert "# send_recv: nccl-tests' ring" in head and "batch_isend_irecv" in head
    doc["meta"]["config"].update(cuda_graph=20, collectives=["all_reduce", "send_one_way"])
    head = "\n".join(report.header_lines(doc))
    assert "| cuda graph launches: 20" in head and "# mode: CUDA graph (-G 20)" in head
    assert "# send_one_way: rank 2k sends S to 2k+1" in head and "# send_recv:" not in head


def test_table_lines_have_header_blocks_and_summary():
    lines = report.table_lines(_doc())
    assert lines[1] == "# fingerprint: 2x GPU | NV18 | torch x"
    assert sum(line == "# all_gather" for line in lines) == 1
    assert any(line.startswith("# 8-byte all_reduce, timed first: 8 B (2 x float, in place), per call of 20 back to "
                               "back: 12.50 us") for line in lines)
    assert lines[-2].startswith("# 8-byte all_reduce   :") and lines[-1] == "# Duration             : 1.0 s sweep"
    assert any(line.startswith("# 8-byte all_reduce, timed first: the table's own loop") for line in lines)


def test_the_line_timed_first_and_the_tables_8_byte_row_are_named_apart():
    """Two numbers of one loop at two moments: the summary names both, and the prediction's row is the table's."""
    doc = _doc()
    doc["rows"].insert(0, _row("all_reduce", "in-place", 8, 28.5))
    doc["latency"] = _row("all_reduce", "in-place", 8, 40.5)
    doc["summary"] = report.summarize(doc)
    assert doc["summary"]["table_8b_us"] == 28.5 and doc["summary"]["latency_us"] == 40.5
    line = next(x for x in report.summary_lines(doc["summary"]) if x.startswith("# 8-byte all_reduce"))
    assert "40.50 us timed first" in line and "the table's 8 B row, the same loop later: 28.50 us" in line
    assert report.table_8b_us(_doc()) is None   # a table that starts above 8 B has no such row


@pytest.mark.parametrize("ratios, verdict", [({"latency": 1.01, "all_reduce": 1.03, "send_recv": 1.14}, "TRUE"),
                                             ({"latency": 1.01, "all_reduce": 1.03, "send_recv": 1.32}, "FALSE")])
def test_bench_over_bare_goal_is_one_rule_for_the_summary_and_the_verdict(ratios, verdict):
    """A median of 1.03 with one collective at 1.32 is not "adds almost nothing": every collective must meet it,
    and the summary line says "met" exactly when the verdict is TRUE."""
    v = report.bare_verdict(ratios)
    assert v.verdict == verdict and "8 B all_reduce timed first 1.01x" in v.figure
    doc = _doc()
    doc["rows"][0]["bare_us"] = doc["rows"][0]["time_us"]
    summary = {**report.summarize(doc), "bench_over_bare": ratios}
    text = "\n".join(report.summary_lines(summary))
    assert f"goal <= 1.15 for every one: {'met' if verdict == 'TRUE' else 'NOT met'}" in text


def test_csv_and_json_round_trip(tmp_path):
    doc = _doc()
    files.write_csv(tmp_path / "r.csv", doc)
    with open(tmp_path / "r.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1 + len(doc["rows"]) and rows[0]["kind"] == "latency"
    assert {r["fingerprint"] for r in rows} == {"2x GPU | NV18 | torch x"}
    assert float(rows[1]["busbw_gbps"]) == pytest.approx(doc["rows"][0]["busbw_gbps"])
    files.write_json(tmp_path / "r.json", doc)
    back = files.load_json(tmp_path / "r.json")
    assert back["fingerprint"] == doc["fingerprint"] and back["summary"] == json.loads(json.dumps(doc["summary"]))
    (tmp_path / "other.json").write_text('{"name": 1}')
    with pytest.raises(ValueError, match="not a labutils bench result.*HINT"):
        files.load_json(tmp_path / "other.json")


def test_fits_recover_alpha_beta_and_interpolation():
    doc = _doc(alpha_us=10.0, beta_gbps=100.0)
    fits = analysis.fits(doc)
    assert set(fits) == {"all_reduce", "all_gather", "send_recv"}
    assert fits["all_reduce"].alpha_us == pytest.approx(10.0, rel=1e-6)
    assert fits["all_reduce"].beta_gbps == pytest.approx(100.0, rel=1e-6)
    t = analysis.time_us_at(doc, "all_reduce", 2**14)
    assert t == pytest.approx(10.0 + 2**14 / 1e5)  # exactly a measured point
    mid = analysis.time_us_at(doc, "all_reduce", 2**16)  # between 2^14 and 2^18
    assert min(10 + 2**14 / 1e5, 10 + 2**18 / 1e5) < mid < max(10 + 2**14 / 1e5, 10 + 2**18 / 1e5)
    assert analysis.time_us_at(doc, "all_reduce", 8) is None  # outside the sweep


def test_busbw_figure_and_note():
    doc = _doc()
    fig = analysis.busbw_figure(doc, prediction=(2**30, 150.0))
    labels = [line.get_label() for line in fig.axes[0].lines]
    assert "all_gather (out-of-place)" in labels and "your prediction" in labels
    note = report.link_note(doc)
    assert "| all_gather (out-of-place) | 1 GiB |" in note and "8-byte all_reduce, timed first (per call back to back): 12.50 us" in note


# ---------------------------------------------------------------------------- real gloo ranks
SMALL = bconfig.BenchConfig(minbytes=8, maxbytes=4096, stepfactor=8, iters=2, repeat=2, warmup_iters=1)


def _all_to_wrong_root(case):  # broadcasts from the wrong root
    dist.broadcast(case.out, src=(case.root + 1) % case.world_size)


def _max_not_sum(case):
    dist.reduce_scatter_tensor(case.out, case.inp, op=dist.ReduceOp.MAX)


def _swapped_gather(case):  # gathers the ranks' chunks in reverse order
    parts = [torch.empty_like(case.inp) for _ in range(case.world_size)]
    dist.all_gather(parts, case.inp)
    case.out.copy_(torch.cat(parts[::-1]))


def _sweep_and_bugs(rank, world_size):
    result = sweep.sweep(rank, world_size, SMALL)
    bugs = {"copy": ops.verify_one(rank, world_size, "all_reduce", 1024,
                                        run=lambda c: dist.all_reduce(c.out.clone())),
            "root": ops.verify_one(rank, world_size, "broadcast", 1024, run=_all_to_wrong_root),
            "max": ops.verify_one(rank, world_size, "reduce_scatter", 1024, run=_max_not_sum),
            "order": ops.verify_one(rank, world_size, "all_gather", 1024, run=_swapped_gather),
            "good": ops.verify_one(rank, world_size, "all_gather", 1024, run=None),
            "both_ways": ops.verify_one(rank, world_size, "send_one_way", 1024, run=_both_ways)}
    try:  # graph mode on gloo ranks: a clear error on every rank, before anything runs
        sweep.sweep(rank, world_size, bconfig.BenchConfig(maxbytes=64, cuda_graph=3))
        bugs["graph"] = "ran"
    except ValueError as exc:
        bugs["graph"] = str(exc)
    return result, bugs


def _both_ways(case):  # the ring exchange, checked as a one-way send: the sender's output is overwritten
    n = case.world_size
    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, case.inp, (case.rank + 1) % n),
                                        dist.P2POp(dist.irecv, case.out, (case.rank - 1) % n)]):
        work.wait()


def test_sweep_on_gloo_checks_every_result_and_catches_bugs(no_leaks):
    (result, bugs), (result1, _) = labutils.launch(_sweep_and_bugs, world_size=2, backend="gloo", timeout=120)
    rows = result["rows"]
    assert result1["rows"] == rows  # every rank reports the slowest rank's numbers
    n_sizes = len(SMALL.sizes())
    assert len(rows) == sum(n_sizes * len(bconfig.FORMS[c]) for c in bandwidth.OPS)
    assert all(r["wrong"] == 0 for r in rows) and result["latency"]["wrong"] == 0
    for r in rows:
        assert r["time_us"] > 0 and r["iters"] == 2 and r["repeat"] == 2
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * bandwidth.bus_factor(r["collective"], 2))
    assert {r["placement"] for r in rows if r["collective"] == "all_gather"} == {"out-of-place", "in-place"}
    assert bugs["good"] == 0
    assert bugs["copy"] == 2 * 256                 # every element of every rank keeps its own value
    assert bugs["root"] > 0 and bugs["max"] > 0 and bugs["order"] > 0
    assert bugs["both_ways"] > 200                 # rank 0 (the sender) received rank 1's data
    assert "needs NCCL on GPUs" in bugs["graph"] and "HINT: drop --cuda-graph" in bugs["graph"]
    assert [d["device"] for d in result["meta"]["devices"]] == ["cpu", "cpu"]
    # a bare loop of the same torch call beside the benchmark's, at each collective's smallest size only
    first = {}
    for r in rows:
        first.setdefault(r["collective"], r)
    assert all((r["bare_us"] is not None) == (r is first[r["collective"]]) for r in rows)
    assert result["latency"]["bare_us"] > 0 and result["latency"]["sample_start_us"] >= 0
    assert result["mode"] == "eager" and result["graph_latency"] is None


def _dtype_matrix(rank, world_size):
    out = {}
    for dtype, redops in (("half", ("sum", "prod", "avg")), ("bfloat16", ("sum", "max")), ("int8", ("sum", "min")),
                          ("double", ("avg",))):
        for op in redops:
            cfg = bconfig.BenchConfig(minbytes=24, maxbytes=24 * 64, stepfactor=8, datatype=dtype, redop=op,
                                        root=world_size - 1, timed=False, latency=False)
            out[(dtype, op)] = [(r["collective"], r["placement"], r["wrong"])
                                for r in sweep.sweep(rank, world_size, cfg)["rows"]]
    return out


def test_three_ranks_other_dtypes_and_root_are_exact(no_leaks):
    out = labutils.launch(_dtype_matrix, world_size=3, backend="gloo", timeout=120)[0]
    for key, rows in out.items():
        assert rows and all(w == 0 for _, _, w in rows), (key, rows)


def _big_for_memory(rank, world_size):
    sweep.sweep(rank, world_size, bconfig.BenchConfig(maxbytes=2**50, minbytes=2**50))


def test_too_large_a_sweep_fails_before_allocating(no_leaks):
    with pytest.raises(labutils.RankError, match=r"MemoryError.*HINT: lower -e/--maxbytes"):
        labutils.launch(_big_for_memory, world_size=2, backend="gloo", timeout=60)


# ---------------------------------------------------------------------------- the command line
def _cli(*args, timeout=180, env=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                          env={**os.environ, **(env or {})})


CLI_ARGS = ["-b", "64", "-e", "4K", "-f", "8", "-n", "2", "--repeat", "2", "-w", "1", "--backend", "gloo"]


def test_cli_standalone_writes_table_csv_json_plot(tmp_path, no_leaks):
    out = _cli("-m", "labutils", "bench", *CLI_ARGS, "--json", str(tmp_path / "r.json"),
               "--csv", str(tmp_path / "r.csv"), "--plot", str(tmp_path / "r.png"))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "# CPU/gloo run:" in text  # labelled by backend, whatever the machine
    assert ("# fingerprint: CPU only" in text) == (not torch.cuda.is_available())
    assert text.count("#       size         count") == len(bandwidth.OPS) and "# Wrong elements       : 0 OK" in text
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["fingerprint"].startswith("CPU only") == (not torch.cuda.is_available())
    assert doc["meta"]["backend"] == "gloo"
    assert doc["command"].startswith("python -m labutils bench -b 64")
    assert (tmp_path / "r.png").stat().st_size > 1000
    with open(tmp_path / "r.csv") as f:
        assert len(list(csv.DictReader(f))) == 1 + len(doc["rows"])
    # --from-json re-prints the same table and returns 1 if the recording had wrong results
    again = _cli("-m", "labutils", "bench", "--from-json", str(tmp_path / "r.json"), "--note")
    assert again.returncode == 0
    body = [ln for ln in text.splitlines() if ln.startswith("  ") and ln.strip()[0].isdigit()]
    assert body and body == [ln for ln in again.stdout.splitlines() if ln in body]
    assert "| collective | size | busbw (GB/s)" in again.stdout
    doc["rows"][0]["wrong"] = 5
    doc.pop("summary")
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    bad = _cli("-m", "labutils", "bench", "--from-json", str(tmp_path / "bad.json"))
    assert bad.returncode == 1 and "5 wrong elements" in bad.stderr and "HINT" in bad.stderr


def test_cli_under_torchrun_rank0_prints(tmp_path, no_leaks):
    out = _cli("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "labutils", "bench",
               *CLI_ARGS, "--collectives", "all_reduce,send_recv", "--no-bare", "--json", str(tmp_path / "t.json"),
               env={"OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("# labutils bench:") == 1  # rank 0 only
    assert "bench/bare" not in out.stdout and "# bench / bare loop" not in out.stdout  # --no-bare
    doc = json.loads((tmp_path / "t.json").read_text())
    assert doc["meta"]["world_size"] == 2 and "under torchrun" in doc["command"]
    assert {r["collective"] for r in doc["rows"]} == {"all_reduce", "send_recv"}
