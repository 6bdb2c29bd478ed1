"""Checkers for lab 01's exercises (torch.cuda.comm).

Each prints one ``✓`` line that reads the same on GPUs and on a CPU-only machine, or raises
``ExerciseError`` with a HINT. With >= 3 GPUs the learner's code runs on ``torch.cuda.comm``;
otherwise on ``labutils.labs.lab01_cuda_comm.devices.cpu_standin(3)`` (same signatures, CPU tensors), so the
logic is checked everywhere, on three devices: an answer that only works for two fails. ``comm`` is wrapped in a call counter to see *how* a result was built.
"""
from __future__ import annotations

import torch

from . import attempted, fail, implemented_or_standin, passed, say_not_attempted, standin
from ..labs.lab01_cuda_comm import devices


def torch_flat_views(tensors):
    """The stand-in for an unwritten ``my_flat_views``: torch's own flattening
    (``torch.nn.utils.parameters_to_vector``) and ``vector_to_parameters``, which makes each tensor's
    data a view of the flat buffer."""
    flat = torch.nn.utils.parameters_to_vector(tensors)
    views = [torch.empty_like(t) for t in tensors]
    torch.nn.utils.vector_to_parameters(flat, views)
    return flat, views


standin(torch_flat_views, "torch.nn.utils.parameters_to_vector / vector_to_parameters")


CHECK_DEVICES = 3   # at least three devices: with two, "sum the first and the second" passes as a sum of all


def _default_setup() -> devices.CommSetup:
    """Every GPU where there are at least ``CHECK_DEVICES``; else the CPU stand-in with ``CHECK_DEVICES``
    devices (a 2-GPU machine checks the logic on the stand-in, so that no answer written for two passes)."""
    enough = torch.cuda.is_available() and torch.cuda.device_count() >= CHECK_DEVICES
    return devices.gpu_setup() if enough else devices.cpu_standin(CHECK_DEVICES)


def _built_as_asked(calls, builtin: str, builtin_hint: str, ok: bool, what: str, hint: str) -> None:
    """The result was right; now check *how* (call counts): not the built-in, and ``ok``."""
    if calls[builtin]:
        fail(f"the result is right, but it came from the built-in {builtin}", builtin_hint)
    if not ok:
        fail(f"the result is right, but {what}", hint)


def _calls_hint(calls) -> str:
    return (f"it made {calls['reduce_add']} reduce_add and {calls['broadcast']} broadcast call(s) "
            "through the `comm` argument")


def all_reduce(fn, setup: devices.CommSetup | None = None) -> None:
    """Exercise 3: ``fn(tensors, comm)`` -> one tensor per input, on its device, each the sum of
    all inputs, built from ``comm.reduce_add`` + ``comm.broadcast`` (not nccl.all_reduce)."""
    setup = setup or _default_setup()
    comm = devices.CallCounter(setup.comm)
    gen = torch.Generator().manual_seed(1)
    host = [torch.randn(1000, generator=gen) for _ in setup.devices]
    expected = sum(host)
    tensors = [h.to(setup.device(i), copy=True) for h, i in zip(host, setup.devices)]  # in place is fine
    if not attempted(fn, lambda f: f([t.clone() for t in tensors], devices.CallCounter(setup.comm))):
        say_not_attempted("my_all_reduce")
        return
    result = fn(tensors, comm)
    result = list(result) if isinstance(result, (list, tuple)) else result
    if not isinstance(result, list) or len(result) != len(tensors):
        fail(f"my_all_reduce returned {type(result).__name__}, not a list of {len(tensors)} tensors",
             "return one tensor per input: list(comm.broadcast(total, [t.device for t in tensors]))")
    for k, (out, inp) in enumerate(zip(result, tensors)):
        if not isinstance(out, torch.Tensor) or out.device != inp.device:
            where = out.device if isinstance(out, torch.Tensor) else type(out).__name__
            fail(f"output {k} is on {where}, its input on {inp.device}",
                 "broadcast to the inputs' devices: [t.device for t in tensors]")
        try:
            torch.testing.assert_close(out.cpu(), expected)
        except AssertionError as exc:
            fail(f"output {k} is not the sum of the inputs ({str(exc).splitlines()[0]})",
                 "comm.reduce_add(tensors, destination=...) sums every input onto one GPU")
    calls = comm.calls
    _built_as_asked(calls, "all_reduce", "that is nccl.all_reduce; build it from comm.reduce_add (sum "
                    "onto one GPU) and comm.broadcast (copy to all)",
                    calls["reduce_add"] >= 1 and calls["broadcast"] >= 1, _calls_hint(calls),
                    "call comm.reduce_add, then comm.broadcast, on the `comm` you are given")
    n, size = len(tensors), tensors[0].numel() * tensors[0].element_size()
    if comm.bytes_moved > 2 * (n - 1) * size:
        fail(f"the result is right, but your calls copied {comm.bytes_moved} bytes between the {n} devices; "
             f"one reduce_add and one broadcast of the sum copy {2 * (n - 1) * size}",
             "sum onto one device once (reduce_add of every input), then broadcast that one sum: sending every "
             "input to every device moves n - 1 times as much")
    passed(f"my_all_reduce: every device holds the sum of all inputs (assert_close), built from "
           f"{calls['reduce_add']} reduce_add + {calls['broadcast']} broadcast, each input's bytes sent twice")


def broadcast_many(fn, setup: devices.CommSetup | None = None) -> None:
    """Exercise 1: ``fn(tensors, devices, comm)`` -> ``out[k][j]`` = tensor j on devices[k],
    with a single ``comm.broadcast`` call (the job ``broadcast_coalesced`` does)."""
    setup = setup or _default_setup()
    comm = devices.CallCounter(setup.comm)
    gen = torch.Generator().manual_seed(2)
    host = [torch.randn(3, 4, generator=gen), torch.randn(10, generator=gen),
            torch.randn(2, 2, 2, generator=gen)]
    tensors = [h.to(setup.device(setup.devices[0]), copy=True) for h in host]
    if not attempted(fn, lambda f: f([t.clone() for t in tensors], list(setup.devices),
                                     devices.CallCounter(setup.comm))):
        say_not_attempted("my_broadcast_many")
        return
    result = fn(tensors, list(setup.devices), comm)
    if not isinstance(result, (list, tuple)) or len(result) != len(setup.devices):
        fail(f"my_broadcast_many returned {type(result).__name__} with "
             f"{len(result) if hasattr(result, '__len__') else '?'} entries, expected one per device",
             "return [[tensor j on device k for j] for k]")
    for k, (per_device, i) in enumerate(zip(result, setup.devices)):
        if len(per_device) != len(host):
            fail(f"device {k} got {len(per_device)} tensors, expected {len(host)}",
                 "split the flat copy by [t.numel() for t in tensors]")
        for j, (got, want) in enumerate(zip(per_device, host)):
            if got.shape != want.shape or got.device != setup.device(i):
                fail(f"tensor {j} on device {k} has shape {tuple(got.shape)} on {got.device}, expected "
                     f"{tuple(want.shape)} on {setup.device(i)}", "use piece.view_as(t) after split")
            if not torch.equal(got.cpu(), want):
                fail(f"tensor {j} on device {k} holds other values than the source",
                     "split the flat copy in the order you concatenated: sizes [t.numel() for t in tensors]")
    calls = comm.calls
    _built_as_asked(calls, "broadcast_coalesced", "do its job yourself: torch.cat the flattened "
                    "tensors, one comm.broadcast, then split", calls["broadcast"] == 1,
                    f"it made {calls['broadcast']} comm.broadcast calls",
                    "one call for all: flatten with torch.cat([t.reshape(-1) for t in tensors]) first")
    passed(f"my_broadcast_many: {len(host)} tensors of {len(host)} shapes arrive intact on every "
           "device with a single comm.broadcast")


def flat_views(fn):
    """Exercise 2: ``fn(tensors) -> (flat, views)``: one 1-D buffer holding every tensor's elements in
    order, and one tensor per input with its shape that is a *view* of the buffer (no copy), so that a
    write to the buffer -- a broadcast into it, say -- shows in every view.

    Checked on CPU tensors (the idea does not depend on the device). Returns the function to use from
    here on: ``fn`` if it passed, the stand-in ``torch_flat_views`` if ``fn`` is not written yet.
    """
    gen = torch.Generator().manual_seed(3)
    host = [torch.randn(3, 4, generator=gen), torch.randn(10, generator=gen), torch.randn(2, 2, 2, generator=gen)]
    total = sum(t.numel() for t in host)
    if not attempted(fn, lambda f: f([torch.ones(2)])):
        return implemented_or_standin(fn, torch_flat_views, lambda f: f([torch.ones(2)]), "my_flat_views")
    result = fn([t.clone() for t in host])
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        fail(f"my_flat_views returned {type(result).__name__}, not a pair (flat, views)", "return flat, views")
    flat, views = result
    if not isinstance(flat, torch.Tensor) or flat.dim() != 1 or flat.numel() != total:
        what = tuple(flat.shape) if isinstance(flat, torch.Tensor) else type(flat).__name__
        fail(f"flat is {what}, expected a 1-D tensor of {total} elements (all the tensors' elements)",
             "torch.cat([t.reshape(-1) for t in tensors])")
    if not isinstance(views, (list, tuple)) or len(views) != len(host):
        fail(f"views has {len(views) if hasattr(views, '__len__') else '?'} entries, expected {len(host)}",
             "one view per input tensor, in order")
    for j, (v, want) in enumerate(zip(views, host)):
        if not isinstance(v, torch.Tensor) or v.shape != want.shape:
            fail(f"view {j} has shape {tuple(getattr(v, 'shape', ()))}, expected {tuple(want.shape)}",
                 "split the buffer by [t.numel() for t in tensors], then piece.view(t.shape)")
        if not torch.equal(v, want):
            fail(f"view {j} holds other values than tensor {j}",
                 "split in the order you concatenated: sizes [t.numel() for t in tensors]")
        if v.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr():
            fail(f"view {j} is a copy, not a view of flat",
                 "split and view return views of the buffer; cat, clone and reshape of a split piece may copy")
    flat.add_(1.0)                                   # a write to the buffer ...
    if not all(torch.equal(v, want + 1.0) for v, want in zip(views, host)):
        fail("a write to flat does not show in every view", "build every view from flat itself")
    passed(f"my_flat_views: one buffer of {total} elements, {len(host)} views of it with their shapes; "
           "a write to the buffer shows in every view")
    return fn
