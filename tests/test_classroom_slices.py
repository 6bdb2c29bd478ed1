"""GPU slices for a workshop node and ``python -m labutils classroom check``, on fake topologies.

    pytest -n 0 tests/test_classroom_slices.py -q     # a few seconds (one 2-rank gloo launch)
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from labutils.classroom import book, slices as sl


def _disjoint(plan):
    flat = list(itertools.chain.from_iterable(plan))
    return len(flat) == len(set(flat))


def test_uniform_node_is_cut_into_consecutive_pairs():
    plan = sl.plan_slices(sl.fake_topology("8"), 2)
    assert plan == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert sl.plan_slices(sl.fake_topology("8"), 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_pairs_follow_the_links_where_they_differ():
    # NVLink bridges 0-2 and 1-3 (not 0-1): consecutive pairs would cross the CPUs
    topo = sl.fake_topology("8:0-2=NV4,1-3=NV4,4-6=NV4,5-7=NV4,*=SYS")
    plan = sl.plan_slices(topo, 2)
    assert sorted(plan) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert {sl.worst_link(topo, s) for s in plan} == {"NV4"}
    assert _disjoint(plan)


def test_the_best_linked_slices_come_first_and_leftovers_are_in_none():
    topo = sl.fake_topology("7:0-6=NV4,1-5=PIX,*=SYS")
    plan = sl.plan_slices(topo, 2)
    assert plan[:2] == [(0, 6), (1, 5)] and len(plan) == 3 and _disjoint(plan)
    assert sl.plan_slices(topo, 2, learners=2) == [(0, 6), (1, 5)]


def test_more_links_beat_fewer_and_nvlink_beats_pcie():
    assert sl.link_cost("NV18") < sl.link_cost("NV4") < sl.link_cost("PIX") < sl.link_cost("PHB") < sl.link_cost("SYS")
    topo = sl.fake_topology("4:0-1=NV2,2-3=NV2,0-2=NV12,1-3=NV12,*=SYS")
    assert sorted(sl.plan_slices(topo, 2)) == [(0, 2), (1, 3)]


@pytest.mark.parametrize("spec, words", [
    ("x", "must start with a GPU count"), ("0", "must start with a GPU count"),
    ("4:0-1", "is not PAIR=LINK"), ("4:0-1=FAST", "is not PAIR=LINK"),
    ("4:0-4=NV4", "not a pair of two GPUs below 4"), ("4:1-1=NV4", "not a pair"),
])
def test_bad_fake_specs_say_what_is_allowed(spec, words):
    with pytest.raises(sl.SliceError, match=words) as info:
        sl.fake_topology(spec)
    assert "HINT:" in str(info.value)


@pytest.mark.parametrize("size, learners, words", [
    (0, None, "whole number of GPUs >= 1"), (True, None, "whole number"), (9, None, "more than the node's 8"),
    (2, 5, "5 learners need 5 slices"),
])
def test_bad_plans_say_why(size, learners, words):
    with pytest.raises(sl.SliceError, match=words):
        sl.plan_slices(sl.fake_topology("8"), size, learners)


def test_a_broken_gpu_is_left_out_and_the_rest_still_pair_by_links():
    topo = sl.fake_topology("8:0-2=NV4,1-3=NV4,4-6=NV4,5-7=NV4,*=SYS")
    plan = sl.plan_slices(topo, 2, exclude=[5])
    assert sorted(plan)[:3] == [(0, 2), (1, 3), (4, 6)] and len(plan) == 3
    assert all(5 not in s for s in plan)
    with pytest.raises(sl.SliceError, match="cannot exclude GPU 9"):
        sl.plan_slices(topo, 2, exclude=[9])


def test_no_gpus_no_slices():
    with pytest.raises(sl.SliceError, match="no GPUs"):
        sl.plan_slices(sl.Topology(0), 2)


def test_book_gives_each_learner_its_own_slice_and_takes_it_back(tmp_path):
    state = tmp_path / "slices.json"
    b = book.SliceBook([(0, 1), (2, 3)], state)
    assert b.acquire("ada") == (0, 1)
    assert b.acquire("bob") == (2, 3)
    assert b.acquire("ada") == (0, 1)  # the same learner again: the same slice
    with pytest.raises(sl.SliceError, match="all 2 GPU slices are in use .*'cy' gets none. HINT"):
        b.acquire("cy")
    assert book.load_state(state) == {"ada": (0, 1), "bob": (2, 3)}
    assert book.SliceBook([(0, 1), (2, 3)], state).acquire("bob") == (2, 3)  # a restarted hub remembers
    b.release("ada")
    assert b.acquire("cy") == (0, 1)
    assert book.SliceBook([(0, 1, 2, 3)], state).holders == {}  # another plan: the old holders mean nothing


def test_slice_env_and_device_cgroup_lines():
    topo = sl.fake_topology("4")
    topo.minors = [3, 2, 1, 0]  # /dev/nvidiaN follows the minor number, not the index
    assert sl.slice_env((2, 3)) == {"CUDA_VISIBLE_DEVICES": "2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    allow = sl.device_allow(topo, (2, 3))
    assert allow[:2] == ["/dev/nvidia1 rw", "/dev/nvidia0 rw"] and "/dev/nvidiactl rw" in allow


def _check(*args, env_extra=None):
    env = {k: v for k, v in os.environ.items() if k != sl.FAKE_ENV}
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "labutils", "classroom", "check", *args], capture_output=True,
                          text=True, timeout=300, env=env)


def test_check_on_a_cpu_machine_says_there_are_no_gpus_and_what_it_checked():
    r = _check()
    assert r.returncode == 2, r.stdout + r.stderr
    assert "no GPUs on this node" in r.stdout
    assert "Not checked: slices, links, NCCL all_reduce, free GPU memory" in r.stdout
    assert "Checked: 2 gloo ranks on the CPU all_reduce 1 + 2 = 3: OK" in r.stdout


def test_check_plans_a_class_on_a_fake_topology_and_says_nothing_ran():
    r = _check("--fake-gpus", "8:0-2=NV4,1-3=NV4,*=SYS")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "classroom check: 8 fake GPUs, 4 slices"
    assert lines[1].split()[:4] == ["slice", "0", "GPUs", "0,2"] and "NV4" in lines[1] and "PLANNED" in lines[1]
    assert "Not checked (no real GPUs): visibility, NCCL all_reduce, free memory." in r.stdout


def test_check_reads_the_hubs_assignment(tmp_path):
    state = tmp_path / "slices.json"
    book.SliceBook([(0, 1), (2, 3)], state).acquire("ada")
    r = _check("--hub-state", str(state), env_extra={sl.FAKE_ENV: "4"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[1].split()[:3] == ["ada", "GPUs", "0,1"]


def test_check_bad_input_is_an_error_with_a_hint():
    r = _check("--fake-gpus", "4", "--slice-size", "8")
    assert r.returncode == 1 and "slice size 8 is more than the node's 4 GPUs. HINT:" in r.stderr
