"""labutils.instruments.memory off CUDA (every reading None or 0, nothing issued); on a GPU the probe is
exercised by tests/gpu (labs 04, 08 and 09's memory measurements).

Run: pytest -n 0 tests/test_instruments_memory.py -q
"""
from __future__ import annotations

import torch

from labutils.instruments import memory


def test_a_probe_off_cuda_runs_the_work_and_reads_none():
    ran = []
    with memory.Probe(torch.device("cpu")) as probe:
        ran.append(torch.ones(1024))
        assert probe.held_now() is None
    assert ran and probe.held_bytes is None and probe.peak_bytes is None and not probe.on_cuda
    with memory.Probe("cpu") as by_name:
        pass
    assert by_name.device == torch.device("cpu")


def test_the_plain_readers_are_zero_or_no_ops_off_cuda():
    cpu = torch.device("cpu")
    assert memory.allocated(cpu) == 0 and memory.peak(cpu) == 0 and memory.fresh_baseline(cpu) == 0
    assert memory.reset_peak(cpu) is None
    # on the CPU nothing holds GPU memory: no collective is issued (none could be: no process group)
    assert memory.settle(cpu, groups=(None, object())) is None
