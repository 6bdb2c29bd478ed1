"""Fault injection under NCCL (>= 2 GPUs): the failures that only exist on GPUs, and how NCCL's
own watchdog interacts with labutils' timeout. Same three assertions as tests/test_faults.py: an
error naming the rank, a bounded time, a healthy notebook process afterwards.

    pytest tests/gpu/test_faults_nccl.py -v --durations=0    # about 2 minutes on 2xH200

How the timeouts fit together: labutils sets torch's process-group timeout to the launch timeout
+ 60 s, so a hang inside a labutils-initialised group ends as labutils' RankTimeout (ranks still
alive to say where they are). A group the function creates itself (init="none") with a shorter
timeout hits NCCL's watchdog first: with TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (labutils' default)
it aborts the rank (SIGABRT), and RankError must still name the rank and say it was a timeout.
"""
from __future__ import annotations

import datetime
import os
import sys
import time

import cloudpickle
import pytest
import torch
import torch.distributed as dist

import labutils
from labutils import LaunchConfigError, RankError, RankTimeout, debugging
from gpus import gpu_count, needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)
from faults_helpers import Stopwatch, healthy  # noqa: F401 - fixture

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks get these functions by value
pytestmark = [pytest.mark.gpu, needs_gpus(2)]

HANG_S = 25  # NCCL start-up (import torch, CUDA context, communicator) takes several seconds
FAST_S = 60


def _oom_on_rank_1(rank, world_size):
    if rank == 1:
        torch.empty(2 ** 44, device="cuda")  # 64 TiB of float32
    dist.barrier()


def test_out_of_memory_on_a_gpu(healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_oom_on_rank_1, world_size=2, backend="nccl", timeout=120)
    e = info.value
    assert e.rank == 1 and e.exc_type == "OutOfMemoryError", str(e)
    assert "CUDA out of memory" in e.remote_message and "ran out of memory" in str(e)
    assert sw.s < FAST_S


def _cpu_tensor(rank, world_size):
    t = torch.ones(4)  # the source tutorial's bug: created on the CPU, reduced with NCCL
    dist.all_reduce(t)
    return t


def test_cpu_tensor_on_nccl(healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_cpu_tensor, world_size=2, backend="nccl", timeout=120)
    e = info.value
    assert e.rank == 0 and e.ranks == [0, 1]
    assert "NCCL moves CUDA tensors only" in str(e), str(e)
    assert sw.s < FAST_S


def test_world_size_larger_than_the_gpu_count(healthy):
    n = gpu_count()
    with pytest.raises(LaunchConfigError, match=rf"world_size={n + 1} needs {n + 1} GPUs .* has {n}\."):
        labutils.launch(_cpu_tensor, world_size=n + 1, backend="nccl")


def _shapes(rank, world_size):
    t = torch.ones(4 + rank, device="cuda")
    dist.all_reduce(t)
    return t


def test_mismatched_shapes_named_by_detail_under_nccl(healthy):
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_shapes, world_size=2, backend="nccl", timeout=120,
                        env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})
    e = info.value
    assert e.rank == 0 and "Detected mismatch between collectives" in e.remote_message
    assert "TensorShape=[4]" in e.remote_message and "TensorShape=[5]" in e.remote_message
    assert sw.s < FAST_S


def _never_arrives(rank, world_size):
    if rank == 0:
        dist.barrier()  # NCCL's barrier blocks the host until every rank joins
    else:
        time.sleep(3600)


def test_rank_that_never_arrives_under_nccl(healthy):
    with Stopwatch() as sw, pytest.raises(RankTimeout) as info:
        labutils.launch(_never_arrives, world_size=2, backend="nccl", timeout=HANG_S)
    e = info.value
    assert e.ranks == [0, 1]
    assert "ranks [0] are waiting inside torch.distributed for ranks [1]" in str(e), (str(e), e.where)
    assert e.where[0].endswith("dist.barrier()  # NCCL's barrier blocks the host until every rank joins"
                               " (inside torch.distributed)")
    assert e.where[1].endswith("time.sleep(3600)")
    assert HANG_S <= sw.s < HANG_S + 15


def _returns_early(rank, world_size):
    t = torch.ones(4, device="cuda")
    dist.all_reduce(t)
    if rank == 0:
        dist.all_reduce(t)  # enqueued on the GPU; the host only blocks when the result is read
    return t


def test_rank_that_returns_early_under_nccl(healthy):
    with Stopwatch() as sw, pytest.raises(RankTimeout) as info:
        labutils.launch(_returns_early, world_size=2, backend="nccl", timeout=HANG_S,
                        env={"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"})
    e = info.value
    assert e.ranks == [0] and e.finished == [1]
    assert e.where[0].startswith("returned, but copying its result to the CPU waits for GPU work"), e.where
    assert ": rank 0 called all_reduce([4], Float); rank 1 never did" in \
        debugging.first_divergence(e.flight), e.flight
    assert HANG_S <= sw.s < HANG_S + 15


def _short_pg_timeout(rank, world_size):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=5), device_id=torch.device("cuda", rank))
    dist.barrier()
    if rank == 0:
        dist.barrier()  # rank 1 never joins: NCCL's watchdog gives up after 5 s
    time.sleep(3600)


def test_nccl_watchdog_aborts_first_and_the_error_still_names_the_rank(healthy, tmp_path):
    prefix = str(tmp_path / "fr_rank_")
    env = {"TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix,
           "TORCH_FR_DUMP_TEMP_FILE": prefix, "TORCH_FR_BUFFER_SIZE": "2000",
           "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "5000"}
    with Stopwatch() as sw, pytest.raises(RankError) as info:
        labutils.launch(_short_pg_timeout, world_size=2, backend="nccl", init="none", timeout=90, env=env)
    e = info.value
    assert e.rank == 0, str(e)
    assert "timeout expired in rank 0" in str(e) or "Watchdog caught collective operation timeout" in str(e), str(e)
    assert sw.s < 60  # NCCL's 5 s, the dump and the abort -- not labutils' 90 s
    dumps = debugging.read_flight_dumps(prefix)
    assert 0 in dumps, os.listdir(tmp_path)
    if 1 in dumps:  # rank 1 dumps too when it hears of rank 0's timeout (recent torch)
        assert "rank 0 called" in debugging.first_divergence(dumps), dumps
