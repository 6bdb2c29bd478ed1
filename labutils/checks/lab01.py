"""Checkers for lab 01's exercises (torch.cuda.comm).

Each prints one ``✓`` line that reads the same on GPUs and on a CPU-only machine, or raises
``ExerciseError`` with a HINT. With >= 2 GPUs the learner's code runs on ``torch.cuda.comm``;
otherwise on ``labutils.labs.lab01_cuda_comm.devices.cpu_standin()`` (same signatures, CPU tensors), so the logic
is checked everywhere. ``comm`` is wrapped in a call counter to see *how* a result was built.
"""
from __future__ import annotations

import math

import torch

from . import fail, passed, run_or_reference
from ..labs.lab01_cuda_comm import devices
from ..bandwidth import AlphaBeta
from ..solutions import lab01 as solutions

# (alpha_us, beta_gbps, size_bytes): zero size, a latency-bound and two bandwidth-bound cases
PREDICT_CASES = ((10.0, 100.0, 0), (10.0, 100.0, 4096), (2.5, 400.0, 256 << 20), (40.0, 25.0, 1 << 30))
UNITS_HINT = ("t = alpha + S / beta in ms: alpha_us * 1e-3 ms, and S / beta = size_bytes / "
              "(beta_gbps * 1e9) seconds = size_bytes / (beta_gbps * 1e6) ms")


def predict_time(fn, fit: AlphaBeta | None = None, size_bytes: int = 256 << 20) -> float | None:
    """Exercise 1: ``fn(alpha_us, beta_gbps, size_bytes) -> ms`` must be the alpha-beta model.

    Checked on ``PREDICT_CASES`` (hardware-independent). Returns ``fn``'s prediction for
    ``size_bytes`` with the measured ``fit`` (None without one), for the notebook to compare
    with the measurement.
    """
    _, used_reference = run_or_reference(fn, solutions.predict_time_ms, *PREDICT_CASES[0])
    fn = solutions.predict_time_ms if used_reference else fn
    for alpha, beta, size in PREDICT_CASES:
        want = AlphaBeta(alpha, beta, 0.0).predict_ms(size)
        got = fn(alpha, beta, size)
        try:
            got = float(got)
        except (TypeError, ValueError):
            fail(f"predict_time_ms({alpha}, {beta}, {size}) returned {got!r}, not a number",
                 "return the time in milliseconds as a float")
        if not math.isfinite(got) or abs(got - want) > 1e-6 * want + 1e-12:
            off = got / want if want and got else float("nan")
            why = (" (a factor of 1000 off: check the units)" if any(
                abs(off - f) < 1e-3 * f for f in (1e3, 1e-3, 1e6, 1e-6)) else "")
            fail(f"predict_time_ms(alpha_us={alpha}, beta_gbps={beta}, size_bytes={size}) = {got:.6g} ms, "
                 f"the model gives {want:.6g} ms{why}", UNITS_HINT)
    passed(f"predict_time_ms matches t = alpha + S / beta on {len(PREDICT_CASES)} test cases "
           "(us, GB/s, bytes -> ms)")
    return float(fn(fit.alpha_us, fit.beta_gbps, size_bytes)) if fit is not None else None


def _default_setup() -> devices.CommSetup:
    enough = torch.cuda.is_available() and torch.cuda.device_count() >= 2
    return devices.gpu_setup() if enough else devices.cpu_standin(2)


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
    """Exercise 2: ``fn(tensors, comm)`` -> one tensor per input, on its device, each the sum of
    all inputs, built from ``comm.reduce_add`` + ``comm.broadcast`` (not nccl.all_reduce)."""
    setup = setup or _default_setup()
    comm = devices.CallCounter(setup.comm)
    gen = torch.Generator().manual_seed(1)
    host = [torch.randn(1000, generator=gen) for _ in setup.devices]
    expected = sum(host)
    tensors = [h.to(setup.device(i), copy=True) for h, i in zip(host, setup.devices)]  # in place is fine
    result, _ = run_or_reference(fn, solutions.all_reduce_from_reduce_add, tensors, comm)
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
    passed(f"my_all_reduce: every device holds the sum of all inputs (assert_close), built from "
           f"{calls['reduce_add']} reduce_add + {calls['broadcast']} broadcast")


def broadcast_many(fn, setup: devices.CommSetup | None = None) -> None:
    """Exercise 3: ``fn(tensors, devices, comm)`` -> ``out[k][j]`` = tensor j on devices[k],
    with a single ``comm.broadcast`` call (the job ``broadcast_coalesced`` does)."""
    setup = setup or _default_setup()
    comm = devices.CallCounter(setup.comm)
    gen = torch.Generator().manual_seed(2)
    host = [torch.randn(3, 4, generator=gen), torch.randn(10, generator=gen),
            torch.randn(2, 2, 2, generator=gen)]
    tensors = [h.to(setup.device(setup.devices[0]), copy=True) for h in host]
    result, _ = run_or_reference(fn, solutions.broadcast_many, tensors, list(setup.devices), comm)
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
