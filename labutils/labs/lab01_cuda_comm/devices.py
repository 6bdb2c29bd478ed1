"""The devices lab 01 drives and the two modules it calls: ``torch.cuda.comm`` and ``torch.cuda.nccl``
on GPUs, or a CPU stand-in with the same signatures::

    from labutils.labs.lab01_cuda_comm import devices
    setup = devices.gpu_setup()          # >= 2 GPUs: torch.cuda.comm + torch.cuda.nccl
    setup = devices.cpu_standin(2)       # CPU tensors: every "device" is the CPU

The stand-in (``CpuComm``: plain tensor ops) lets the lab's code paths, its measurements and the
exercise checkers run without a GPU; ``CallCounter`` counts the calls a learner's function makes.
"""
from __future__ import annotations

import collections
import dataclasses

import torch


@dataclasses.dataclass
class CommSetup:
    """The devices and the two modules lab 01 calls: ``comm`` (``torch.cuda.comm``) and ``nccl``
    (``torch.cuda.nccl``); ``on_gpu`` False means the CPU stand-in."""
    devices: list
    comm: object
    nccl: object
    on_gpu: bool

    def device(self, index: int) -> torch.device:
        """The torch.device of device ``index`` (``cuda:index``, or ``cpu`` for the stand-in)."""
        return torch.device("cuda", index) if self.on_gpu else torch.device("cpu")

    def synchronize(self) -> None:
        """Wait for every device of the setup (no-op on the CPU)."""
        if self.on_gpu:
            for i in self.devices:
                torch.cuda.synchronize(i)


def gpu_setup(n_devices: int | None = None) -> CommSetup:
    """``torch.cuda.comm`` on GPUs ``0 .. n_devices-1`` (default: all).

    Raises:
        RuntimeError: fewer GPUs than asked for (with the fix).
    """
    import torch.cuda.comm as comm
    from torch.cuda import nccl
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    n = have if n_devices is None else n_devices
    if n < 1 or n > have:
        raise RuntimeError(f"gpu_setup(n_devices={n_devices}) needs {max(n, 1)} GPU(s), this machine "
                           f"has {have}. HINT: use cpu_standin() or the recorded results.")
    return CommSetup(list(range(n)), comm, nccl, True)


def cpu_standin(n_devices: int = 2) -> CommSetup:
    """The same interface on CPU tensors (``CpuComm``), for tests and CPU-only checkers."""
    standin = CpuComm()
    return CommSetup(list(range(n_devices)), standin, standin, False)


class CpuComm:
    """Stand-in for ``torch.cuda.comm`` + ``torch.cuda.nccl`` on CPU tensors: same signatures,
    plain tensor ops. Position 0 of a device list plays the source's device (returned as is)."""

    def broadcast(self, tensor, devices=None, *, out=None):
        if (devices is None) == (out is None):
            raise RuntimeError("Exactly one of 'devices' and 'out' must be specified")
        if out is not None:
            return tuple(o.copy_(tensor) for o in out)
        return tuple(tensor if k == 0 else tensor.clone() for k in range(len(devices)))

    def broadcast_coalesced(self, tensors, devices, buffer_size=10485760):
        return [list(tensors)] + [[t.clone() for t in tensors] for _ in devices[1:]]

    def reduce_add(self, inputs, destination=None):
        result = inputs[0] + inputs[1] if len(inputs) > 1 else inputs[0]
        for t in inputs[2:]:
            result = result + t
        return result

    def reduce_add_coalesced(self, inputs, destination=None, buffer_size=10485760):
        return tuple(self.reduce_add(list(group)) for group in zip(*inputs))

    def scatter(self, tensor, devices=None, chunk_sizes=None, dim=0, streams=None, *, out=None):
        if chunk_sizes is not None:
            return tuple(tensor.split(list(chunk_sizes), dim))
        return tuple(tensor.chunk(len(devices), dim))

    def gather(self, tensors, dim=0, destination=None, *, out=None):
        return torch.cat(list(tensors), dim)

    def all_reduce(self, inputs, outputs=None, op=0, streams=None, comms=None):
        total = self.reduce_add(list(inputs)).clone()
        for t in (outputs if outputs is not None else inputs):
            t.copy_(total)

    def is_available(self, tensors):
        return False


def bytes_moved(name: str, args: tuple, kwargs: dict) -> int:
    """Bytes a ``torch.cuda.comm`` call copies from one device to another: a broadcast sends its tensor to
    every destination but the source's own (one of ``devices``, or each ``out`` tensor beyond one); a
    ``reduce_add`` brings every input but the one already at the destination; the coalesced forms add up
    their tensors the same way. 0 for the other calls."""
    def nbytes(t) -> int:
        return t.numel() * t.element_size()
    first = args[0] if args else None
    if name == "broadcast":
        devices = args[1] if len(args) > 1 else kwargs.get("devices")
        targets = len(devices) if devices is not None else len(kwargs.get("out") or ())
        return nbytes(first) * max(targets - 1, 0)
    if name == "broadcast_coalesced":
        devices = args[1] if len(args) > 1 else kwargs["devices"]
        return sum(nbytes(t) for t in first) * max(len(devices) - 1, 0)
    if name == "reduce_add":
        return sum(nbytes(t) for t in first) - (nbytes(first[0]) if first else 0)
    if name == "reduce_add_coalesced":
        return sum(sum(nbytes(t) for t in group) - nbytes(group[0]) for group in zip(*first))
    return 0


class CallCounter:
    """Wraps ``comm``-like modules and counts calls by name (``.calls["broadcast"]``) and the bytes they
    copy between devices (``.bytes_moved``, see ``bytes_moved``)."""

    def __init__(self, inner):
        self._inner = inner
        self.calls = collections.Counter()
        self.bytes_moved = 0

    def __getattr__(self, name):
        attr = getattr(self._inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls[name] += 1
            self.bytes_moved += bytes_moved(name, args, kwargs)
            return attr(*args, **kwargs)
        return counted
