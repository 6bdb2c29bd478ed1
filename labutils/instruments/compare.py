"""Is a result the reference's? ``torch.testing.assert_close`` as an answer, the same on gloo and NCCL.

    from labutils.instruments import compare
    compare.close(y, y_ref)              # True / False (tensors, or lists of tensors; devices aligned)
    compare.mismatch(x.grad, ref.grad)   # None when close, else what differs, in one line

Tensors are compared on the CPU (a GPU result against a CPU reference is compared by value, and a
mismatch reads the same on both backends); ``None`` matches only ``None``. ``tol`` are
``assert_close``'s ``rtol`` / ``atol``.
"""
from __future__ import annotations

import torch

MISSING = "missing: the gradient is None (not connected to the loss?)"


def _plain(x):
    if isinstance(x, torch.Tensor):   # a DTensor stays where its mesh is: compared as DTensor does
        return x.detach() if hasattr(x, "placements") else x.detach().cpu()
    if isinstance(x, (list, tuple)):
        return [_plain(t) for t in x]
    return x


def mismatch(got, expected, **tol) -> str | None:
    """``None`` if ``assert_close(got, expected)`` passes, else the first line of its message (or
    ``MISSING`` when ``got`` is None and ``expected`` is not)."""
    if got is None or expected is None:
        if got is None and expected is None:
            return None
        return MISSING if got is None else "unexpected: a value where None was expected"
    try:
        torch.testing.assert_close(_plain(got), _plain(expected), **tol)
    except AssertionError as exc:
        return str(exc).strip().splitlines()[0]
    return None


def close(got, expected, **tol) -> bool:
    """``mismatch(got, expected) is None``."""
    return mismatch(got, expected, **tol) is None
