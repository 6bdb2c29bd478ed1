"""Checkers for lab 00 (setup): the first prediction, the timing loop, the alpha-beta fit.

The timing loop is judged on 3 gloo ranks whose work takes a different time on each rank (rank r sleeps
``(r + 1) x BASE_MS`` a call, the first calls longer, one sample slower on every rank): its structure from
a clock that logs every mark, synchronize and read, its answer against the same marks (the slowest rank's
median) and against ``labutils.timing.benchmark_collective`` on the same work, its communication with the
ledger. The fit is judged against ``labutils.bandwidth.fit_alpha_beta`` on the lab's own sweep and on
fixed noisy sweeps, and on sizes it was not fitted on.
"""
from __future__ import annotations

import math
import statistics
import time

from .. import timing
from ..bandwidth import AlphaBeta, fit_alpha_beta as library_fit
from . import attempted, fail, passed, run_ranks, say_not_attempted, standin


def prediction_sum(answer, world_size: int) -> None:
    """The all_reduce (sum) of rank + 1 over ``world_size`` ranks is n (n + 1) / 2."""
    from . import not_attempted
    expected = world_size * (world_size + 1) // 2
    if not_attempted(answer):
        print(f"… no prediction written: every rank holds {expected} = 1 + ... + {world_size}.")
        return
    if answer != expected:
        fail(f"you predicted {answer!r}, every rank holds {expected}",
             "all_reduce sums the contributions of all ranks and gives the sum to every rank")
    passed(f"prediction {answer} = 1 + ... + {world_size}")


# ---- the timing loop ---------------------------------------------------------------------------------
TIMER_RANKS = 3
WARMUP, ITERS, REPEAT = 2, 4, 5
BASE_MS = 2.0          # rank r's call sleeps (r + 1) x BASE_MS
FIRST_CALLS = 5.0      # the warm-up calls take this many times longer (set-up on a first call)
SLOW_SAMPLE, SLOW_BY = 1, 3.0   # every rank's second sample is 3x slower (a noisy neighbour): mean != median
MATCH = 0.02           # the answer against the same marks, read back
LIBRARY_MATCH = 0.25   # against a second measurement of the same work with labutils.timing


class LoggingClock:
    """A ``timing.Clock`` on the CPU that logs each mark, synchronize and read into ``log`` (shared
    with the work), so that the checker sees what was timed: ``("mark", id, t)``, ``("sync",)``,
    ``("read", id_a, id_b)``, and the work's ``("call", index)``."""

    def __init__(self, log: list):
        self._clock = timing.Clock("cpu")
        self.device, self.on_gpu = self._clock.device, False
        self.log = log

    def mark(self):
        t = self._clock.mark()
        self.log.append(("mark", len(self.log), t))
        return (len(self.log) - 1, t)

    def synchronize(self) -> None:
        self.log.append(("sync",))

    def elapsed_ms(self, start, stop) -> float:
        try:
            (a, ta), (b, tb) = start, stop
        except (TypeError, ValueError):
            raise TypeError("elapsed_ms(start, stop) takes two marks that clock.mark() returned") from None
        self.log.append(("read", a, b))
        return (tb - ta) * 1e3


class SkewedWork:
    """The checker's ``op``: a call that takes a rank-dependent time (host sleep), logged."""

    def __init__(self, rank: int, log: list, warmup: int = WARMUP, iters: int = ITERS):
        self.rank, self.log, self.warmup, self.iters, self.calls = rank, log, warmup, iters, 0

    def __call__(self):
        i = self.calls
        self.calls += 1
        self.log.append(("call", i))
        ms = (self.rank + 1) * BASE_MS
        if i < self.warmup:
            ms *= FIRST_CALLS
        elif (i - self.warmup) // self.iters == SLOW_SAMPLE:
            ms *= SLOW_BY
        time.sleep(ms / 1e3)


def _timer_rank(rank, world_size, fn):
    """Rank side: the learner's loop on the logging clock and skewed work, under the ledger; then
    labutils.timing on the same work. Returns what the checker judges."""
    from ..instruments.ledger import Ledger
    log: list = []
    with Ledger("timer") as book:
        got = fn(SkewedWork(rank, log), LoggingClock(log), warmup=WARMUP, iters=ITERS, repeat=REPEAT)
    library = timing.benchmark_collective(SkewedWork(rank, []), warmup=WARMUP, iters=ITERS, repeat=REPEAT)
    return {"got": got, "log": log, "counts": book.counts(), "library_ms": library.median_ms}


def _structure(log: list) -> tuple[list[float] | None, str | None]:
    """This rank's samples (ms per call, from the marks its reads paired) or the first structural fault,
    as ``(None, "what. HINT: ...")`` parts."""
    marks = {e[1]: (pos, e[2]) for pos, e in enumerate(log) if e[0] == "mark"}
    reads = [(pos, e[1], e[2]) for pos, e in enumerate(log) if e[0] == "read"]
    calls = [(pos, e[1]) for pos, e in enumerate(log) if e[0] == "call"]
    if not reads:
        return None, ("no sample was read from the clock|take two marks around the timed calls "
                      "(start = clock.mark(); ...; stop = clock.mark()) and read clock.elapsed_ms(start, stop)")
    if len(reads) != REPEAT:
        return None, (f"{len(reads)} samples were read, repeat = {REPEAT}|one pair of marks and one read "
                      "per sample, `repeat` samples")
    (first, _), (first_stop, _) = marks[reads[0][1]], marks[reads[0][2]]
    if sum(1 for p, _ in calls if p < first) < WARMUP:
        if sum(1 for p, _ in calls if first < p < first_stop) > ITERS:
            return None, ("the warm-up calls are inside a timed sample|call op() `warmup` times before the "
                          "first mark: first calls pay set-up (a communicator, caches, the allocator) that no "
                          "later call pays")
        return None, (f"fewer than warmup = {WARMUP} calls came before the first timed sample|call op() "
                      "`warmup` times, untimed, before the first mark: first calls pay set-up that no later "
                      "call pays")
    samples = []
    for n, (pos, a, b) in enumerate(reads):
        (pa, ta), (pb, tb) = marks[a], marks[b]
        inside = [i for p, i in calls if pa < p < pb]
        if any(i < WARMUP for i in inside):
            return None, ("the warm-up calls are inside a timed sample|call op() `warmup` times before the "
                          "first mark: first calls pay set-up (a communicator, caches, the allocator) that no "
                          "later call pays")
        if len(inside) != ITERS:
            return None, (f"sample {n} brackets {len(inside)} calls of op, iters = {ITERS}|put the two marks "
                          "around `iters` back-to-back calls (one pair of marks costs about as much as a "
                          "short call), then divide by iters")
        if not any(e == ("sync",) for e in log[pb + 1:pos]):
            return None, ("a sample was read before clock.synchronize()|on a GPU the marks are CUDA events "
                          "that the host reaches before the GPU does: synchronize after the last mark, then "
                          "read elapsed_ms")
        samples.append((tb - ta) * 1e3 / ITERS)
    return samples, None


def _slowest_median(samples: list[list[float]]) -> tuple[float, float]:
    """The two readings of "the slowest rank's median": median over samples of the slowest rank's
    sample (labutils.timing), and the largest per-rank median."""
    per_sample = [max(col) for col in zip(*samples)]
    return statistics.median(per_sample), max(statistics.median(s) for s in samples)


def standin_time_collective(op, clock, *, warmup, iters, repeat):
    """The stand-in for an unwritten timing loop: ``labutils.timing.benchmark_collective``'s median."""
    return timing.benchmark_collective(op, warmup=warmup, iters=iters, repeat=repeat).median_ms


standin(standin_time_collective, "labutils.timing.benchmark_collective(op, ...).median_ms")


def _probe_timer(fn):
    return fn(lambda: None, timing.Clock("cpu"), warmup=0, iters=1, repeat=1)


def usable_timer(fn):
    """``fn`` if the learner wrote it, else the stand-in (saying so)."""
    if attempted(fn, _probe_timer):
        return fn
    say_not_attempted("time_collective", standin_time_collective.labutils_standin)
    return standin_time_collective


def _close(a: float, b: float, tol: float) -> bool:
    return abs(a - b) <= tol * abs(b)


def time_collective(fn, pool=None) -> None:
    """Judge ``fn(op, clock, *, warmup, iters, repeat)`` -> the slowest rank's median time of one call (ms),
    on 3 gloo ranks (``pool``: a 3-rank gloo ``RankPool`` to run on, else a fresh launch)."""
    if not attempted(fn, _probe_timer):
        say_not_attempted("time_collective")
        return
    out = run_ranks(_timer_rank, fn, world_size=TIMER_RANKS, backend="gloo", pool=pool,
                    hint="call it by hand on the ranks (labutils.launch) with a small op and print each sample")
    got = []
    for r, o in enumerate(out):
        try:
            got.append(float(o["got"]))
        except (TypeError, ValueError):
            fail(f"rank {r} returned {o['got']!r}", "return one number: the slowest rank's median time of one "
                                                     "call, in ms")
    samples = []
    for r, o in enumerate(out):
        s, fault = _structure(o["log"])
        if fault:
            what, hint = fault.split("|")
            fail(f"{what} (rank {r})", hint)
        samples.append(s)
    right = _slowest_median(samples)
    if not all(math.isfinite(g) for g in got) or len({round(g, 9) for g in got}) > 1:
        fail(f"the ranks returned different times {[f'{g:.2f}' for g in got]} ms",
             "each rank knows only its own samples: combine them across ranks (dist.all_reduce with "
             "op=dist.ReduceOp.MAX, or an all_gather) so that every rank returns the slowest rank's time")
    g = got[0]
    if not any(_close(g, x, MATCH) for x in right):
        per_sample = [max(col) for col in zip(*samples)]
        wrong = {"rank 0's median": (statistics.median(samples[0]),
                                     "that is rank 0's time; a collective is done only when its last rank "
                                     "is: take the maximum over ranks (dist.ReduceOp.MAX)"),
                 "the mean over ranks": (statistics.median([statistics.mean(c) for c in zip(*samples)]),
                                         "that is the mean over ranks (nccl-tests' default, -a 1); the course "
                                         "reports the slowest rank: dist.ReduceOp.MAX, not SUM / world_size"),
                 "the mean over samples": (statistics.mean(per_sample),
                                           "that is the mean of the samples: one slow sample (a noisy "
                                           "neighbour) moves it; take the median (statistics.median)"),
                 "the total of a sample": (right[0] * ITERS,
                                           "that is the time of `iters` calls: divide a sample by iters"),
                 "the fastest sample": (min(per_sample), "that is the minimum; take the median of the samples")}
        hint = next((h for v, h in wrong.values() if _close(g, v, MATCH)),
                    "every rank's samples (ms per call), the slowest rank's per sample, then their median")
        fail(f"your loop reports {g:.3f} ms, the slowest rank's median of the same marks is {right[0]:.3f} ms",
             hint)
    counts = out[0]["counts"]
    if not any(counts.get(op) for op in ("all_reduce", "all_gather", "reduce")):
        fail("no collective combined the ranks' samples (the ledger saw none)",
             "use dist.all_reduce(samples, op=dist.ReduceOp.MAX) on a tensor of this rank's samples")
    library = max(o["library_ms"] for o in out)
    if not _close(g, library, LIBRARY_MATCH):
        fail(f"your loop reports {g:.3f} ms, labutils.timing.benchmark_collective {library:.3f} ms on the "
             "same work", "run the cell again (a loaded machine); if it persists, compare your loop with the "
             "steps above one by one")
    passed(f"time_collective on {TIMER_RANKS} ranks of different speeds: {WARMUP} untimed warm-up calls, "
           f"{REPEAT} samples of {ITERS} calls, read after a synchronize, the slowest rank's median "
           f"(within {MATCH:.0%} of the same marks, {LIBRARY_MATCH:.0%} of labutils.timing), combined by "
           f"{'/'.join(sorted(k for k in counts if counts[k]))}")


# ---- the alpha-beta fit ------------------------------------------------------------------------------
FIT_MATCH = 0.01       # alpha and beta within 1% of labutils.bandwidth.fit_alpha_beta
SWEEP = [2**k for k in range(12, 31, 2)]
NOISE = [1.06, 0.95, 1.04, 0.97, 1.08, 0.93, 1.02, 0.96, 1.05, 1.12]   # fixed, so the check is the same everywhere
SYNTHETIC = [(12.0, 50.0), (20.0, 400.0), (3.0, 25.0)]   # (alpha_us, beta_gbps) of the fixed sweeps


def _sweeps(size_bytes, time_ms) -> list[tuple[str, list, list]]:
    out = [("the lab's sweep", list(size_bytes), list(time_ms))]
    for a, b in SYNTHETIC:
        ab = AlphaBeta(a, b, 0.0)
        out.append((f"a sweep with alpha {a:g} us, beta {b:g} GB/s, +-12% noise", SWEEP,
                    [ab.predict_ms(s) * n for s, n in zip(SWEEP, NOISE)]))
    return out


def _unweighted(sizes, times):
    n = len(sizes)
    sx, sy = sum(sizes), sum(times)
    sxx, sxy = sum(s * s for s in sizes), sum(s * t for s, t in zip(sizes, times))
    b = (n * sxy - sx * sy) / (n * sxx - sx * sx)
    return (sy - b * sx) / n * 1e3, 1.0 / (b * 1e-3) / 1e9


def _two_points(sizes, times):
    b = (times[-1] - times[0]) / (sizes[-1] - sizes[0])
    return (times[0] - b * sizes[0]) * 1e3, 1.0 / (b * 1e-3) / 1e9


def standin_fit(size_bytes, time_ms):
    """The stand-in for an unwritten fit: ``labutils.bandwidth.fit_alpha_beta``'s alpha and beta."""
    f = library_fit(size_bytes, time_ms)
    return f.alpha_us, f.beta_gbps


standin(standin_fit, "labutils.bandwidth.fit_alpha_beta")


def _probe_fit(fn):
    return fn([1, 2], [1.0, 2.0])


def usable_fit(fn):
    """``fn`` if the learner wrote it, else the stand-in (saying so)."""
    if attempted(fn, _probe_fit):
        return fn
    say_not_attempted("fit_alpha_beta", standin_fit.labutils_standin)
    return standin_fit


def _pair(fn, sizes, times, where):
    try:
        a, b = fn(list(sizes), list(times))
        return float(a), float(b)
    except Exception as exc:  # noqa: BLE001 - the learner's code may raise anything; say what
        fail(f"fit_alpha_beta on {where} gave {type(exc).__name__}: {exc}",
             "return a pair (alpha_us, beta_gbps) of numbers")


def fit_alpha_beta(fn, size_bytes, time_ms) -> None:
    """Judge ``fn(size_bytes, time_ms) -> (alpha_us, beta_gbps)``: least squares of the relative error,
    on the lab's own sweep (``size_bytes``, ``time_ms``) and on fixed noisy sweeps; then on held-out sizes."""
    if not attempted(fn, _probe_fit):
        say_not_attempted("fit_alpha_beta")
        return
    for where, sizes, times in _sweeps(size_bytes, time_ms):
        a, b = _pair(fn, sizes, times, where)
        ref = library_fit(sizes, times)
        if _close(a, ref.alpha_us, FIT_MATCH) and _close(b, ref.beta_gbps, FIT_MATCH):
            continue
        hints = [((ref.beta_gbps, ref.alpha_us), "you returned (beta, alpha): return (alpha_us, beta_gbps)"),
                 ((ref.alpha_us * 1e-3, ref.beta_gbps), "alpha is in microseconds: the times are in ms, x 1e3"),
                 ((ref.alpha_us, ref.beta_gbps * 1e9), "beta is in GB/s = 1e9 B/s"),
                 ((ref.alpha_us, ref.beta_gbps * 1e-6), "beta is in GB/s: bytes per ms x 1e3 = B/s, / 1e9"),
                 ((ref.alpha_us, ref.beta_gbps * 1e3), "beta is in GB/s: the times are in ms, not s"),
                 (_unweighted(sizes, times), "that is the plain least-squares line, which sees only the "
                  "largest messages (their times are a million times larger); weight each residual by 1/t, "
                  "so that every size counts alike: minimise the relative error"),
                 (_two_points(sizes, times), "that is the line through the smallest and the largest point; "
                  "use every point (least squares), so that one noisy point does not decide alpha or beta")]
        hint = next((h for (ea, eb), h in hints if _close(a, ea, 0.02) and _close(b, eb, 0.02)),
                    "minimise sum(((alpha + S_i / beta) - t_i) / t_i)^2: divide each row of the system "
                    "[1, S_i] x [alpha, 1/beta] = t_i by t_i, then solve by least squares")
        fail(f"on {where}: alpha {a:.4g} us, beta {b:.4g} GB/s; labutils.bandwidth.fit_alpha_beta gives "
             f"alpha {ref.alpha_us:.4g} us, beta {ref.beta_gbps:.4g} GB/s", hint)
    # held out: fitted on every other size, it predicts the sizes in between as well as the library's
    sizes, times = list(size_bytes), list(time_ms)
    a, b = _pair(fn, sizes[::2], times[::2], "the even sizes of the lab's sweep")
    mine, ref = AlphaBeta(a, b, 0.0), library_fit(sizes[::2], times[::2])
    err = max(abs(mine.predict_ms(s) - t) / t for s, t in zip(sizes[1::2], times[1::2]))
    ref_err = max(abs(ref.predict_ms(s) - t) / t for s, t in zip(sizes[1::2], times[1::2]))
    if err > ref_err + FIT_MATCH:
        fail("fitted on every other size, your alpha and beta predict the sizes in between worse than "
             "labutils.bandwidth.fit_alpha_beta's", "minimise the relative error over every point")
    passed(f"fit_alpha_beta matches labutils.bandwidth.fit_alpha_beta (alpha and beta within {FIT_MATCH:.0%}) "
           f"on the lab's sweep and {len(SYNTHETIC)} noisy sweeps, and predicts held-out sizes as well")
