"""Is a result the reference's? ``torch.testing.assert_close`` as an answer, the same on gloo and NCCL.

    from labutils.instruments import compare
    compare.close(y, y_ref)              # True / False (tensors, or lists of tensors; devices aligned)
    compare.mismatch(x.grad, ref.grad)   # None when close, else what differs, in one line
    compare.report(pool.run(check))      # the ranks' {statement: value}, one line each, or raise (strict)
    compare.failures(results)            # [] when every statement holds on every rank

Tensors are compared on the CPU (a GPU result against a CPU reference is compared by value, and a
mismatch reads the same on both backends); ``None`` matches only ``None``. ``tol`` are
``assert_close``'s ``rtol`` / ``atol``. ``report`` prints what ranks found in text that does not depend on
the machine (booleans, ints, shapes, short text; a float is refused), so a checked notebook output is the
same on gloo and on NCCL.
"""
from __future__ import annotations

import torch

MISSING = "missing: the gradient is None (not connected to the loss?)"


class Mismatch(str):
    """What ``mismatch`` found, as text: a statement whose value is a ``Mismatch`` does not hold."""


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
        return Mismatch(MISSING if got is None else "unexpected: a value where None was expected")
    try:
        torch.testing.assert_close(_plain(got), _plain(expected), **tol)
    except AssertionError as exc:
        return Mismatch(str(exc).strip().splitlines()[0])
    return None


def close(got, expected, **tol) -> bool:
    """``mismatch(got, expected) is None``."""
    return mismatch(got, expected, **tol) is None


def _statements(result: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(_statements(value, f"{name}: "))
        elif isinstance(value, float):
            raise TypeError(f"report prints what does not depend on the machine; {name!r} is the float {value!r}. "
                            "HINT: return a bool, an int, or rounded text (f'{x:.2f}') from the rank")
        else:
            out[name] = value
    return out


def failures(results: list[dict]) -> list[str]:
    """The statements of the ranks' ``results`` (as ``report`` takes them) that do not hold -- a value
    ``False`` or a ``Mismatch`` on some rank -- each with those ranks when there are several results."""
    per_rank = [_statements(r) for r in results]
    failed = []
    for name in per_rank[0]:
        bad = [i for i, r in enumerate(per_rank) if r.get(name) is False or isinstance(r.get(name), Mismatch)]
        if bad:
            failed.append(f"{name} (rank {', '.join(map(str, bad))})" if len(per_rank) > 1 else name)
    return failed


def report(results: list[dict], title: str = "", *, strict: bool = False) -> None:
    """Print the ranks' ``results`` (one ``{statement: value}`` dict per rank, or one dict the ranks' results
    were already combined into; a nested dict's keys follow its statement, ``"m = 4: output"``):
    ``statement: value`` once when every rank agrees, else each rank's value; ``title`` first, when
    given. The same text on gloo and NCCL. A statement may be meant to be false (``sum == one device
    with lr: False``); ``strict`` is for results that must all hold.

    Raises:
        AssertionError: ``strict`` and some statement does not hold (``failures``: it names them, with the ranks).
        TypeError: a value is a float (machine-dependent text).
    """
    per_rank = [_statements(r) for r in results]
    if title:
        print(title)
    for name in per_rank[0]:
        values = [r.get(name) for r in per_rank]
        shown = (str(values[0]) if all(v == values[0] for v in values)
                 else "ranks differ: " + ", ".join(f"rank {i} {v}" for i, v in enumerate(values)))
        print(f"{'  ' if title else ''}{name}: {shown}")
    failed = failures(results) if strict else []
    if failed:
        raise AssertionError(f"{title or 'result'}: does not hold: " + "; ".join(failed))
