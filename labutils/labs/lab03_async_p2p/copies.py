"""Lab 03's copies between GPUs, apart from the overlap sweep: the bare ``cudaMemcpyAsync`` that ``Tensor.copy_``
issues between two GPUs (through ctypes, without the events ``copy_`` records and waits for on both devices), and
a profiler reading of what one transfer ran -- which engine, which CUDA runtime calls::

    copies.cuda_memcpy_async(peer, src)              # on the current stream; no stream barrier
    copies.profile_transfer(lambda: [peer.copy_(src)])   # {"gpu": [...], "runtime": {"cudaStreamWaitEvent": 2, ...}}
"""
from __future__ import annotations

import collections
import ctypes
import functools
from typing import Callable

import torch

from ...instruments import profiler


def wait_all(works) -> None:
    """``wait()`` on each work a transfer returned (none for a stream-ordered copy)."""
    for w in works or []:
        w.wait()


_RUNTIME_CALLS = ("cudaMemcpyAsync", "cudaMemcpyPeerAsync", "cudaEventRecord", "cudaStreamWaitEvent",
                  "cudaLaunchKernel")


@functools.lru_cache(maxsize=1)
def _cudart():
    """The CUDA runtime library torch already loaded (its file from /proc/self/maps, else by soname)."""
    import torch
    names = []
    try:
        with open("/proc/self/maps") as f:
            names = sorted({ln.split()[-1] for ln in f if "libcudart.so" in ln.split()[-1]})
    except OSError:
        pass
    names.append(f"libcudart.so.{torch.version.cuda.split('.')[0]}")
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        raise RuntimeError(f"cannot load the CUDA runtime (tried {names}). HINT: this needs torch built for CUDA.")
    lib.cudaMemcpyAsync.restype = ctypes.c_int
    lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    return lib


def cuda_memcpy_async(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, current stream)``: the copy ``Tensor.copy_``
    issues between two GPUs, without the events ``copy_`` records and waits for on both devices' current
    streams. Both tensors contiguous, same size.

    Raises:
        ValueError: tensors not contiguous or of different sizes.
        RuntimeError: the CUDA call failed.
    """
    nbytes = src.numel() * src.element_size()
    if not (dst.is_contiguous() and src.is_contiguous()) or dst.numel() * dst.element_size() != nbytes:
        raise ValueError("cuda_memcpy_async needs two contiguous tensors of the same size in bytes.")
    rc = _cudart().cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), nbytes, 4,  # 4 = cudaMemcpyDefault
                                   torch.cuda.current_stream().cuda_stream)
    if rc != 0:
        raise RuntimeError(f"cudaMemcpyAsync returned CUDA error {rc}.")


def profile_transfer(transfer: Callable[[], list]) -> dict:
    """Run ``transfer`` once under ``torch.profiler`` (after one untimed call) and say what ran.

    Returns:
        ``{"gpu": [{"name", "engine", "device", "dur_us"}], "runtime": {call: count}}``: every GPU activity
        (``engine`` "copy engine" for a ``Memcpy ...``, "SMs" for a kernel) and the CUDA runtime calls the
        host made (``cudaEventRecordWithFlags`` counted as ``cudaEventRecord``).
    """
    wait_all(transfer())
    torch.cuda.synchronize()
    doc = profiler.profile(lambda: wait_all(transfer()), cpu=True)   # synchronised before the profile ends
    gpu = [{"name": k["name"], "engine": "SMs" if k["kind"] in ("nccl", "compute") else "copy engine",
            "device": k["device"], "dur_us": k["dur"]} for k in profiler.kernels(doc, copies=True)]
    runtime = collections.Counter()
    for e in profiler.events(doc):
        if e.get("ph") == "X" and not str(e.get("cat", "")).startswith(("kernel", "gpu_")):  # host-side
            call = "cudaEventRecord" if e["name"].startswith("cudaEventRecord") else e["name"]
            if call in _RUNTIME_CALLS:
                runtime[call] += 1
    return {"gpu": gpu, "runtime": dict(sorted(runtime.items()))}
