"""The one-GPU tracks of labs 01, 02, 04 and 08 on the CPU: the pieces that need no GPU (trace trimming and
labelling, NVML's reason bits and the name of its query, the summaries the verdicts read), the measurements
on CPU tensors where they run there, and what a learner without the recording is told.
"""
from __future__ import annotations

import json
import types

import pytest
import torch

from labutils import claims, hw, recorded
from labutils.labs.lab01_cuda_comm import claims as C01
from labutils.labs.lab01_cuda_comm import devices, one_gpu as lab01
from labutils.labs.lab02_tensor_parallel import claims as C02
from labutils.labs.lab02_tensor_parallel import one_gpu as lab02
from labutils.labs.lab04_pipeline import boost
from labutils.labs.lab04_pipeline import claims as C04
from labutils.labs.lab08_data_parallel import claims as C08
from labutils.labs.lab08_data_parallel import model as M08
from labutils.labs.lab08_data_parallel import one_gpu as lab08


def test_small_trace_keeps_what_a_reader_looks_at_and_labels_it(tmp_path):
    events = ([{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}}]
              + [{"ph": "X", "cat": "kernel", "pid": 1, "name": f"k{i}"} for i in range(5)]
              + [{"ph": "X", "cat": "python_function", "pid": 1, "name": "f"}] * 3)
    small = lab01.small_trace({"traceEvents": events}, max_events=4)
    assert [e.get("cat") for e in small["traceEvents"]] == [None, "kernel", "kernel", "kernel", "kernel"]
    assert small["dropped_events"] == 4
    m = recorded.Measurement("01_optimised_one_gpu", {"trace": small}, False, "1x GPU | torch x", "2026-12-01T00:00")
    path = lab01.write_trace(m, tmp_path)
    doc = json.loads(path.read_text())
    assert path.name == "01_optimised_one_gpu.RECORDED.json" and doc["otherData"]["source"] == m.source
    assert {"name": "process_labels", "ph": "M", "pid": 1, "args": {"labels": m.source}} in doc["traceEvents"]
    with pytest.raises(ValueError, match="holds no trace.*HINT: re-record"):
        lab01.write_trace(recorded.Measurement("x", {}, False, "f", "2026-12-01"), tmp_path)


def test_profile_program_on_the_cpu_standin():
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    data = json.loads(json.dumps(lab01.profile_program(lambda: x + y, devices.cpu_standin(1))))
    assert data["kernels"] == [] and data["devices"] == [] and data["trace"]["traceEvents"]
    assert [v.verdict for v in C01.optimised_verdicts(data)] == ["FALSE", "TRUE"]   # nothing moved, no NCCL


def test_clock_event_reasons_under_either_name():
    assert hw.reason_words(0x4 | 0x40) == ["software power cap", "hardware thermal slowdown"]
    assert hw.reason_words(0x1000) == ["0x1000"] and hw.reason_words(0) == []
    new = types.SimpleNamespace(nvmlDeviceGetCurrentClocksEventReasons=lambda h: 0x4)
    old = types.SimpleNamespace(nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x8)

    def missing(handle):
        raise RuntimeError("NVML_ERROR_FUNCTION_NOT_FOUND")
    both = types.SimpleNamespace(nvmlDeviceGetCurrentClocksEventReasons=missing,
                                 nvmlDeviceGetCurrentClocksThrottleReasons=lambda h: 0x20)
    assert hw.clock_event_reasons_query(new)(None) == 0x4
    assert hw.clock_event_reasons_query(old)(None) == 0x8
    assert hw.clock_event_reasons_query(both)(None) == 0x20   # new package, old driver
    assert hw.clock_event_reasons_query(types.SimpleNamespace()) is None
    with pytest.raises(RuntimeError):
        hw.clock_event_reasons_query(types.SimpleNamespace(nvmlDeviceGetCurrentClocksEventReasons=missing))(None)


def _boost(b2b_cap: float, rested_cap: float, heat: float = 0.0) -> dict:
    def s(clock, cap, h):
        return {"clock_mhz": clock, "power_w": 400.0, "temperature_c": 60.0, "samples": 50,
                "reason_share": {"software power cap": cap, "hardware slowdown": h}}
    return {"one_gpu_ms": 90.0, "one_gpu_samples_ms": [90.0, 90.5, 89.8], "one_gpu_rested_ms": 80.0,
            "one_gpu_rested_samples_ms": [80.0, 80.2, 79.9], "rest_ms": 90.0, "power_limit_w": 700.0,
            "nvml": {"back to back": s(1500.0, b2b_cap, heat), "rested": s(1900.0, rested_cap, 0.0)}}


def test_the_reasons_decide_the_power_verdict():
    held = [v.verdict for v in C04.boost_verdicts(_boost(0.9, 0.1))]
    assert held == ["TRUE", "TRUE", "TRUE", "TRUE"]   # a thermal slowdown shows as a reason in the table
    not_power = [v.verdict for v in C04.boost_verdicts(_boost(0.0, 0.0, heat=0.8))]
    assert not_power == ["TRUE", "TRUE", "FALSE", "FALSE"]
    no_nvml = dict(_boost(0.9, 0.1), nvml={"back to back": None, "rested": None})
    assert len(C04.boost_verdicts(no_nvml)) == 1


def test_boost_summary_shares_each_reason():
    samples = [{"clock_mhz": 1500.0, "power_w": 400.0, "temperature_c": 60.0, "reasons": m} for m in (0x4, 0x4, 0x44, 0)]
    s = boost.summary(samples)
    assert s["samples"] == 4 and s["reason_share"] == {"software power cap": 0.75, "hardware thermal slowdown": 0.25}
    assert boost.summary([]) is None
    assert boost.summary([dict(samples[0], reasons=None)])["reason_share"] is None
    assert boost.while_running(0.0, None) == []


def test_boost_measures_step_times_on_the_cpu():
    cfg = {"n_layers": 2, "hidden": 32, "rows": 16, "dtype": "float32", "warmup": 1, "repeat": 2}
    data = json.loads(json.dumps(boost.measure_one_gpu(cfg, device="cpu")))
    assert len(data["one_gpu_samples_ms"]) == 2 and data["nvml"] == {"back to back": None, "rested": None}
    assert len(C04.boost_verdicts(data)) == 1


def test_mlp_baseline_and_its_verdicts_on_the_cpu():
    data = lab02.mlp_baseline([16, 32], tokens=8, dtype="float32", device="cpu", target_ms=0.1, repeat=2)
    assert [r["hidden"] for r in data["rows"]] == [16, 32] and all(r["train_tflops"] > 0 for r in data["rows"])
    rows = [{"hidden": 8192, "ffn_hidden": 32768, "train_ms": 10.0, "train_tflops": 660.0},
            {"hidden": 16384, "ffn_hidden": 65536, "train_ms": 41.0, "train_tflops": 650.0}]
    narrow = {"hidden": 512, "ffn_hidden": 2048, "train_ms": 0.2, "train_tflops": 100.0}
    got = C02.baseline_verdicts({"tokens": 4096, "dtype": "bfloat16", "rows": [narrow] + rows})
    assert [v.verdict for v in got] == ["TRUE", "FALSE"]


def test_plain_step_on_the_cpu_is_not_a_memory_measurement():
    data = lab08.plain_step({**M08.SMALL_TF, "warmup": 1, "repeat": 1}, device="cpu")
    assert data["n_params"] == M08.n_params({**M08.BENCH, **M08.SMALL_TF}) and data["step_ms"] > 0
    assert [v.verdict for v in C08.plain_verdicts(data)] == [C08.NOT_MEASURED]
    psi = 300_000_000
    gpu = {"n_params": psi, "state_bytes": 16 * psi * 1.01, "peak_bytes": 16 * psi * 2.5, "weights_bytes": 4 * psi,
           "predicted_state_bytes": 16 * psi, "config": {"batch_per_rank": 16, "seq": 1024}}
    assert [v.verdict for v in C08.plain_verdicts(gpu)] == ["TRUE", "FALSE"]


def test_a_missing_recording_says_how_many_gpus_and_how_to_record(tmp_path, monkeypatch):
    monkeypatch.setenv(recorded.DIR_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"cannot show '01_x': this machine has 0 GPU\(s\), measuring it "
                                                r"live needs 1, and there is no recording.*HINT: record it once on "
                                                r"a machine with >= 1 GPU\(s\).*LABUTILS_RECORD=1"):
        recorded.live_or_recorded("01_x", lambda: pytest.fail("must not measure"), gpus_needed=1, n_gpus=0)


def test_new_verdicts_print_with_their_source(capsys):
    m = recorded.Measurement("04_boost_one_gpu", _boost(0.9, 0.1), True, "1x GPU | torch x", "2026-12-01")
    claims.show(C04.boost_verdicts(m.data), m)
    assert all(ln.endswith("| source: live on 1x GPU | torch x") for ln in capsys.readouterr().out.splitlines())


def test_a_recorded_ddp_timeline_ships_as_a_labelled_trace(tmp_path):
    from pathlib import Path

    from labutils.labs.lab08_data_parallel import span_trace
    m = recorded.load("08_ddp", directory=Path(__file__).resolve().parent.parent / "notebooks" / "recorded")
    per_rank = m.data["traces"]["best"]
    path = span_trace.write(per_rank, m.source, tmp_path / "08_ddp_best.RECORDED.json")
    doc = json.loads(path.read_text())
    events = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert len(events) == sum(len(t["spans"]) for t in per_rank) and doc["otherData"]["source"] == m.source
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "process_name"}
    assert names == {f"rank {r} (recorded)" for r in range(len(per_rank))}
    assert all(e["dur"] >= 0 for e in events) and path.stat().st_size < 200_000
    with pytest.raises(ValueError, match="no spans to write.*HINT"):
        span_trace.write([{"spans": []}], m.source, tmp_path / "x.json")
