"""The one-GPU tracks of labs 01, 02, 04 and 08 on a real GPU: each measurement runs, returns what its verdicts
read, and stores as JSON (what ``recorded.live_or_recorded`` saves with ``LABUTILS_RECORD=1``); sizes are
small and nothing is asserted about speed. Skipped without CUDA.

Run: pytest tests/gpu/test_single_gpu_a.py -q     (>= 1 GPU; under a minute)
"""
from __future__ import annotations

import json

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
from labutils.labs.lab08_data_parallel import memory, one_gpu as lab08

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)
from notebook_defs import load_definitions

pytestmark = [pytest.mark.gpu, needs_gpus(1)]


def _stored(data: dict) -> dict:
    """``data`` as a recording holds it (live_or_recorded's own round trip)."""
    return json.loads(json.dumps(data))


def _live(name: str, data: dict) -> recorded.Measurement:
    return recorded.Measurement(name, data, True, "1x TEST GPU | torch x", "2026-12-01T00:00:00+00:00")


def test_live_or_recorded_measures_live_on_one_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(recorded.DIR_ENV, str(tmp_path))
    m = recorded.live_or_recorded("one_gpu_probe", lambda: {"v": torch.ones(1, device="cuda").item()},
                                  gpus_needed=1, record=True)
    assert m.live and m.data == {"v": 1.0} and m.source.startswith("live on ")
    assert "LIVE: measured now on" in capsys.readouterr().out and (tmp_path / "one_gpu_probe.json").exists()


def test_lab01_optimised_program_profiled_on_one_gpu(tmp_path):
    nb = load_definitions("01_cuda_comm")
    x, y = torch.randn(32, 1000, device="cuda:0"), torch.randn(32, 1000, device="cuda:0")
    data = _stored(lab01.profile_program(lambda: nb.communication_function_optimised(x, y), devices.gpu_setup(1),
                                         trace_path=tmp_path / "full.json"))
    kinds = {k["kind"] for k in data["kernels"]}
    assert data["devices"] == [0] and "compute kernel" in kinds and not kinds & {"nccl", "peer copy"}, data["kernels"]
    cats = {e.get("cat") for e in data["trace"]["traceEvents"]}
    assert "kernel" in cats and cats & {"cuda_runtime", "cuda_driver"}, cats
    assert len(json.dumps(data)) < 2_000_000 and (tmp_path / "full.json").exists()
    assert [v.verdict for v in C01.optimised_verdicts(data)] == ["FALSE", "TRUE"]
    for live in (True, False):
        m = recorded.Measurement("01_optimised_one_gpu", data, live, "1x TEST GPU", "2026-12-01T00:00:00")
        path = lab01.write_trace(m, tmp_path)
        assert path.name == ("01_optimised_one_gpu.json" if live else "01_optimised_one_gpu.RECORDED.json")
        assert json.loads(path.read_text())["otherData"]["source"] == m.source


def test_lab02_mlp_baseline_on_one_gpu():
    data = _stored(lab02.mlp_baseline([256, 512, 1024], tokens=1024, repeat=2, target_ms=2.0))
    assert data["device"] == "cuda:0" and [r["hidden"] for r in data["rows"]] == [256, 512, 1024]
    assert all(r["fwd_ms"] > 0 and r["train_ms"] > 0 and r["train_tflops"] > 0 for r in data["rows"])
    verdicts = C02.baseline_verdicts(data)
    assert len(verdicts) == 2
    claims.show(verdicts, _live("02_mlp_one_gpu", data))


def test_lab04_nvml_clock_event_reasons_are_read():
    pynvml = pytest.importorskip("pynvml")
    assert hw.clock_event_reasons_query(pynvml) is not None, "this nvidia-ml-py has neither name"
    with boost.nvml_probe("cuda:0") as probe:
        assert probe is not None, "NVML cannot be read on this GPU machine"
        r = probe.read()
        assert r["clock_mhz"] > 0 and r["power_w"] > 0 and isinstance(r["reasons"], int), r
        assert hw.reason_words(r["reasons"]) is not None


def test_lab04_back_to_back_and_rested_on_one_gpu():
    cfg = {"n_layers": 2, "hidden": 4096, "rows": 8192, "warmup": 1, "repeat": 3}   # ~20 ms a step on an H200
    data = _stored(boost.measure_one_gpu(cfg))
    assert len(data["one_gpu_samples_ms"]) == 3 and len(data["one_gpu_rested_samples_ms"]) == 3
    assert data["rest_ms"] == pytest.approx(data["one_gpu_ms"])
    b2b = data["nvml"]["back to back"]
    assert b2b is not None and b2b["samples"] >= 1 and b2b["reason_share"] is not None, data["nvml"]
    verdicts = C04.boost_verdicts(data)
    assert len(verdicts) >= 3, [v.body() for v in verdicts]   # step, clock, and at least the power-cap verdicts
    claims.show(verdicts, _live("04_boost_one_gpu", data))


def test_lab08_plain_step_and_its_memory_on_one_gpu():
    cfg = {"d_model": 1024, "n_heads": 16, "n_layers": 6, "seq": 128, "batch_per_rank": 4, "warmup": 2, "repeat": 3}
    data = _stored(lab08.plain_step(cfg))
    psi = data["n_params"]
    assert data["weights_bytes"] == pytest.approx(4 * psi, rel=0.02)
    assert data["state_bytes"] == pytest.approx(memory.predicted_bytes("DDP", psi, 1), rel=0.05)
    assert data["peak_bytes"] > data["state_bytes"] and data["step_ms"] > 0
    assert [v.verdict for v in C08.plain_verdicts(data)][0] == "TRUE"
    claims.show(C08.plain_verdicts(data), _live("08_plain_one_gpu", data))
