# %% [markdown]
# # 07 · Interactive ranks: a persistent pool and the `%%ranks` magic
#
# **Objectives**
# 1. Keep ranks alive between cells with `labutils.RankPool`, and measure what one round trip costs
#    compared with a fresh `labutils.launch`.
# 2. Drive every rank from a notebook cell with `%%ranks`: per-rank variables that persist between cells,
#    a subset of ranks, values fetched back into the notebook and pushed out to the ranks.
# 3. Read what happens when a rank raises, is interrupted or hangs: when the pool survives, and when it
#    is restarted (and says so).
#
# **GPUs needed for the live path:** 2 (NCCL, one GPU per rank). Everything here also runs live on CPU
# ranks (gloo); only the 2×H200 round-trip numbers are shown as a recording there.
#
# **Time:** 30 min of study (two exercises: an agreement every rank reaches, checked on 3 ranks; the pool's
# break-even, derived); under 30 s to run on 2×H200, under 90 s on a 2-core CPU.

# %% [markdown]
# ## Setup

# %% tags=["nbval-ignore-output"]
import os
import signal
import threading

import torch
import torch.distributed as dist

import labutils
from labutils import claims, hw, plots, recorded
from labutils.checks import lab07 as check
from labutils.labs.lab07_interactive_ranks import claims as lab_claims
from labutils.labs.lab07_interactive_ranks import measure

HW = hw.describe(peer_access=False)  # links do not matter in this lab; the ranks own the GPUs
MODE = HW.mode
BACKEND = "nccl" if MODE == "multi-gpu" else "gloo"
labutils.default_config()
print(f"mode: {MODE}\nfingerprint: {HW.fingerprint()}")

# %% [markdown]
# ## 1 · Why a pool?
#
# Lab 02 already ran its experiments in a `RankPool`, taking it as given. This lab looks inside it: what a round
# trip costs and when it pays, the `%%ranks` magic that drives every rank from a cell, and what becomes of the
# ranks when one of them raises, is interrupted or hangs.
#
# `labutils.launch(fn)` starts fresh processes every time: process start, `import torch`, joining the
# process group (and, under NCCL, building the communicator). Then `fn` runs, and everything is torn down.
# For *k* experiments that costs $k\,(T_\text{launch} + T_\text{work})$. A pool starts the ranks **once**
# and then sends each piece of work over a socket: $T_\text{start} + k\,(T_\text{round trip} + T_\text{work})$.
# `pool.run(fn)` has exactly the contract of `launch`: `fn(rank, world_size, *args)`, results in rank order,
# output under `[rank r]`, `RankError`/`RankTimeout`.
#
# **Predict:** for a tiny `all_reduce` of one number, how many times faster is one pool round trip than one
# launch?

# %%
my_prediction_speedup = None  # ✍ your number: launch time / pool round-trip time

# %% [markdown]
# Start a pool. The constructor waits until every rank has joined the process group; `pool.start_s` is how
# long that took ($T_\text{start}$ above).

# %%
pool = labutils.RankPool(backend=BACKEND)
print(f"{pool.world_size} ranks running: {not pool.closed}")

# %%
def rank_sum(rank, world_size):
    t = torch.tensor([rank + 1.0], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    print(f"sum = {t.item():g}")
    return t


out = pool.run(rank_sum)          # the same call as labutils.launch(rank_sum)
print([t.item() for t in out])    # CUDA tensors come back on the CPU
out = pool.run(rank_sum, output="quiet")  # again: no process started this time
print(f"second run: {[t.item() for t in out]}")

# %% [markdown]
# **Measure.** The work is the smallest a collective can be: one number, all-reduced. It is sent three ways —
# as a function (`pool.run`), as the text of a `%%ranks` cell (`pool.exec`, section 2), and as a fresh
# `launch` — and each call is timed whole, from the notebook: the round trips thirty times each after five
# warm-up calls, the launch once and without a warm-up (each launch is a whole start-up, the most expensive
# thing this lab does). The pool's own start is the $T_\text{start}$ it paid once. This machine is always
# measured; the 2×H200 reference is the recording.

# %% tags=["nbval-ignore-output"]
def tiny_all_reduce(rank, world_size):
    t = torch.ones(1, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return t


TINY_CELL = "t = torch.ones(1, device=device)\ndist.all_reduce(t)\n"

here = measure.roundtrip(pool, tiny_all_reduce, TINY_CELL)
# measured on every machine (gloo ranks without GPUs); kept, like any measurement, with LABUTILS_RECORD=1
here_m = recorded.live_or_recorded("07_roundtrip_here", lambda: here, gpus_needed=0)
try:  # on 2 GPUs this is the measurement above (and the recording, with LABUTILS_RECORD=1)
    ref = recorded.live_or_recorded("07_roundtrip", lambda: here, gpus_needed=2)
except FileNotFoundError:
    ref = None
    print("(no 2×H200 recording of this measurement yet: showing this machine only)")

sources = {"this machine": here}
where = {"this machine": here_m.source}
if ref is not None and not ref.live:
    sources[ref.label], where[ref.label] = ref.data, ref.source
for name, data in sources.items():
    print(f"{name}:")
    claims.show(lab_claims.roundtrip_verdicts(data), where[name])
ROUNDTRIP = claims.sourced(lab_claims.roundtrip_verdicts(ref.data if ref is not None else here),
                           ref if ref is not None else here_m)
measure.table(sources)

# %% tags=["nbval-ignore-output"]
speedups = {name: measure.medians(d)["launch_ms"] / measure.medians(d)["pool_ms"] for name, d in sources.items()}
if my_prediction_speedup is not None:
    speedups = {"your prediction": float(my_prediction_speedup), **speedups}
fig = plots.bar_plot(list(speedups), list(speedups.values()), ylabel="launch time / pool round trip (x)",
                     annotate="{:,.0f}x", title="How much faster is a pool round trip than a launch?")
fig.axes[0].set_yscale("log")
fig.axes[0].set_ylim(bottom=1)
fig

# %% [markdown]
# **Explain.** A launch starts Python and imports torch on every rank, joins the process group (on a GPU
# node CUDA and NCCL initialise too), runs the work and tears it all down; the pool did the first part once.
# Its round trip is the work plus a pickle and two loopback messages per rank.
#
# *Why these thresholds.* A pool keeps state between calls — stale variables, a broken process group — and
# that price is worth paying only for a gain of orders of magnitude, hence "at least a hundredfold". Starting
# the pool does what one launch does, so it should have paid for itself by the second experiment.
#
# **Text or function?** `pool.run(fn)` sends the function itself: cloudpickle serialises its code by value,
# and to find the submodules the code may use it looks through every module imported in the notebook (the
# table counts them: torch brings many). A `%%ranks` cell travels as text and is compiled on the ranks.
# The table's "pickling fn" row is that serialisation alone, measured in the notebook; compare it with
# the difference between the two round trips. What it does not cover happens on the ranks: each one
# unpickles the function (rebuilding its code object and looking up its globals) where a cell is compiled
# from its text. Which of the two is cheaper, and by how much, the table's two round-trip rows say for each
# machine; neither is a reason to choose one, since both are far below a launch.
#
# Use `launch` for measurements that must start clean and for final results; use the pool while iterating.

# %% [markdown]
# ## 2 · `%%ranks`: a cell that runs on every rank
#
# `%load_ext labutils` adds the magics. `%ranks use pool` drives the pool we already have (`%ranks start 2`
# would start one). In a `%%ranks` cell, `rank`, `world_size`, `device` (`cuda:<rank>` under NCCL, else
# `cpu`), `torch` and `dist` exist, and **every variable a cell assigns stays on its rank** for the next cell.

# %%
%load_ext labutils
%ranks use pool

# %% tags=["nbval-ignore-output"]
%ranks status

# %%
%%ranks
x = torch.full((4,), rank + 1.0, device=device)   # lives on this rank, between cells
steps = 0
print(f"x = {x.tolist()}")

# %%
%%ranks
dist.all_reduce(x)
steps += 1
print(f"step {steps}: x = {x.tolist()}")

# %% [markdown]
# Run the cell above again: `steps` goes on counting and `x` keeps growing, because both live in the ranks.
# `-r` picks ranks; like a REPL, a last bare expression is printed (by each rank that ran it).

# %%
%%ranks -r 0
print(f"only rank {rank} of {world_size} runs this")
steps

# %% [markdown]
# `--fetch NAME` copies a variable from the ranks into the notebook, as a list in rank order (tensors come
# back on the CPU); `%ranks fetch NAME` returns that list; `%ranks push NAME` sends a notebook variable to
# every rank.

# %%
%%ranks --fetch x,steps
x = x * (rank + 1)

# %%
print([t.tolist() for t in x], steps)
STATE = lab_claims.state_kept(steps, 1)
claims.show(STATE, recorded.live_source())
lr = 0.5
%ranks push lr
xs = %ranks fetch x
print(type(xs).__name__, len(xs), xs[0].device)

# %%
%%ranks
x -= lr * x
x.sum().item()

# %% [markdown]
# ## 3 · Exercises
#
# **Exercise 1: a decision every rank takes together.** Section 4 shows what happens when one rank calls a
# collective that another skips: the caller waits forever. It happens in real code whenever ranks decide a branch
# on their *own* data — "skip this step if my loss is NaN", "stop when my loss is below the target" — since ranks
# hold different data. The cure is to decide together. Write `all_agree(flag)`, called by every rank with its own
# `flag`, that returns the same Python `bool` on every rank: True exactly when every rank's flag is True. Use one
# collective; think about which reduction is 0 as soon as one flag is 0. Its tensor must live where the backend
# wants it: `cuda` under NCCL, `cpu` under gloo.
#
# The checker runs it on 3 gloo ranks (with 2, "rank 0 decides" and "every rank" are too easily confused) for all
# 8 patterns of flags, and reads the ledger: one `all_reduce`, on every rank.

# %% nbgrader={"grade": false, "grade_id": "all_agree", "locked": false, "schema_version": 3, "solution": true}
def all_agree(flag) -> bool:
    """Every rank calls it with its own flag; True on every rank exactly when every flag is True."""
    # ✍ your code here: one collective on a one-element tensor
    ### BEGIN SOLUTION
    from labutils.solutions import lab07 as solution  # the instructor's edition: the reference answer
    return solution.all_agree(flag)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_all_agree", "locked": true, "points": 2, "schema_version": 3, "solution": false}
check.all_agree(all_agree)

# %% [markdown]
# **Use it** in the pool: push the function to the ranks and let a rank find a NaN in its `x`. Every rank asks
# the same question, so every rank takes the same branch and the `all_reduce` is called by all or by none
# (until you write `all_agree`, a stand-in does the agreeing, and says so).

# %%
agree = check.usable_all_agree(all_agree)
%ranks push agree

# %%
%%ranks
update = x.clone()
if rank == world_size - 1:
    update[0] = float("nan")       # this rank's data went bad
healthy = bool(torch.isfinite(update).all())
do_step = agree(healthy)           # the same answer on every rank
if do_step:
    dist.all_reduce(update)
print(f"healthy here: {healthy}; step taken: {do_step}")

# %% [markdown]
# **Exercise 2: when does the pool pay?** Section 1 wrote the two costs of $k$ experiments, each doing work
# $T_\text{work}$: fresh launches $k\,(T_\text{launch} + T_\text{work})$, the pool
# $T_\text{start} + k\,(T_\text{round trip} + T_\text{work})$. Derive the smallest whole number of experiments
# from which the pool costs no more than launches, and write it as
# `break_even(start_s, launch_s, roundtrip_s, work_s)`. The checker tries it on fixed cases and on this machine's
# own measurement from section 1; the verdict "the pool is cheaper than fresh launches from the second
# experiment on" reads the same quantity.

# %% nbgrader={"grade": false, "grade_id": "break_even", "locked": false, "schema_version": 3, "solution": true}
def break_even(start_s, launch_s, roundtrip_s, work_s=0.0):
    """The smallest whole k >= 1 with T_start + k (T_roundtrip + T_work) <= k (T_launch + T_work)."""
    # ✍ your code here
    ### BEGIN SOLUTION
    from labutils.solutions import lab07 as solution  # the instructor's edition: the reference answer
    return solution.break_even(start_s, launch_s, roundtrip_s, work_s)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_break_even", "locked": true, "points": 2, "schema_version": 3, "solution": false}
MEASURED = measure.break_even_inputs(here)
check.break_even(break_even, MEASURED)

# %% tags=["nbval-ignore-output"]
for name, data in sources.items():
    inputs = measure.break_even_inputs(data)
    if inputs:
        try:
            k = break_even(**inputs)
        except NotImplementedError:
            k = "(not written yet)"
        print(f"{name}: start {inputs['start_s']:.2f} s, launch {inputs['launch_s']:.2f} s, round trip "
              f"{inputs['roundtrip_s'] * 1e3:.2f} ms -> the pool pays from experiment {k}")

# ## 4 · When a rank fails
#
# **An exception** in one rank comes back as `RankError` with *that rank's* traceback (the cell's own line,
# in `<%%ranks cell N>`, N the cell's number). The other ranks finish the cell normally, so the process
# group is sound and the pool keeps its state.

# %%
pids_before = pool.status().pids

# %% tags=["raises-exception"]
%%ranks
print(f"rank {rank} starts")
if rank == 1:
    raise ValueError(f"bad input on rank {rank}")
print(f"rank {rank} done")

# %%
AFTER_ERROR = lab_claims.pool_kept("an exception in one rank", pids_before, pool.status().pids,
                                  pool.fetch("steps"), 1)
claims.show(AFTER_ERROR, recorded.live_source())

# %% [markdown]
# **An interrupt.** The Interrupt button (■ in the toolbar, or *Kernel → Interrupt Kernel*) sends SIGINT to
# the notebook's kernel; the pool forwards it to the ranks, so Python code there stops with
# `KeyboardInterrupt` and the pool keeps its state. The cell ends with `RanksInterrupted` (a
# `KeyboardInterrupt`) saying what became of the ranks. A rank stuck inside a collective cannot be
# interrupted (the wait is in C++): then the pool is restarted, and the message says that instead.
# The cell below presses the button for you, one second in (the same API works from Python: `pool.exec`).

# %% tags=["raises-exception"]
%ranks push lr
threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # = pressing Interrupt in 1 s
pool.exec("import time\nprint(f'rank {rank} sleeps')\ntime.sleep(60)")

# %%
AFTER_INTERRUPT = lab_claims.pool_kept("an interrupt", pids_before, pool.status().pids, pool.fetch("lr"), 0.5)
claims.show(AFTER_INTERRUPT, recorded.live_source())
restarts_before = pool.restarts

# %% [markdown]
# **A hang.** Only rank 0 calls the collective; it waits for a partner that never comes. After `--timeout`
# seconds the pool raises `RankTimeout`, **kills the ranks and starts fresh ones** (the message says so).
# Under NCCL `all_reduce` returns at once and the wait happens at `.item()`, which needs the result. The
# error does not wait for the restart: the fresh ranks start in the background while you read it, and the
# next cell that needs them waits for them — with none of the old ranks' variables.

# %% tags=["raises-exception"]
%%ranks --timeout 2
print(f"rank {rank} before")
if rank == 0:
    dist.all_reduce(x)      # rank 1 never calls it
    print(x.sum().item())   # waits for the result
print(f"rank {rank} after")

# %% tags=["nbval-ignore-output"]
%ranks status

# %%
AFTER_HANG = lab_claims.pool_restarted(restarts_before, pool.restarts)
claims.show(AFTER_HANG, recorded.live_source())

# %% [markdown]
# | what happened | what you get | pool |
# |---|---|---|
# | exception in some ranks, the others return | `RankError` + the rank's traceback | kept, with its state |
# | exception, the others stay busy | they get SIGINT after a grace period; `RankError` | kept if they stop, else **restarted** |
# | hang (a collective not every rank calls) | `RankTimeout` after `--timeout` | **restarted** |
# | a rank dies (`os._exit`, OOM killer, segfault) | `RankError` with its exit code and last output | **restarted** |
# | kernel interrupt (the Interrupt button) | `RanksInterrupted`, ranks interrupted | kept if they stop, else **restarted** |
# | kernel restart / shutdown, `%ranks stop` | ranks exit (they also watch the kernel's process) | gone |

# %% [markdown]
# ## Summary
#
# The verdicts of this lab: the round trip from the measurement in section 1 (on the 2×H200 reference when
# this machine has fewer GPUs), the pool's behaviour from the cells above.

# %% tags=["nbval-ignore-output"]
claims.table([*ROUNDTRIP, STATE, AFTER_ERROR, AFTER_INTERRUPT, AFTER_HANG], recorded.live_source())

# %% [markdown]
# **Two styles.** `labutils.launch(fn)`: fresh processes per call — clean state, exact failure isolation,
# the right tool for final measurements and for tests. `RankPool` / `%%ranks`: ranks that stay — a round
# trip per call, state kept between cells, the right tool while exploring. Stop the pool when you are done:

# %%
%ranks stop
print(f"pool closed: {pool.closed}")

# %% [markdown]
# **Next:** lab 08 — data parallelism by hand, then DDP, ZeRO and FSDP2 — runs all its experiments in one
# `RankPool`. Use `%%ranks` there, or in any lab, wherever you iterate on one collective, then confirm the
# final numbers with `launch`.
