"""Exercise checkers: print a tick, or raise ``ExerciseError`` saying what is wrong and a HINT.

The notebook pattern (so that it still runs end to end unattended)::

    def my_all_reduce(tensors):        # exercise stub
        raise NotImplementedError       # <- your code here

    checks.lab01.all_reduce(my_all_reduce)   # ✓ ..., or ExerciseError with a HINT

A stub that raises ``NotImplementedError`` (or a prediction left as ``None``) counts as "not
attempted": the checker says so and checks the reference solution from ``labutils.solutions``
instead, so the notebook keeps going; a wrong attempt raises.
"""
from __future__ import annotations

import math


class ExerciseError(AssertionError):
    """A submitted exercise answer is wrong; the message ends with a HINT."""


def passed(what: str) -> None:
    """Print the success line."""
    print(f"✓ {what}")


def fail(what: str, hint: str) -> None:
    """Raise ``ExerciseError('✗ what. HINT: hint')``."""
    raise ExerciseError(f"✗ {what}. HINT: {hint}")


def not_attempted(value) -> bool:
    """True for ``None``/``...`` placeholders."""
    return value is None or value is Ellipsis


def say_not_attempted(reference: str) -> None:
    """Say plainly that the learner's stub was not filled in and that ``reference`` (a dotted name, or the
    function itself) is what gets checked and used from here on."""
    if callable(reference):
        reference = f"{reference.__module__}.{reference.__qualname__}"
    print(f"… not attempted: your function still raises NotImplementedError, so the reference solution "
          f"{reference} is checked and used instead. Write yours and run this cell again.")


def run_or_reference(fn, reference, *args, **kwargs):
    """Call ``fn(*args, **kwargs)``; if it raises NotImplementedError, say so and use ``reference``.

    Returns:
        (result, used_reference: bool)
    """
    try:
        return fn(*args, **kwargs), False
    except NotImplementedError:
        say_not_attempted(reference)
        return reference(*args, **kwargs), True


def implemented_or_reference(fn, reference, probe):
    """The function the rest of a notebook should use: ``fn`` once the learner has written it, else
    ``reference`` -- the "stub not attempted, so use the reference" step every checker needs.

    ``probe(fn)`` calls the function the way the check will (e.g. ``lambda f: f(2, 8)``). If the stub
    still raises NotImplementedError, ``say_not_attempted(reference)`` says so plainly and ``reference``
    is returned. Any other exception (a wrong attempt, or a probe that cannot run outside the check's
    ranks) returns ``fn``: the check that follows reports what is wrong with it.
    """
    try:
        probe(fn)
    except NotImplementedError:
        say_not_attempted(reference)
        return reference
    except Exception:  # noqa: BLE001 - the learner's code may raise anything; the check judges it
        return fn
    return fn


def run_ranks(rank_fn, *args, pool=None, world_size: int, timeout_s: float = 90.0,
              hint: str = "run it by hand in a rank function (pool.run) and print the shapes",
              hints: dict | None = None) -> list:
    """``rank_fn(rank, world_size, *args)`` on ``world_size`` gloo ranks for a checker: those of ``pool`` (a gloo
    ``RankPool`` of that size) or a fresh launch. The learner's code runs in it, so a hang or a rank's exception
    becomes ``ExerciseError``; its HINT is ``hints[text]`` for the first ``text`` found in the rank's error,
    else ``hint``.

    Raises:
        ValueError: ``pool`` is not a gloo pool of ``world_size`` ranks.
    """
    import labutils
    if pool is not None and (pool.backend != "gloo" or pool.world_size != world_size):
        raise ValueError(f"the checkers run on {world_size} gloo ranks, but this pool has {pool.world_size} "
                         f"{pool.backend!r} ranks. HINT: pass labutils.RankPool(world_size={world_size}, "
                         "backend='gloo'), or leave pool out.")
    try:
        if pool is not None:
            return pool.run(rank_fn, *args, timeout=timeout_s, output="quiet")
        return labutils.launch(rank_fn, *args, world_size=world_size, backend="gloo", timeout=timeout_s,
                               output="quiet")
    except labutils.RankTimeout:
        fail(f"your code did not return on {world_size} ranks within {timeout_s:g} s",
             "every rank must call the same collectives, in the same order, with matching sizes")
    except labutils.RankError as exc:
        what = (f"your code raised {exc.exc_type} on rank {exc.rank}: {exc.remote_message}"
                if exc.exc_type else f"{str(exc).split('. HINT')[0]} inside your code")
        fail(what, next((h for text, h in (hints or {}).items() if text in exc.remote_message), hint))


def check_close(got: float, expected: float, *, rel_tol: float, what: str, hint: str) -> None:
    """Pass if ``got`` is within ``rel_tol`` (relative) of ``expected``, else raise with HINT."""
    try:
        g = float(got)
    except (TypeError, ValueError):
        fail(f"{what}: expected a number, got {got!r}", hint)
    if not math.isfinite(g) or abs(g - expected) > rel_tol * abs(expected):
        fail(f"{what}: got {g:.4g}, expected {expected:.4g} (±{rel_tol:.0%})", hint)
    passed(f"{what}: {g:.4g} (expected {expected:.4g} ±{rel_tol:.0%})")
