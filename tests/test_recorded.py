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
