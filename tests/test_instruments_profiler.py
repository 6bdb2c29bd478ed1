"""labutils.instruments.profiler: reading kernel spans (NCCL, compute, copies; per device and stream) and
CPU ops out of chrome traces, and profiling a callable on the CPU (warm-up calls dropped). On a GPU it is
exercised by tests/gpu (lab 02's NCCL kernel times, lab 08's step traces).

Run: pytest -n 0 tests/test_instruments_profiler.py -q
"""
from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import record_function

from labutils.instruments import profiler


def _trace(kernels, ops):
    ev = [{"ph": "X", "cat": "kernel", "name": f"ncclDevKernel_AllReduce_Sum_f32_RING_LL(x{i})", "ts": ts, "dur": d,
           "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7}} for i, (ts, d) in enumerate(kernels)]
    ev += [{"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel", "ts": 0, "dur": 9,
            "pid": 0, "tid": 7, "args": {"device": 0, "stream": 7}}]
    ev += [{"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllGather_RING_LL", "ts": 2, "dur": 3,
            "pid": 1, "tid": 9}]                                   # no args: pid and tid say device and stream
    ev += [{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "ts": 40, "dur": 2,
            "args": {"device": 0, "stream": 3}}]
    ev += [{"ph": "X", "cat": "gpu_user_annotation", "name": "nccl:all_reduce", "ts": 10, "dur": 100}]
    ev += [{"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "ts": ts, "dur": d} for ts, d in ops]
    ev += [{"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 1, "dur": 1}, {"ph": "M", "name": "x"}]
    return {"traceEvents": ev}


def test_nccl_kernels_and_cpu_ops_in_order(tmp_path):
    doc = _trace([(30, 4.0), (10, 100.0), (20, 5.0)], [(5, 50.0), (1, 60.0)])
    assert [k["dur"] for k in profiler.nccl_kernels(doc)] == [3.0, 100.0, 5.0, 4.0]   # by start, NCCL only
    assert [k["dur"] for k in profiler.nccl_kernels(doc, device=0)] == [100.0, 5.0, 4.0]
    assert profiler.cpu_op_us(doc, "c10d::allreduce_") == [60.0, 50.0]
    (tmp_path / "t.json").write_text(json.dumps(doc))
    assert profiler.load(tmp_path / "t.json") == doc
    (tmp_path / "list.json").write_text(json.dumps(doc["traceEvents"]))      # a bare event list works too
    assert profiler.nccl_kernels(profiler.load(tmp_path / "list.json")) == profiler.nccl_kernels(doc)


def test_kernels_kinds_streams_and_copies():
    doc = _trace([(10, 1.0)], [])
    ks = profiler.kernels(doc)
    assert [(k["kind"], k["device"], k["stream"]) for k in ks] == [
        ("compute", 0, 7), ("nccl", 1, 9), ("nccl", 0, 7)]          # annotations are not kernels
    assert [k["kind"] for k in profiler.kernels(doc, copies=True)][-1] == "memcpy"
    streams = profiler.by_stream(profiler.kernels(doc, copies=True))
    assert list(streams) == [(0, 7), (1, 9), (0, 3)] and len(streams[(0, 7)]) == 2
    assert profiler.is_nccl("ncclKernel_AllReduce") and not profiler.is_nccl("void gemm")


def test_profile_on_cpu_drops_the_warm_up_and_writes_the_file(tmp_path):
    seen = []

    def step():
        with record_function(f"call {len(seen)}"):
            seen.append(torch.ones(8, 8) @ torch.ones(8, 8))
    doc = profiler.profile(step, calls=2, warmup=1, path=tmp_path / "t" / "p.json.gz")
    names = {e["name"] for e in profiler.events(doc)}
    assert len(seen) == 3 and "call 0" not in names and {"call 1", "call 2"} <= names
    assert profiler.load(tmp_path / "t" / "p.json.gz") == doc
    assert profiler.kernels(doc) == []                                # no GPU here: no kernel
    plain = profiler.profile(step)                                    # no warm-up: every call recorded
    assert "call 3" in {e["name"] for e in profiler.events(plain)}


@pytest.mark.parametrize("kw, match", [({"calls": 0}, "calls=0"), ({"calls": True}, "calls=True"),
                                       ({"warmup": -1}, "warmup=-1")])
def test_profile_refuses_bad_counts(kw, match):
    with pytest.raises(ValueError, match=match):
        profiler.profile(lambda: None, **kw)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where no GPU is in use")
def test_profile_gpu_only_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="cpu=True"):
        profiler.profile(lambda: None, cpu=False)
