"""``labutils bench`` on real GPUs (NCCL): every collective and placement correct at small and large
sizes, other datatypes, the buggy all_reduce caught, the CUDA-graph mode (capture, replay, results
checked after replay), the bare loops beside the eager ones, the CLI end to end. No timing asserts.
Skipped unless the machine has >= 2 GPUs.

Run: pytest tests/gpu/test_bench_gpu.py -q     (>= 2 GPUs; about 1 min, mostly NCCL start-up)
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import cloudpickle
import pytest
import torch.distributed as dist

import labutils
from labutils import bandwidth
from labutils.bench import graph, ops, sweep
from labutils.bench.config import BenchConfig

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)

pytestmark = pytest.mark.gpu
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this module
ROOT = Path(__file__).resolve().parents[2]


def _correctness(rank, world_size):
    out = {}
    # small sizes, and one large one per collective (buffer views, in place at NCCL's offsets)
    cfg = BenchConfig(minbytes=8, maxbytes=2**20, stepfactor=32, timed=False, latency=False)
    out["float"] = sweep.sweep(rank, world_size, cfg)["rows"]
    big = BenchConfig(minbytes=256 * 2**20, maxbytes=256 * 2**20, timed=False, latency=False)
    out["big"] = sweep.sweep(rank, world_size, big)["rows"]
    for dtype, op in (("bfloat16", "sum"), ("half", "avg"), ("int8", "prod"), ("int64", "max")):
        c = BenchConfig(minbytes=1024, maxbytes=2**20, stepfactor=1024, datatype=dtype, redop=op,
                                  root=world_size - 1, timed=False, latency=False)
        out[f"{dtype} {op}"] = sweep.sweep(rank, world_size, c)["rows"]
    out["bug"] = ops.verify_one(rank, world_size, "all_reduce", 4096,
                                     run=lambda c: dist.all_reduce(c.out.clone()))
    return out


@needs_gpus(2)
def test_every_collective_is_correct_on_nccl():
    out = labutils.launch(_correctness, backend="nccl", timeout=300)[0]
    n = labutils.default_config(verbose=False).world_size
    for key in ("float", "big", "bfloat16 sum", "half avg", "int8 prod", "int64 max"):
        rows = out[key]
        assert {r["collective"] for r in rows} == set(bandwidth.OPS), key
        bad = [(r["collective"], r["placement"], r["size_bytes"], r["wrong"]) for r in rows if r["wrong"] != 0]
        assert not bad, (key, bad)
    assert out["bug"] == n * 4096 // 4


def _timed(rank, world_size):
    cfg = BenchConfig(minbytes=8, maxbytes=64 * 2**20, stepfactor=64, repeat=2)
    return sweep.sweep(rank, world_size, cfg)


@needs_gpus(2)
def test_timed_sweep_rows_are_consistent():
    res = labutils.launch(_timed, backend="nccl", timeout=300)[0]
    n = res["meta"]["world_size"]
    assert res["meta"]["backend"] == "nccl" and all(d["device"].startswith("cuda:") for d in res["meta"]["devices"])
    assert res["latency"]["size_bytes"] == 8 and res["latency"]["time_us"] > 0
    for r in res["rows"]:
        assert r["wrong"] == 0 and r["time_us"] > 0
        assert r["busbw_gbps"] == pytest.approx(bandwidth.busbw_gbps(r["collective"], r["size_bytes"],
                                                                     r["time_us"] * 1e-3, n))


def _graph_mode(rank, world_size):
    import torch
    out = {}
    # every collective, small sizes and one large, results checked after replaying a captured graph
    cfg = BenchConfig(minbytes=8, maxbytes=4 * 2**20, stepfactor=64, repeat=2, cuda_graph=3)
    out["sweep"] = sweep.sweep(rank, world_size, cfg)
    # a captured all_reduce replayed 5 times in place: 5 sums, not one (the graph re-runs the kernels)
    x = torch.ones(4, device="cuda")
    g = graph.capture(lambda k: [dist.all_reduce(x) for _ in range(k)], 1)
    x.fill_(1.0)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
    out["replayed"] = x.tolist()
    return out


@needs_gpus(2)
def test_graph_mode_is_correct_on_nccl():
    out = labutils.launch(_graph_mode, backend="nccl", timeout=300)[0]
    res, n = out["sweep"], out["sweep"]["meta"]["world_size"]
    assert res["mode"] == "graph" and res["meta"]["config"]["cuda_graph"] == 3
    assert {r["collective"] for r in res["rows"]} == set(bandwidth.OPS)
    bad = [(r["collective"], r["placement"], r["size_bytes"], r["wrong"]) for r in res["rows"] if r["wrong"] != 0]
    assert not bad, bad
    assert all(r["mode"] == "graph" and r["time_us"] > 0 and r["bare_us"] is None for r in res["rows"])
    assert res["latency"]["mode"] == "eager" and res["latency"]["bare_us"] > 0
    assert res["graph_latency"]["mode"] == "graph" and res["graph_latency"]["wrong"] == 0
    assert out["replayed"] == [float(n ** 5)] * 4


@needs_gpus(2)
def test_cli_graph_mode_on_gpus(tmp_path):
    out = subprocess.run([sys.executable, "-m", "labutils", "bench", "-b", "8", "-e", "64K", "-f", "64",
                          "--collectives", "all_reduce,send_recv,send_one_way", "-G", "5",
                          "--json", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "# mode: CUDA graph (-G 5)" in out.stdout and "# 8-byte all_reduce, timed first (CUDA graph):" in out.stdout
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["summary"]["wrong_total"] == 0 and doc["summary"]["graph_latency_us"] > 0


@needs_gpus(2)
def test_cli_on_gpus(tmp_path):
    out = subprocess.run([sys.executable, "-m", "labutils", "bench", "-b", "1K", "-e", "4M", "-f", "16",
                          "--json", str(tmp_path / "g.json")], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["meta"]["backend"] == "nccl" and "NVIDIA" in doc["fingerprint"]
    assert doc["summary"]["wrong_total"] == 0 and doc["summary"]["latency_us"] > 0
    assert "# Peak bus bandwidth" in out.stdout and "# bench / bare loop    : latency" in out.stdout
