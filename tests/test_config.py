"""World size / backend resolution: defaults and every rejection, without starting processes."""
import pytest

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
