"""Exercise checkers: print a tick, or raise ``ExerciseError`` saying what is wrong and a HINT.

The notebook pattern (so that it still runs end to end unattended)::

    def my_all_reduce(tensors):        # exercise stub (the student edition's answer cell)
        raise NotImplementedError       # <- your code here

    checks.lab01.all_reduce(my_all_reduce)   # ✓ ..., or ExerciseError with a HINT

A stub that raises ``NotImplementedError`` (or a prediction left as ``None``) counts as "not
attempted": the checker says so on stderr -- which is also how nbgrader's autograder gives such a test
cell no points without stopping the notebook -- and, where a later cell needs the exercise's result,
returns a *stand-in* that does not show the answer (torch's own collective for a hand-written one, the
library's model for a formula) and names it. Checkers judge against torch's collectives, invariants and
recorded references; they never import the reference solutions (``labutils.solutions``, which the
student edition does not ship).
"""
from __future__ import annotations

import math
import sys


class ExerciseError(AssertionError):
    """A submitted exercise answer is wrong; the message ends with a HINT."""


def passed(what: str) -> None:
    """Print the success line."""
    print(f"✓ {what}")


def fail(what: str, hint: str) -> None:
    """Raise ``ExerciseError('✗ what. HINT: hint')``."""
    raise ExerciseError(f"✗ {what}. HINT: {hint}") from None


def not_attempted(value) -> bool:
    """True for ``None``/``...`` placeholders."""
    return value is None or value is Ellipsis


def say_not_attempted(what: str, standin: str | None = None, *,
                      state: str = "still raises NotImplementedError") -> None:
    """Say plainly, on stderr, that ``what`` (the learner's function) is in its ``state`` (a stub) and, if
    given, which ``standin`` the rest of the notebook uses in its place.

    On stderr because a test cell that writes to stderr gets no points from nbgrader's autograder,
    while the notebook goes on: "not attempted" is neither a pass nor a crash.
    """
    line = f"… not attempted: {what} {state}, so nothing was checked (no points)."
    if standin:
        line += f" From here on the notebook uses {standin} in its place (it does not show the answer)."
    print(line + " Write yours and run this cell again.", file=sys.stderr, flush=True)


def standin(fn, description: str):
    """Mark ``fn`` as the stand-in for an unattempted exercise (``is_standin``); returns ``fn``."""
    fn.labutils_standin = description
    return fn


def is_standin(fn) -> bool:
    """True if ``fn`` is a checker's stand-in, not the learner's function."""
    return bool(getattr(fn, "labutils_standin", None))


def attempted(fn, probe) -> bool:
    """False if ``probe(fn)`` (a call the way the check makes it) raises NotImplementedError. Any other
    exception counts as attempted: the check that follows reports what is wrong."""
    try:
        probe(fn)
    except NotImplementedError:
        return False
    except Exception:  # noqa: BLE001 - the learner's code may raise anything; the check judges it
        return True
    return True


def implemented_or_standin(fn, stand_in, probe, what: str):
    """The function the rest of a notebook should use: ``fn`` once the learner has written it, else
    ``stand_in`` (marked with ``standin``), after saying so."""
    if attempted(fn, probe):
        return fn
    say_not_attempted(what, getattr(stand_in, "labutils_standin", None))
    return stand_in


DEADLOCK_HINT = "every rank must call the same collectives, in the same order, with matching sizes"


def run_ranks(rank_fn, *args, world_size: int | None, backend: str | None = "gloo", pool=None, timeout_s: float = 90.0,
              hint: str = "run it by hand in a rank function (pool.run) and print the shapes",
              hints: dict | None = None, hang_hint: str = DEADLOCK_HINT, kwargs: dict | None = None) -> list:
    """``rank_fn(rank, world_size, *args)`` on ``world_size`` ranks of ``backend`` for a checker: those of
    ``pool`` (a ``RankPool`` of that backend and size) or a fresh launch. The learner's code runs in it,
    so a hang becomes ``ExerciseError`` with ``hang_hint``, and a rank's exception one whose HINT is
    ``hints[text]`` for the first ``text`` found in the rank's error, else ``hint``.

    ``backend=None`` / ``world_size=None`` take launch's defaults (NCCL with enough GPUs, else gloo) and
    accept any pool's.

    Raises:
        ValueError: ``pool`` is not a pool of ``world_size`` ranks of ``backend``.
    """
    import labutils
    if pool is not None and (world_size not in (None, pool.world_size) or backend not in (None, pool.backend)):
        raise ValueError(f"this checker runs on {world_size} {backend or 'any-backend'} ranks, but the pool "
                         f"has {pool.world_size} {pool.backend!r} ranks. HINT: pass labutils.RankPool("
                         f"world_size={world_size}, backend={backend!r}), or leave pool out.")
    try:
        if pool is not None:
            return pool.run(rank_fn, *args, timeout=timeout_s, output="quiet", kwargs=kwargs)
        return labutils.launch(rank_fn, *args, world_size=world_size, backend=backend, timeout=timeout_s,
                               output="quiet", kwargs=kwargs)
    except labutils.RankTimeout as exc:
        fail(f"your code did not finish within {timeout_s:g} s (ranks {exc.ranks} were still waiting)",
             hang_hint)
    except labutils.RankError as exc:
        what = (f"your code raised {exc.exc_type} on rank {exc.rank}: {exc.remote_message}"
                if exc.exc_type else f"{str(exc).split('. HINT')[0]} inside your code")
        fail(what, next((h for text, h in (hints or {}).items() if text in (exc.remote_message or "")), hint))


def check_close(got: float, expected: float, *, rel_tol: float, what: str, hint: str) -> None:
    """Pass if ``got`` is within ``rel_tol`` (relative) of ``expected``, else raise with HINT."""
    try:
        g = float(got)
    except (TypeError, ValueError):
        fail(f"{what}: expected a number, got {got!r}", hint)
    if not math.isfinite(g) or abs(g - expected) > rel_tol * abs(expected):
        fail(f"{what}: got {g:.4g}, expected {expected:.4g} (±{rel_tol:.0%})", hint)
    passed(f"{what}: {g:.4g} (expected {expected:.4g} ±{rel_tol:.0%})")


# ---- what a rank put on the wire (instruments.ledger) ------------------------------------------------------
#
# Inside the ranks a checker runs the learner's code under a ``Ledger`` and sends back ``ledger_report(book)``;
# in the notebook's process it judges the reports of all ranks:
#
#     def _rank(rank, world_size, fn):
#         with Ledger() as book:
#             fn(tensor)
#         return {"equal": ..., "sent": checks.ledger_report(book)}
#
#     sent = [r["sent"] for r in reports]
#     checks.expect_only_ops(sent, {"send", "recv"}, "your ring", "use dist.isend / dist.irecv (or P2POp) only")
#     checks.expect_calls(sent, {"send": 2 * (n - 1), "recv": 2 * (n - 1)}, "your ring", "one send and one recv a step")
#     checks.expect_peers(sent, lambda rank, n: {(rank + 1) % n}, "your ring", "send to rank + 1 only")
#     checks.expect_wire_bytes(sent, 2 * (n - 1) / n * size_bytes, "your ring all-reduce",
#                              "a ring all-reduce sends 2 (n-1)/n of the tensor per rank")

def ledger_report(book) -> dict:
    """What ``book`` (an ``instruments.ledger.Ledger``, inside a rank) saw, as plain data a rank can return:
    ``{"counts": {op: calls}, "wire_bytes": bytes this rank sent, "size_bytes": bytes handed over,
    "sent_to": {peer: bytes}, "received_from": {peer: bytes}, "calls": [(op, peer, size_bytes, wire_bytes)]}``
    (``peer`` is a global rank for a send or recv, None for a collective)."""
    sent_to: dict[int, int] = {}
    received_from: dict[int, int] = {}
    for r in book.records:
        if r.op == "send":
            sent_to[r.peer] = sent_to.get(r.peer, 0) + r.size_bytes
        elif r.op == "recv":
            received_from[r.peer] = received_from.get(r.peer, 0) + r.size_bytes
    return {"counts": book.counts(), "wire_bytes": float(book.wire_bytes_per_rank()),
            "size_bytes": int(sum(r.size_bytes for r in book.records)),
            "sent_to": dict(sorted(sent_to.items())), "received_from": dict(sorted(received_from.items())),
            "calls": [(r.op, r.peer, r.size_bytes, r.wire_bytes) for r in book.records]}


def _calls_text(counts: dict) -> str:
    return ", ".join(f"{op} x{n}" for op, n in counts.items()) or "nothing"


def expect_only_ops(reports: list, allowed, what: str, hint: str) -> None:
    """Fail unless every rank's ``ledger_report`` holds only ops of ``allowed`` (ledger names: ``"send"``,
    ``"recv"``, ``"all_reduce"``, ...) and at least one op. ``reports[rank]``, in rank order."""
    allowed = set(allowed)
    for rank, rep in enumerate(reports):
        extra = {op: n for op, n in rep["counts"].items() if op not in allowed}
        if extra or not rep["counts"]:
            fail(f"{what}: rank {rank} issued {_calls_text(rep['counts'])}; "
                 f"expected only {', '.join(sorted(allowed))}", hint)


def expect_calls(reports: list, expected, what: str, hint: str) -> None:
    """Fail unless each rank issued exactly the calls ``expected`` gives -- ``{op: count}`` for every rank, or
    ``expected(rank, world_size) -> {op: count}`` -- as its ``ledger_report`` counts them (e.g. a ring
    all-reduce: ``{"send": 2 * (n - 1), "recv": 2 * (n - 1)}``)."""
    n = len(reports)
    for rank, rep in enumerate(reports):
        want = dict(expected(rank, n) if callable(expected) else expected)
        if rep["counts"] != want:
            fail(f"{what}: rank {rank} issued {_calls_text(rep['counts'])}; the algorithm issues "
                 f"{_calls_text(want)}", hint)


def expect_peers(reports: list, expected, what: str, hint: str) -> None:
    """Fail unless each rank sent to exactly the peers ``expected(rank, world_size)`` returns (a set of global
    ranks), as its ``ledger_report`` shows."""
    n = len(reports)
    for rank, rep in enumerate(reports):
        want, got = set(expected(rank, n)), set(rep["sent_to"])
        if got != want:
            fail(f"{what}: rank {rank} sent to {sorted(got) or 'no rank'}; the algorithm sends to "
                 f"{sorted(want) or 'no rank'}", hint)


def expect_wire_bytes(reports: list, expected, what: str, hint: str, *, rel_tol: float = 1e-6) -> None:
    """Fail unless each rank put ``expected`` bytes on the wire (its ``ledger_report``'s ``wire_bytes``: the
    bytes it sent, nccl-tests' ring factors for collectives), within ``rel_tol``. ``expected``: one number for
    every rank, a list by rank, or ``expected(rank, world_size)``.

    Raises:
        ValueError: ``expected`` is neither (a checker's mistake, not the learner's).
    """
    n = len(reports)
    for rank, rep in enumerate(reports):
        if callable(expected):
            want = expected(rank, n)
        elif isinstance(expected, (list, tuple)):
            want = expected[rank]
        elif isinstance(expected, (int, float)):
            want = expected
        else:
            raise ValueError(f"expected={expected!r}: not bytes. HINT: a number, a list by rank, or a function "
                             "(rank, world_size) -> bytes.")
        got = rep["wire_bytes"]
        if abs(got - want) > rel_tol * max(abs(want), 1.0):
            more = "more" if got > want else "less"
            fail(f"{what}: rank {rank} put {got:,.0f} bytes on the wire ({_calls_text(rep['counts'])}), "
                 f"{more} than the {want:,.0f} the algorithm sends", hint)
