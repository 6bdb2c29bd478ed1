"""Recorded results: provenance is saved, loaded, and never shown as live."""
import json

import pytest

from labutils import recorded


def test_save_load_roundtrip(tmp_path):
    import torch
    p = recorded.save("x", {"t": torch.tensor([1.0, 2.0]), "n": 3}, fingerprint="2x TEST GPU | NV18",
                      directory=tmp_path)
    doc = json.loads(p.read_text())
    assert doc["fingerprint"] == "2x TEST GPU | NV18" and doc["data"] == {"t": [1.0, 2.0], "n": 3}
    m = recorded.load("x", directory=tmp_path)
    assert not m.live and m.data["n"] == 3 and m.label.startswith("RECORDED ")
    assert m.label.endswith(": 2x TEST GPU")


def test_missing_recording_says_how_to_make_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="LABUTILS_RECORD=1"):
        recorded.load("nope", directory=tmp_path)


def test_live_when_enough_gpus_and_records_on_request(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(recorded.DIR_ENV, str(tmp_path))
    calls = []
    m = recorded.live_or_recorded("y", lambda: calls.append(1) or {"v": 1.5}, gpus_needed=0, record=True)
    assert calls == [1] and m.live and m.data == {"v": 1.5} and m.label.startswith("live: ")
    assert "LIVE: measured now on" in capsys.readouterr().out
    assert (tmp_path / "y.json").exists()


def test_recorded_when_too_few_gpus(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(recorded.DIR_ENV, str(tmp_path))
    recorded.save("z", {"v": 2}, fingerprint="2x NVIDIA H200 | NV18")
    m = recorded.live_or_recorded("z", lambda: pytest.fail("must not measure"), gpus_needed=2, n_gpus=1)
    out = capsys.readouterr().out
    assert not m.live and m.data == {"v": 2}
    assert out.startswith("RECORDED: this machine has 1 GPU(s); this measurement needs 2.")
    assert "not measurements of your machine" in out


def test_live_does_not_record_unless_asked(tmp_path, monkeypatch):
    monkeypatch.setenv(recorded.DIR_ENV, str(tmp_path))
    monkeypatch.delenv(recorded.RECORD_ENV, raising=False)
    recorded.live_or_recorded("w", lambda: {"v": 1}, gpus_needed=0)
    assert not (tmp_path / "w.json").exists()


def test_unstorable_data_is_rejected(tmp_path):
    with pytest.raises(TypeError, match="cannot store object"):
        recorded.save("bad", {"x": object()}, fingerprint="f", directory=tmp_path)


def test_a_recording_keeps_the_nccl_variables_set(tmp_path, monkeypatch):
    for k in [k for k in __import__("os").environ if k.startswith("NCCL_")]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv(recorded.DIR_ENV, str(tmp_path))
    m = recorded.live_or_recorded("n", lambda: {"v": 1}, gpus_needed=0, record=True)
    doc = json.loads((tmp_path / "n.json").read_text())
    assert doc["nccl_env"] == {"NCCL_NVLS_ENABLE": "0"} and m.nccl_env == doc["nccl_env"]
    back = recorded.load("n")
    assert back.nccl_env == {"NCCL_NVLS_ENABLE": "0"} and back.fingerprint == doc["fingerprint"] == m.fingerprint
    # what is set when the measurement runs counts, not what was set when the machine was first described
    monkeypatch.setenv("NCCL_ALGO", "Ring")
    m2 = recorded.live_or_recorded("n2", lambda: {"v": 1}, gpus_needed=0, record=True)
    assert m2.nccl_env == {"NCCL_ALGO": "Ring", "NCCL_NVLS_ENABLE": "0"}
    assert json.loads((tmp_path / "n2.json").read_text())["nccl_env"] == m2.nccl_env
    recorded.save("e", {"v": 1}, fingerprint="2x G | NCCL 2.28.9 | driver 1 | no NCCL_* set", nccl_env={})
    assert recorded.load("e").nccl_env == {} and recorded.load("e").fingerprint.endswith("| no NCCL_* set")


def test_a_gpu_recording_made_before_nccl_variables_were_stored_says_so(tmp_path):
    old = {"name": "old", "fingerprint": "2x NVIDIA H200 | NV18 | torch 2.11.0+cu130 | CUDA 13.0 | NCCL 2.28.9 | "
           "driver 580.159.04", "recorded_at": "2026-11-30T10:00:00+00:00", "data": {"v": 1}}
    (tmp_path / "old.json").write_text(json.dumps(old))
    m = recorded.load("old", directory=tmp_path)
    assert m.nccl_env is None                                   # unknown: nothing invented
    assert m.fingerprint == old["fingerprint"] + " | NCCL_* variables not recorded"
    assert m.source == "RECORDED 2026-11-30 on " + m.fingerprint and m.label == "RECORDED 2026-11-30: 2x NVIDIA H200"
    assert recorded.shown_fingerprint(old) == m.fingerprint
    cpu = dict(old, fingerprint="CPU only (x86_64, 2 cores) | torch 2.13.0+cpu")
    assert recorded.shown_fingerprint(cpu) == cpu["fingerprint"]   # gloo: NCCL's variables do not apply


def test_every_committed_gpu_recording_states_its_nccl_variables_or_that_they_were_not_recorded():
    """A GPU recording that stores ``nccl_env`` has a fingerprint ending with exactly those variables; one that
    predates it is shown ending ``NCCL_* variables not recorded``."""
    from pathlib import Path
    from labutils import hw
    for path in sorted((Path(__file__).resolve().parent.parent / "notebooks" / "recorded").glob("*.json")):
        doc = json.loads(path.read_text())
        if " | NCCL " not in doc["fingerprint"]:
            continue
        expected = hw.nccl_env_text(doc.get("nccl_env"))
        assert recorded.shown_fingerprint(doc).endswith(f" | {expected}"), path.name


def test_awaiting_takes_the_entries_whose_recordings_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("LABUTILS_RECORDED_DIR", str(tmp_path))
    recorded.save("xx_made", {"a": 1}, fingerprint="fp")
    table = {"xx_made": len, "xx_missing": len, ("xx_made", "xx_missing"): len}
    assert recorded.awaiting(table) == {"xx_made": len}
