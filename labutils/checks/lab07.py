"""Checkers for lab 07's exercises, which are ``%%ranks`` cells: each fetches the learner's variable
from every rank of the notebook's pool and prints ``✓ ...`` or raises ``ExerciseError`` with a HINT.

A variable still ``None`` on every rank is "not attempted": the checker says so (no points) and the
notebook keeps going; nothing later needs the variables. The student's cell sets it to ``None`` and then
raises nbgrader's ``NotImplementedError`` stub on every rank, which ``%%ranks`` reports as "not attempted"
rather than as an error.
"""
from __future__ import annotations

from . import fail, not_attempted, passed, say_not_attempted


def _fetch(pool, name: str) -> list | None:
    """``name`` from every rank, or None (saying so) while it is still None on every rank."""
    values = pool.fetch(name)
    if all(not_attempted(v) for v in values):
        say_not_attempted(name, state="is still None on every rank (the %%ranks cell above)")
        return None
    return values


def _as(convert, values: list, name: str, hint: str) -> list:
    try:
        return [convert(v) for v in values]
    except (TypeError, ValueError, RuntimeError) as exc:
        fail(f"{name} on the ranks is {values!r} ({type(exc).__name__}: {exc})", hint)


MEAN_HINT = ("sum the ranks with dist.all_reduce(t) (op SUM by default), then divide by world_size; "
             "use .item() for a float")
SQUARES_HINT = ("dist.all_gather(list_of_world_size_tensors, mine) fills the list in rank order; each "
                "tensor must have the same shape and dtype as `mine`")


def mean_rank(pool) -> None:
    """Exercise 1: ``mean_rank`` is (world_size - 1) / 2 on every rank."""
    values = _fetch(pool, "mean_rank")
    if values is None:
        return
    want = (pool.world_size - 1) / 2
    got = _as(lambda v: round(float(v), 6), values, "mean_rank", MEAN_HINT)
    if got != [want] * len(got):
        hint = MEAN_HINT
        if got == [float(sum(range(pool.world_size)))] * len(got):
            hint = "that is the sum of the ranks: divide it by world_size"
        elif len(set(got)) > 1:
            hint = "the ranks disagree: every rank must call dist.all_reduce on its own tensor"
        fail(f"mean_rank on the ranks is {got}, expected {want} on every rank", hint)
    passed(f"mean_rank = {want} on all {len(got)} ranks")


def squares(pool) -> None:
    """Exercise 2: ``squares`` is ``[0, 1, 4, ...]`` (every rank's rank ** 2) on every rank."""
    values = _fetch(pool, "squares")
    if values is None:
        return
    want = [r * r for r in range(pool.world_size)]

    def to_ints(v):
        return [int(round(float(x.item() if hasattr(x, "item") else x))) for x in v]

    got = _as(to_ints, values, "squares", SQUARES_HINT)
    if any(g != want for g in got):
        hint = SQUARES_HINT
        if any(sorted(g) == want for g in got):
            hint = "the right values in the wrong order: all_gather's list is in rank order already"
        fail(f"squares on the ranks is {got}, expected {want} on every rank", hint)
    passed(f"squares = {want} on all {len(got)} ranks")
