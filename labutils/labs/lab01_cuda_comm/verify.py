"""What ``torch.cuda.comm`` really does: every call once, checked against plain-tensor references.

The timing experiments are in ``measure``, the devices (and the CPU stand-in) in ``devices``::

    from labutils.labs.lab01_cuda_comm import devices, verify
    setup = devices.gpu_setup()                  # >= 2 GPUs: torch.cuda.comm + torch.cuda.nccl
    rec = verify.api_examples(setup)             # JSON-able: what each call returned
    for line in verify.check_api(rec): print(line)     # compared with CPU references

Two paths, read from torch/nn/parallel/comm.py and torch/csrc/cuda/{comm,nccl}.cpp:

* **NCCL path**: ``broadcast`` / ``reduce_add`` call NCCL when ``nccl.is_available(tensors)``:
  every tensor on a GPU, dense, contiguous, and all on *distinct* devices. NCCL then checks
  that every dtype is the same and raises ``RuntimeError: all inputs and outputs must be of
  the same Tensor dtype`` otherwise -- it never converts.
* **fallback path** (anything else): ``broadcast`` does ``out.copy_(src)`` per output and
  ``reduce_add`` computes ``inputs[root] + other.to(root_device)``; both convert dtypes
  silently (copy casts, ``+`` promotes). ``scatter`` and ``gather`` never use NCCL.
"""
from __future__ import annotations

import re
from typing import Callable

import torch

from .devices import CommSetup

EXAMPLE = (1.0, 2.0, 3.0, 4.0)  # the tensor every API example starts from


def error_text(fn: Callable[[], object]) -> str:
    """Run ``fn`` and say what happened in one device-independent line.

    Returns ``"raises <Type>: <first line of message>"`` (tensor reprs shortened to
    ``tensor(...)``, so a CUDA and a CPU run print the same) or ``"returns <dtype> <values>"``.
    """
    try:
        value = fn()
    except Exception as exc:  # noqa: BLE001 - reporting what the API raises is the point
        msg = re.sub(r"tensor\([^)]*\)", "tensor(...)", str(exc), flags=re.S).strip()
        return f"raises {type(exc).__name__}: {msg.splitlines()[0] if msg else ''}".rstrip(": ")
    if isinstance(value, torch.Tensor):
        return f"returns {value.dtype} {value.float().cpu().tolist()}"
    return f"returns {value!r}"


def _rec(t: torch.Tensor) -> dict:
    """One tensor as JSON data: device, dtype, shape, values."""
    return {"device": str(t.device), "dtype": str(t.dtype).replace("torch.", ""),
            "shape": list(t.shape), "values": t.detach().cpu().tolist()}


def api_examples(setup: CommSetup) -> dict:
    """Call every function of ``torch.cuda.comm`` (and ``torch.cuda.nccl.all_reduce``) once on
    ``setup.devices`` and return what came back, as JSON data (``check_api`` compares it with
    plain-tensor references). Needs >= 2 devices."""
    comm, nccl, devs, dev = setup.comm, setup.nccl, setup.devices, setup.device
    n, root = len(devs), devs[0]
    x = torch.tensor(EXAMPLE, device=dev(root))
    rec = {"n_devices": n}
    copies = comm.broadcast(x, devs)                         # one copy per listed device
    rec["broadcast(devices=)"] = [_rec(c) for c in copies]
    rec["broadcast returns the source itself"] = copies[0].data_ptr() == x.data_ptr()
    outs = [torch.zeros(4, device=dev(i)) for i in devs[1:]]
    comm.broadcast(x, out=outs)                              # fills preallocated tensors
    rec["broadcast(out=)"] = [_rec(o) for o in outs]
    group = [torch.arange(6.0, device=dev(root)).view(2, 3), torch.tensor([7, 8], device=dev(root)),
             torch.ones(5, device=dev(root))]                # mixed shapes and dtypes
    rec["broadcast_coalesced"] = [[_rec(t) for t in per_dev]
                                  for per_dev in comm.broadcast_coalesced(group, devs)]
    parts = [x.to(dev(i)) * (k + 1) for k, i in enumerate(devs)]   # (k+1) * EXAMPLE on device k
    rec["reduce_add"] = _rec(comm.reduce_add(parts, destination=root))
    pairs = [[p, p[:2] * 10] for p in parts]                 # two tensors per device
    rec["reduce_add_coalesced"] = [_rec(t) for t in comm.reduce_add_coalesced(pairs, destination=root)]
    big = torch.arange(2.0 * n * 3, device=dev(root)).view(2 * n, 3)
    rec["scatter"] = [_rec(c) for c in comm.scatter(big, devs)]
    sizes = [1] * (n - 1) + [n + 1]                          # uneven chunks, summing to 2n
    rec["scatter(chunk_sizes=)"] = [_rec(c) for c in comm.scatter(big, devs, chunk_sizes=sizes)]
    rec["gather"] = _rec(comm.gather(parts, dim=0, destination=root))
    rec["gather(destination='cpu')"] = _rec(comm.gather(parts, dim=0, destination="cpu"))
    inplace = [p.clone() for p in parts]
    nccl.all_reduce(inplace)                                 # in place, on every device
    rec["nccl.all_reduce"] = [_rec(t) for t in inplace]
    return rec


def api_reference(n: int, device: Callable[[int], str] = lambda i: f"cuda:{i}") -> dict:
    """What ``api_examples`` must return on ``n`` devices, computed with plain CPU tensors."""
    def at(t, i):
        return dict(_rec(t), device=device(i))
    x = torch.tensor(EXAMPLE)
    parts = [x * (k + 1) for k in range(n)]
    total = sum(parts)
    group = [torch.arange(6.0).view(2, 3), torch.tensor([7, 8]), torch.ones(5)]
    big = torch.arange(2.0 * n * 3).view(2 * n, 3)
    sizes = [1] * (n - 1) + [n + 1]
    return {
        "n_devices": n,
        "broadcast(devices=)": [at(x, i) for i in range(n)],
        "broadcast returns the source itself": True,
        "broadcast(out=)": [at(x, i) for i in range(1, n)],
        "broadcast_coalesced": [[at(t, i) for t in group] for i in range(n)],
        "reduce_add": at(total, 0),
        "reduce_add_coalesced": [at(total, 0), at(total[:2] * 10, 0)],
        "scatter": [at(c, i) for i, c in enumerate(big.chunk(n))],
        "scatter(chunk_sizes=)": [at(c, i) for i, c in enumerate(big.split(sizes))],
        "gather": at(torch.cat(parts), 0),
        "gather(destination='cpu')": dict(_rec(torch.cat(parts)), device="cpu"),
        "nccl.all_reduce": [at(total, i) for i in range(n)],
    }


API_MEANING = {
    "broadcast(devices=)": "one copy per device, each on its device",
    "broadcast returns the source itself": "the copy for the source's own device is the source (no copy)",
    "broadcast(out=)": "every preallocated output holds the source",
    "broadcast_coalesced": "every tensor (mixed shapes, dtypes) arrives on every device",
    "reduce_add": "the elementwise sum, on the destination device",
    "reduce_add_coalesced": "one sum per tensor position, on the destination device",
    "scatter": "equal chunks of dim 0, chunk k on device k",
    "scatter(chunk_sizes=)": "chunks of the given sizes, chunk k on device k",
    "gather": "the concatenation along dim 0, on the destination device",
    "gather(destination='cpu')": "the concatenation, on the CPU",
    "nccl.all_reduce": "in place: every device holds the sum",
}


def check_api(rec: dict, device: Callable[[int], str] = lambda i: f"cuda:{i}") -> list[str]:
    """Compare a recorded ``api_examples`` result with ``api_reference``: one line per call,
    ``✓ name: meaning`` or ``✗ name: what differs``. Values via ``torch.testing.assert_close``;
    devices, dtypes and shapes exactly."""
    ref = api_reference(int(rec["n_devices"]), device)
    lines = []
    for name, meaning in API_MEANING.items():
        problem = _diff(rec.get(name), ref[name])
        lines.append(f"✓ {name}: {meaning}" if problem is None else f"✗ {name}: {problem}")
    return lines


def _diff(got, want) -> str | None:
    """None if ``got`` matches ``want`` (nested _rec data), else a short description."""
    if isinstance(want, list):
        if not isinstance(got, list) or len(got) != len(want):
            return f"expected {len(want)} results, got {got!r:.80}"
        return next((p for p in map(_diff, got, want) if p), None)
    if not isinstance(want, dict):
        return None if got == want else f"expected {want!r}, got {got!r}"
    if not isinstance(got, dict):
        return f"expected a tensor, got {got!r:.80}"
    for key in ("device", "dtype", "shape"):
        if got.get(key) != want[key]:
            return f"{key} is {got.get(key)!r}, expected {want[key]!r}"
    try:
        torch.testing.assert_close(torch.tensor(got["values"]), torch.tensor(want["values"]))
    except AssertionError as exc:
        return f"values differ: {str(exc).splitlines()[0]}"
    return None


def one_device_examples(setup: CommSetup) -> dict:
    """What the API does with a single device (runs with 1 GPU): name -> bool (all True)."""
    comm, nccl, d = setup.comm, setup.nccl, setup.devices[0]
    x = torch.tensor(EXAMPLE, device=setup.device(d))
    y = x.clone()
    nccl.all_reduce([y])                                     # a one-GPU NCCL communicator

    def same(t):
        return t.data_ptr() == x.data_ptr()
    return {"broadcast(x, [0]) returns x itself, no copy": same(comm.broadcast(x, [d])[0]),
            "reduce_add([x]) returns x itself": same(comm.reduce_add([x], destination=d)),
            "scatter(x, [0]) returns a view of x, no copy": same(comm.scatter(x, [d])[0]),
            "gather([x]) makes a new tensor": not same(comm.gather([x], destination=d)),
            "nccl.all_reduce([y]) leaves y equal to x": torch.equal(y.cpu(), x.cpu())}


def dtype_rules(setup: CommSetup) -> dict:
    """Which path each mixed-dtype call takes and what it does (JSON: name -> {path, outcome}).

    Paths follow ``nccl.is_available``: contiguous tensors on distinct GPUs -> NCCL, which
    raises on mixed dtypes; a non-contiguous input or two inputs on one GPU -> fallback, which
    converts. Needs >= 2 devices."""
    comm, nccl, (d0, d1), dev = setup.comm, setup.nccl, setup.devices[:2], setup.device
    a32 = torch.tensor([[1.0, 2.0], [3.0, 4.0]], device=dev(d0))
    b16_1 = torch.full((2, 2), 0.5, dtype=torch.float16, device=dev(d1))
    b16_0 = b16_1.to(dev(d0))
    out16_1, out16_0 = torch.zeros_like(b16_1), torch.zeros_like(b16_0)
    cases = {
        "reduce_add fp32 (GPU 0) + fp16 (GPU 1)": ([a32, b16_1], lambda: comm.reduce_add([a32, b16_1], d0)),
        "reduce_add fp32 + fp16, non-contiguous (.t())": (
            [a32.t(), b16_1.t()], lambda: comm.reduce_add([a32.t(), b16_1.t()], d0)),
        "reduce_add fp32 + fp16, both on GPU 0": ([a32, b16_0], lambda: comm.reduce_add([a32, b16_0], d0)),
        "broadcast fp32 -> out=[fp16 on GPU 1]": ([a32, out16_1], lambda: comm.broadcast(a32, out=[out16_1])[0]),
        "broadcast fp32 -> out=[fp16 on GPU 0, fp16 on GPU 1]": (
            [a32, out16_0, out16_1], lambda: comm.broadcast(a32, out=[out16_0, out16_1])[1]),
        "nccl.all_reduce fp32 + fp16": ([a32, b16_1], lambda: nccl.all_reduce([a32.clone(), b16_1.clone()])),
    }
    return {name: {"path": "NCCL" if nccl.is_available(tensors) else "fallback (copies)",
                   "outcome": error_text(fn)} for name, (tensors, fn) in cases.items()}
