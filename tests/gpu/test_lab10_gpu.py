"""Lab 10's NCCL parts on real GPUs: NCCL's tuning lines are logged and parsed for every size, a forced
algorithm/protocol is what NCCL then reports, the socket stand-in runs over NCCL's network transport, and
the notebook's three all-reduces sum on NCCL. No timing asserts. Skipped unless the machine has >= 2 GPUs.

Run: pytest tests/gpu/test_lab10_gpu.py -q     (>= 2 GPUs; mostly NCCL start-up)
"""
from __future__ import annotations

import sys

import cloudpickle
import pytest

import labutils
from labutils import debugging
from labutils.labs.lab10_scaling_out import measure, tuning

from gpus import needs_gpus  # tests/gpus.py (pytest puts tests/ on sys.path)
from notebook_defs import load_definitions

pytestmark = pytest.mark.gpu
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # ranks need not import this module
SIZES = [8, 2**16, 2**22]


@needs_gpus(2)
def test_default_and_forced_choices_are_logged_and_parsed():
    runs = measure.nccl_configs({"default": {}, "Ring/Simple": tuning.forced_env("Ring", "Simple")}, SIZES,
                                warmup=1, iters=2, repeat=2)
    for name, run in runs.items():
        assert not run["error"], run["error"]
        chosen = tuning.choices_by_size(tuning.parse_tuning(run["log"]))
        assert set(SIZES) <= set(chosen), (name, chosen)
    assert set(tuning.choices_by_size(tuning.parse_tuning(runs["Ring/Simple"]["log"])).values()) == {"RING/SIMPLE"}
    assert debugging.parse_nccl_log(runs["Ring/Simple"]["log"]).env.get("NCCL_ALGO") == "Ring"


@needs_gpus(2)
def test_the_network_stand_in_uses_nccls_net_transport():
    env = {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_IB_DISABLE": "1", "NCCL_NET": "Socket",
           "NCCL_SOCKET_IFNAME": "lo"}
    run = measure.nccl_configs({"net": env}, [2**16], warmup=1, iters=2, repeat=2)["net"]
    assert not run["error"], run["error"]
    transports = debugging.parse_nccl_log(run["log"]).transports
    assert transports and all(t.startswith("NET") for t in transports), transports


@needs_gpus(2)
def test_the_notebooks_all_reduces_on_nccl():
    nb = load_definitions("10_scaling_out")
    algorithms = {"ring": nb.ring_all_reduce, "tree": nb.tree_all_reduce, "direct": nb.direct_all_reduce}
    n = labutils.config.gpu_count()
    with labutils.RankPool(world_size=n, backend="nccl", output="quiet") as pool:
        parts = pool.run(measure.allreduce_sweep, algorithms, [2**12], [n],
                         kwargs=dict(ledger_size=6144, warmup=1, iters=1, repeat=1))
    data = measure.combine(parts, [2**12], [n], 6144, cores=1)
    assert all(all(v.values()) for v in data["correct"].values())


@needs_gpus(4)
def test_the_mesh_on_four_gpus_trains_like_one():
    from labutils.labs.lab10_scaling_out import verify
    from labutils.solutions import lab10 as solution
    nb = load_definitions("10_scaling_out")
    with labutils.RankPool(world_size=4, backend="nccl", output="quiet") as pool:
        reports = pool.run(verify.mesh_training, nb.TensorParallelMLP, solution.sync_grads)
    assert all(all(r["equal"].values()) for r in reports)
