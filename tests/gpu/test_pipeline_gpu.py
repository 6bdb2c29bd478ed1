"""Lab 04 on real GPUs: the split model on cuda:0 + cuda:1 in one process, the notebook's GPipe loop
(loaded from notebooks/src/04_pipeline.py), the 1F1B reference and torch.distributed.pipelining over
NCCL against the one-device model, and the measurement functions on a small model (structure and
memory ordering, no timing asserts). Skipped without 2 GPUs.

Run: pytest tests/gpu/test_pipeline_gpu.py -q     (>= 2 GPUs; ~1 min, mostly rank start-up)
"""
from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import labutils
from labutils.labs.lab04_pipeline import analysis, measure, model, naive, pipelining, schedule, verify
from labutils.labs.lab04_pipeline.claims import CLAIMS
from labutils.solutions import lab04 as solution

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)
from notebook_defs import load_definitions

nb = load_definitions("04_pipeline")

pytestmark = pytest.mark.gpu

SMALL_BENCH = {"n_layers": 4, "hidden": 512, "rows": 2048, "dtype": "bfloat16", "ms": [1, 4, 8],
               "schedule_m": 8, "warmup": 1, "repeat": 2}


@needs_gpus(2)
def test_naive_split_over_two_gpus_equals_one_gpu():
    devs = [torch.device("cuda:0"), torch.device("cuda:1")]
    blocks = model.make_blocks(4, 16, device=devs[0], dtype=torch.float64)
    x, y = model.make_batch(24, 16, device=devs[0], dtype=torch.float64)
    ref = nn.Sequential(*[b for b in model.make_blocks(4, 16, device=devs[0], dtype=torch.float64)])
    F.mse_loss(ref(x), y).backward()
    stages = [nn.Sequential(*blocks[a:b]).to(d) for (a, b), d in zip(schedule.partition(4, 2), devs)]
    loss = naive.naive_step(stages, devs, x, y, F.mse_loss)
    assert loss.device == devs[1]
    torch.testing.assert_close(loss.to(devs[0]), F.mse_loss(ref(x), y).detach())
    torch.testing.assert_close([q.grad.to(devs[0]) for s in stages for q in s.parameters()],
                               [q.grad for q in ref.parameters()])


@needs_gpus(2)
def test_notebook_gpipe_step_and_1f1b_over_nccl_equal_one_device(no_leaks):
    def both(rank, world_size):
        return {"gpipe": verify.against_one_device(rank, world_size, nb.gpipe_step, (1, 4, 8)),
                "1f1b": verify.against_one_device(rank, world_size, solution.one_f_one_b_step, (2, 8),
                                                  record_order=True)}
    res = labutils.launch(both, world_size=2, backend="nccl")
    verify.report([r["gpipe"] for r in res], "gpipe_step over NCCL")
    verify.report([r["1f1b"] for r in res], "one_f_one_b_step over NCCL")


@needs_gpus(2)
def test_torch_pipelining_over_nccl_equals_one_device(no_leaks):
    def both(rank, world_size):
        return {s: verify.against_one_device(rank, world_size, functools.partial(pipelining.torch_schedule_step, schedule=s), (2, 4))
                for s in pipelining.available_schedules()}
    res = labutils.launch(both, world_size=2, backend="nccl")
    for s in res[0]:
        verify.report([r[s] for r in res], s)


@needs_gpus(2)
def test_measure_one_process_on_two_gpus():
    d = naive.measure_one_process(SMALL_BENCH)
    json.dumps(d)
    lanes = {s["lane"] for s in d["spans"]}
    assert lanes == {"stage 0 (cuda:0)", "stage 1 (cuda:1)"}
    assert all(0 < b < 1 for b in schedule.bubble_from_spans(d["spans"])["bubble"].values())
    assert d["one_gpu_rested_ms"] > 0 and len(d["one_gpu_rested_samples_ms"]) == SMALL_BENCH["repeat"]
    for reading in d["gpu_clock"].values():  # None where pynvml is missing
        assert reading is None or (reading["clock_mhz"] > 0 and reading["power_w"] > 0)
    assert CLAIMS["04_naive_one_process"](d)


@needs_gpus(2)
def test_measure_rank_over_nccl(no_leaks):
    res = labutils.launch(measure.measure_rank, nb.gpipe_step, SMALL_BENCH, world_size=2, backend="nccl",
                          timeout=300)
    d = measure.merge(res, SMALL_BENCH)
    json.dumps(d)
    assert all(0 <= b < 1 for b in d["bubble_measured"]) and all(t > 0 for t in d["step_ms"])
    mem = d["memory_bytes"]
    assert all(v is not None and v > 0 for vs in mem.values() for v in vs)
    assert analysis.memory_prediction(d) is not None
    assert all(0 <= r["host_wait"] < 1 for r in analysis.bubble_breakdown(d))
    assert CLAIMS["04_pipeline_bench"](d)
    # GPipe holds all 8 micro-batches on stage 0, 1F1B at most p = 2 of them
    assert mem["torch gpipe m=8"][0] > mem["torch 1f1b m=8"][0]
    assert mem["ours m=8"][0] > mem["torch 1f1b m=8"][0]
    assert set(d["schedules_ms"]) == {"gpipe", "1f1b"}
    ops = measure.comm_summary(d)["ops"]
    assert len(ops) == 2 * len(SMALL_BENCH["ms"]) and all(op["measured_ms"] > 0 for op in ops)


@needs_gpus(1)
def test_power_timeline_on_one_gpu_reads_the_reasons_in_every_phase():
    from labutils.labs.lab04_pipeline import boost, power
    from labutils.labs.lab04_pipeline.claims import power_timeline_verdicts
    data = boost.power_timeline(rest_s=0.3, run_s=0.6)   # the lab's own step
    json.dumps(data)  # JSON-able, as a recording must be
    phases = {s["phase"] for s in data["samples"]}
    assert phases == set(boost.PHASES)
    assert all(s["t_s"] >= 0 and s["clock_mhz"] > 0 for s in data["samples"])
    assert data["step_ms"]["back to back"] and data["step_ms"]["rested steps"]
    assert power.readings(data["samples"], "back to back") and power.readings(data["samples"], "rested steps")
    assert any(s["reasons"] is not None for s in data["samples"]), "NVML gave no clock-event reasons"
    verdicts = power_timeline_verdicts(data)
    assert {v.verdict for v in verdicts} <= {"TRUE", "FALSE"} and len(verdicts) >= 4
