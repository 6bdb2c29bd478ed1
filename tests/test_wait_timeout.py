"""Timeouts for deliberate waits, sized from the machine (measured start-up, cores), not from its hardware mode."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from labutils import config

ROOT = Path(__file__).resolve().parent.parent


def test_the_wait_plus_the_margin_times_one_start_up_when_the_cores_suffice():
    assert config.wait_timeout_s(2, processes=8, startup=3.0, cores=16) == pytest.approx(2 + config.WAIT_MARGIN * 3)
    assert config.wait_timeout_s(0, processes=16, startup=3.0, cores=16, margin=1) == pytest.approx(3.0)


def test_more_processes_than_cores_stretch_the_start_up():
    two_cores = config.wait_timeout_s(2, processes=8, startup=1.5, cores=2, margin=2)
    assert two_cores == pytest.approx(2 + 2 * 1.5 * 4)
    # the same demo, the same start-up: a longer timeout on 2 cores than on 16, whatever the GPUs
    assert two_cores > config.wait_timeout_s(2, processes=8, startup=1.5, cores=16, margin=2)


@pytest.mark.parametrize("kw", [dict(wait_s=-1), dict(wait_s=float("inf")), dict(wait_s="2"), dict(processes=0),
                                dict(processes=2.5), dict(cores=0), dict(margin=0), dict(startup=-1.0),
                                dict(processes=True)])
def test_bad_input_is_refused_with_a_hint(kw):
    args = dict(wait_s=2, startup=1.0, cores=2) | kw
    wait_s = args.pop("wait_s")
    with pytest.raises(ValueError, match="must be"):
        config.wait_timeout_s(wait_s, **args)


def test_start_up_is_measured_once_and_remembered():
    first = config.startup_s()
    assert 0 < first < 300
    assert config.startup_s() == first                   # remembered: no second process
    again = config.startup_s(refresh=True)               # measured again on request
    assert 0 < again < 300
    assert config.cpu_cores() >= 1


def test_a_failing_measurement_says_why(monkeypatch):
    monkeypatch.setattr(config, "_startup_code", lambda cuda: "raise SystemExit('no torch here')")
    with pytest.raises(RuntimeError, match="no torch here"):
        config.startup_s(refresh=True)


def test_lab05_sizes_its_hang_timeouts_from_the_machine():
    src = (ROOT / "notebooks" / "src" / "05_debugging.py").read_text()
    for name in ("HANG_S", "RAW_S", "PG_TIMEOUT_S"):
        line = re.search(rf"^{name} = (.*)$", src, re.M)
        assert line, f"05_debugging.py defines no {name}"
        assert "config.wait_timeout_s(" in line.group(1) and "MODE" not in line.group(1), line.group(0)
    assert "SLOW_START" not in src
