"""Checkers for lab 04 (model parallelism and pipelining): the 1F1B order (simulated), a predicted bubble,
and the 1F1B loop (on gloo ranks against the one-device model)."""
from __future__ import annotations

from ..labs.lab04_pipeline.schedule import ScheduleDeadlock, peak_in_flight, schedule_order, simulate
from . import attempted, check_close, fail, not_attempted, passed, run_ranks, say_not_attempted, standin

# (p, m): m > p, m = p, m < p, m >> p, one stage; the deep pipes first, where a wrong warm-up deadlocks
ORDER_CASES = ((4, 9), (3, 6), (4, 4), (8, 3), (4, 2), (3, 2), (2, 4), (2, 1), (2, 32), (4, 64), (1, 3))
T_F, T_B = 1.0, 2.0   # the simulated forward and backward times of one micro-batch (a backward ~ 2 forwards)


def _lab_order(p, m):
    return schedule_order("1f1b", p, m)


standin(_lab_order, "the lab's schedule (labutils.labs.lab04_pipeline.schedule.schedule_order('1f1b', p, m))")


def usable_order(fn):
    """``fn`` if the learner wrote it, else the lab's 1F1B order (the stand-in), saying so."""
    if attempted(fn, lambda f: f(2, 2)):
        return fn
    say_not_attempted("my_1f1b_order", _lab_order.labutils_standin)
    return _lab_order


def _as_order(got, p: int, m: int):
    """The learner's answer as a list of p lists of (kind, i), or fail saying what shape it has."""
    where = f"my_1f1b_order(p={p}, m={m})"
    hint = 'return one list per stage, p lists in all, each of ops ("F", i) and ("B", i), i = 0 .. m - 1'
    if not isinstance(got, (list, tuple)) or len(got) != p:
        fail(f"{where} returned {type(got).__name__} of length {len(got) if hasattr(got, '__len__') else '?'}, "
             f"not {p} lists", hint)
    order = []
    for s, ops in enumerate(got):
        if not isinstance(ops, (list, tuple)):
            fail(f"{where}: stage {s}'s entry is {ops!r}, not a list of ops", hint)
        stage = []
        for op in ops:
            if (not isinstance(op, (list, tuple)) or len(op) != 2 or op[0] not in ("F", "B")
                    or isinstance(op[1], bool) or not isinstance(op[1], int)):
                fail(f"{where}: stage {s} has {op!r}, which is not an op", hint)
            stage.append((op[0], op[1]))
        order.append(stage)
    return order


def _once_each(order, p: int, m: int) -> None:
    for s, ops in enumerate(order):
        for kind in ("F", "B"):
            got = sorted(i for k, i in ops if k == kind)
            if got != list(range(m)):
                missing = sorted(set(range(m)) - set(got))
                extra = sorted({i for i in got if got.count(i) > 1 or not 0 <= i < m})
                fail(f"p = {p}, m = {m}: stage {s} runs {kind} of micro-batches {got}"
                     + (f" (missing {missing})" if missing else "") + (f" (twice or out of range: {extra})" if extra else ""),
                     f"every stage runs the forward and the backward of each of the m micro-batches "
                     f"0 .. {m - 1} exactly once")
        seen = set()
        for k, i in ops:
            if k == "B" and i not in seen:
                fail(f"p = {p}, m = {m}: stage {s} runs B{i} before its own F{i}",
                     "a micro-batch's backward needs the activations its forward kept on the same stage: "
                     "F of i comes before B of i in every stage's list")
            if k == "F":
                seen.add(i)


DEADLOCK_HINT = ("each stage runs its list in order and blocks on its next op until what that op receives exists "
                 "(the forward of i from stage s - 1, the gradient of i from stage s + 1). Follow the waits above: "
                 "a stage that goes to a backward before running the forwards its next stage still needs starves that "
                 "stage; count, for each stage, how many forwards must pass it before the last stage can run its "
                 "first backward and the gradient can come back")


def _judge_order(order, p: int, m: int) -> float:
    """Fail on the first rule ``order`` breaks; return its simulated makespan (units of t_f)."""
    _once_each(order, p, m)
    try:
        _, makespan = simulate(order, t_f=T_F, t_b=T_B)
    except ScheduleDeadlock as exc:
        fail(f"p = {p}, m = {m}: your order deadlocks: {exc.waits}",
             DEADLOCK_HINT)
    held = peak_in_flight(order)
    for s, k in enumerate(held):
        if k > p - s:
            gpipe = order == schedule_order("gpipe", p, m)
            fail(f"p = {p}, m = {m}: stage {s} holds {k} micro-batches' activations at once; 1F1B holds at most "
                 f"p - s = {p - s} there" + (" (this is GPipe's order: every forward, then every backward)" if gpipe else ""),
                 "a stage keeps a micro-batch's activations from its forward to its backward; to hold fewer, run a "
                 "backward as soon as its gradient can arrive, then one forward, and so on -- not all forwards first")
    _, gpipe_makespan = simulate(schedule_order("gpipe", p, m), t_f=T_F, t_b=T_B)
    if makespan > gpipe_makespan + 1e-9:
        fail(f"p = {p}, m = {m}: your order is valid but its step lasts {makespan:g} t_f, GPipe's "
             f"{gpipe_makespan:g} t_f (t_b = {T_B:g} t_f)",
             "the stages wait for each other more than they must: before its first backward, let each stage run as "
             "many forwards as the memory bound allows, so that the pipe stays full")
    return makespan


def one_f_one_b_order(fn) -> None:
    """Judge ``fn(p, m)`` -- per stage, the list of ("F", i) / ("B", i) it runs -- on ``ORDER_CASES`` by
    simulating it (``schedule.simulate``: each stage runs its list in order, blocking until what an op
    receives exists): every F and B once per stage, each B after its own F, no deadlock, at most p - s
    micro-batches' activations held on stage s, and a step no longer than GPipe's."""
    if not attempted(fn, lambda f: f(2, 2)):
        say_not_attempted("my_1f1b_order")
        return
    for p, m in ORDER_CASES:
        _judge_order(_as_order(fn(p, m), p, m), p, m)
    ps, ms = sorted({p for p, _ in ORDER_CASES}), sorted({m for _, m in ORDER_CASES})
    passed(f"your 1F1B order holds on {len(ORDER_CASES)} cases (p = {', '.join(map(str, ps))}; m from {ms[0]} to "
           f"{ms[-1]}, below and far above p): every F and B once per stage, each B after its own F, no deadlock "
           f"when each stage runs its list in order, at most p - s micro-batches held on stage s, "
           f"and each step as short as GPipe's")


def prediction_bubble(answer, p: int, m: int) -> None:
    """A predicted bubble (fraction, e.g. 0.11, or a percentage like 11) vs the model's value."""
    want = (p - 1) / (m + p - 1)
    if not_attempted(answer):
        print(f"… no prediction written: the model says {want:.3f} for p = {p}, m = {m}.")
        return
    try:
        value = float(answer)
    except (TypeError, ValueError):
        fail(f"the prediction must be a number, got {answer!r}", "write e.g. 0.25 for a quarter of the step")
    if value > 1:
        value /= 100  # written as a percentage
    check_close(value, want, rel_tol=0.02, what=f"predicted bubble at p = {p}, m = {m}",
                hint="the step has m + p - 1 slots; each stage is idle in p - 1 of them")


def _order_problem(order, rank: int, p: int, m: int) -> str | None:
    """What is wrong with one stage's order of forwards and backwards for 1F1B, or None."""
    fwd = [i for kind, i in order if kind == "F"]
    if sorted(fwd) != list(range(m)) or sorted(i for kind, i in order if kind == "B") != list(range(m)):
        return (f"stage {rank} ran forwards {fwd} and backwards "
                f"{[i for kind, i in order if kind == 'B']}: each of the {m} micro-batches needs exactly one of each")
    held = peak = 0
    for kind, _ in order:
        held += 1 if kind == "F" else -1
        peak = max(peak, held)
    if peak > min(m, p - rank):
        return (f"stage {rank} held {peak} micro-batches' activations at once; 1F1B holds at most "
                f"min(m, p - s) = {min(m, p - rank)}")
    return None


def _one_f_one_b_rank(rank: int, world_size: int, fn, ms) -> dict:
    """``against_one_device`` on this rank, or ``{"not_attempted": True}`` when ``fn`` is still a stub."""
    from ..labs.lab04_pipeline.verify import against_one_device
    try:
        return against_one_device(rank, world_size, fn, ms, record_order=True)
    except NotImplementedError:
        return {"not_attempted": True}


def one_f_one_b(fn, world_size: int = 3, ms=(2, 6), timeout: float = 120.0, pool=None) -> None:
    """Run ``fn`` (the contract of the notebook's ``gpipe_step``) on ``world_size`` gloo ranks (CPU
    tensors, whatever the machine, so the check reads the same everywhere; or on ``pool``'s ranks):
    the output and every stage's gradients must equal the one-device model's
    (``torch.testing.assert_close``, float64), and stage s may hold at most min(m, p - s)
    micro-batches at once (the order of its forwards and backwards is recorded with hooks on the
    stage)."""
    world_size = pool.world_size if pool is not None else world_size
    results = run_ranks(_one_f_one_b_rank, fn, tuple(ms), pool=pool, world_size=world_size,
                        backend=None if pool is not None else "gloo", timeout_s=timeout,
                        hang_hint="send with dist.isend (keep the tensor and the work, wait at the end): a "
                                  "blocking send waits for its receiver, and in 1F1B the receiver may be waiting "
                                  "for you; every recv needs the neighbour's matching send in the same order")
    if any(r["not_attempted"] for r in results):
        say_not_attempted("my_1f1b_step")
        return
    for m in ms:
        for rank, res in enumerate(results):
            if res[m]["output"] not in ("ok", None):
                fail(f"m = {m}, last rank: {res[m]['output']}",
                     "return torch.cat of the micro-batch outputs, in order, detached, on the last rank")
            if res[m]["grads"] != "ok":
                fail(f"m = {m}, rank {rank}: {res[m]['grads']}",
                     "divide each micro-batch's loss by m; call requires_grad_() on a received activation "
                     "so that its .grad can be sent back; backward every micro-batch exactly once")
            problem = _order_problem(res[m]["order"], rank, world_size, m)
            if problem:
                fail(f"m = {m}: {problem}",
                     "run min(m, p - rank) forwards first, then alternate backward(i) and forward(i + warm-up), "
                     "then the backwards left; that is what frees memory early (GPipe runs all m forwards)")
    caps = ", ".join(str(min(max(ms), world_size - r)) for r in range(world_size))
    passed(f"your 1F1B step matches the one-device model on {world_size} ranks, m = "
           f"{' and '.join(map(str, ms))}: output, every stage's gradients, and at most ({caps}) "
           f"micro-batches held per stage at m = {max(ms)}")
