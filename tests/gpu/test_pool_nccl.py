"""RankPool and %%ranks' machinery under NCCL (>= 2 GPUs): one GPU per rank, CUDA tensors back on
the CPU, and the fault rules where the waits happen on the GPU (a hang shows up at ``.item()``).
No timing asserts.

Run: pytest tests/gpu/test_pool_nccl.py -v     (>= 2 GPUs; about a minute, mostly NCCL start-up)
"""
from __future__ import annotations

import signal
import sys
import threading

import cloudpickle
import pytest
import torch

from labutils import RankError, RankPool, RankTimeout
from labutils.pool import RanksInterrupted

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)

pytestmark = [pytest.mark.gpu, needs_gpus(2)]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this module


def cuda_sum(rank, world_size):
    import torch.distributed as dist
    t = torch.full((1024,), rank + 1.0, device="cuda")
    dist.all_reduce(t)
    return t, str(t.device)


@pytest.fixture(scope="module")
def pool():
    p = RankPool(world_size=2, backend="nccl", timeout=60)
    yield p
    p.close()


def test_one_gpu_per_rank_and_results_on_cpu(pool):
    assert pool.status().devices == ["cuda:0", "cuda:1"]
    out = pool.run(cuda_sum)
    for r, (t, dev) in enumerate(out):
        assert dev == f"cuda:{r}" and t.device.type == "cpu"
        torch.testing.assert_close(t, torch.full((1024,), 3.0))


def test_exec_state_and_fetch_on_gpu(pool):
    pool.exec("x = torch.ones(4, device=device) * (rank + 1)\ndist.all_reduce(x)\nn = 1")
    pool.exec("n += 1")
    xs = pool.fetch("x")
    assert [t.device.type for t in xs] == ["cpu", "cpu"] and pool.fetch("n") == [2, 2]
    torch.testing.assert_close(xs[1], torch.full((4,), 3.0))


def test_exception_keeps_the_nccl_pool(pool):
    pids = pool.status().pids
    with pytest.raises(RankError, match="rank 1 raised ValueError.*keeps running"):
        pool.exec("if rank == 1: raise ValueError('x')")
    assert pool.status().pids == pids
    assert pool.run(cuda_sum)[0][0][0].item() == 3.0  # the communicator still works


def test_interrupt_of_python_code_keeps_the_nccl_pool(pool):
    pids = pool.status().pids
    threading.Timer(1.0, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)).start()
    with pytest.raises(RanksInterrupted, match=r"ranks \[0, 1\] ran a task; they stopped it"):
        pool.exec("import time\ntime.sleep(60)")
    assert pool.status().pids == pids and pool.fetch("rank") == [0, 1]


def test_hang_on_the_gpu_times_out_and_restarts(pool, capsys):
    pids = pool.status().pids
    with pytest.raises(RankTimeout, match=r"ranks \[0\] did not finish within 5 s.*restarted"):
        pool.exec("t = torch.ones(1, device=device)\nif rank == 0:\n    dist.all_reduce(t)\n"
                  "    print(t.item())\nprint('after', rank)", timeout=5)
    assert capsys.readouterr().out == "[rank 1] after 1\n"
    assert pool.status().starting  # the error came back before the fresh ranks were up
    assert not set(pool.status().pids) & set(pids)
    assert pool.run(cuda_sum)[1][0][0].item() == 3.0  # fresh ranks, fresh communicator
    assert pool.status().devices == ["cuda:0", "cuda:1"] and pool.start_s > 0
