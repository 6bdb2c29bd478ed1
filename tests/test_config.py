"""World size / backend resolution: defaults and every rejection, without starting processes."""
import os
import re
import types

import pytest

from labutils import config
from labutils.config import resolve, under_torchrun
from labutils.errors import LaunchConfigError


@pytest.mark.parametrize("n_gpus, ws, backend, want", [
    (0, None, None, (2, "gloo", "cpu")),
    (1, None, None, (2, "gloo", "cpu")),
    (2, None, None, (2, "nccl", "cuda")),
    (8, None, None, (8, "nccl", "cuda")),
    (2, 4, None, (4, "gloo", "cpu")),        # more ranks than GPUs: CPU tensors
    (4, 2, None, (2, "nccl", "cuda")),
    (2, None, "gloo", (2, "gloo", "cpu")),
    (0, 3, "GLOO", (3, "gloo", "cpu")),
    (2, 1, "nccl", (1, "nccl", "cuda")),
])
def test_defaults(n_gpus, ws, backend, want):
    cfg = resolve(ws, backend, n_gpus=n_gpus)
    assert (cfg.world_size, cfg.backend, cfg.device_type) == want
    assert cfg.describe().startswith(f"labutils: {want[0]} ranks, backend {want[1]}")


@pytest.mark.parametrize("ws, backend, n_gpus, match", [
    (0, None, 0, "world_size must be >= 1, got 0"),
    (-3, None, 2, "world_size must be >= 1, got -3"),
    (2.0, None, 0, "world_size must be a positive int"),
    (True, None, 0, "world_size must be a positive int"),
    ("2", None, 0, "world_size must be a positive int"),
    (2, "mpi", 0, "backend must be one of"),
    (2, "nccl", 0, "needs CUDA GPUs, but torch sees none"),
    (3, "nccl", 2, r"world_size=3 needs 3 GPUs .* this machine has 2"),
])
def test_rejections(ws, backend, n_gpus, match):
    with pytest.raises(LaunchConfigError, match=match) as info:
        resolve(ws, backend, n_gpus=n_gpus)
    assert "HINT" in str(info.value)


TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("env, expected", [
    ({**TORCHRUN_ENV, "TORCHELASTIC_RUN_ID": "x", "LOCAL_RANK": "0"}, True),   # torchrun
    (TORCHRUN_ENV, True),                                                     # another env:// launcher
    ({"TORCHELASTIC_RUN_ID": "x"}, True),
    ({"RANK": "0", "WORLD_SIZE": "2"}, False),           # no rendezvous address: env:// could not start
    ({**TORCHRUN_ENV, "LABUTILS_RANK": "0"}, False),     # labutils' own ranks set the same variables
    ({}, False),
])
def test_under_torchrun(env, expected):
    assert under_torchrun(env) is expected


# ---- how many gloo ranks the machine holds: refused before anything starts, with the override named ----
def test_gloo_world_size_beyond_the_machine_is_refused(monkeypatch):
    monkeypatch.delenv(config.MAX_CPU_RANKS_ENV, raising=False)
    limit, why = config.cpu_rank_limit()
    assert limit >= 1 and ("CPUs" in why or "GiB of memory" in why)
    assert resolve(limit, "gloo").world_size == limit
    for backend in ("gloo", None):
        with pytest.raises(LaunchConfigError, match=rf"world_size={limit + 1}: {limit + 1} gloo ranks are more than this "
                                                    rf"machine can hold, at most {limit} .*HINT.*LABUTILS_MAX_CPU_RANKS"):
            resolve(limit + 1, backend, n_gpus=0)


def test_the_override_raises_or_lowers_the_bound(monkeypatch):
    monkeypatch.setenv(config.MAX_CPU_RANKS_ENV, "3")
    assert config.cpu_rank_limit() == (3, "LABUTILS_MAX_CPU_RANKS=3")
    assert resolve(3, "gloo").world_size == 3
    with pytest.raises(LaunchConfigError, match=r"at most 3 \(LABUTILS_MAX_CPU_RANKS=3\)"):
        resolve(4, "gloo")
    monkeypatch.setenv(config.MAX_CPU_RANKS_ENV, "10000000")
    assert resolve(10**6, "gloo").world_size == 10**6  # for those who know better
    for bad in ("0", "many", "-2"):
        monkeypatch.setenv(config.MAX_CPU_RANKS_ENV, bad)
        with pytest.raises(LaunchConfigError, match="LABUTILS_MAX_CPU_RANKS must be a positive integer.*HINT"):
            resolve(2, "gloo")


def test_the_bound_follows_memory_and_cpus(monkeypatch):
    monkeypatch.delenv(config.MAX_CPU_RANKS_ENV, raising=False)
    monkeypatch.setattr(config.psutil, "virtual_memory",
                        lambda: types.SimpleNamespace(available=3 * config.RANK_MEMORY_BYTES))
    assert config.cpu_rank_limit()[0] == 3
    monkeypatch.setattr(config.psutil, "virtual_memory", lambda: types.SimpleNamespace(available=2**50))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert config.cpu_rank_limit() == (config.RANKS_PER_CPU * cpus,
                                       f"{cpus} CPUs, at most {config.RANKS_PER_CPU} ranks per CPU")


@pytest.mark.parametrize("cli, words", [(False, "backend='gloo'"), (True, "--backend gloo")])
def test_hints_speak_the_callers_syntax(cli, words):
    with pytest.raises(LaunchConfigError, match=re.escape(words)):
        resolve(2, "nccl", n_gpus=0, cli=cli)


@pytest.mark.parametrize("timeout", [0, -1, True, "10", None])
def test_timeouts_are_positive_seconds_with_a_hint(timeout):
    with pytest.raises(LaunchConfigError, match=r"timeout must be a positive number of seconds, got .*HINT"):
        config.check_timeout(timeout)
    assert config.check_timeout(2) == 2.0
