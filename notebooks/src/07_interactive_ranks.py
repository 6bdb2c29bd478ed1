# %% [markdown]
# # 07 · Interactive ranks: a persistent pool and the `%%ranks` magic
#
# **Objectives**
# 1. Keep ranks alive between cells with `labutils.RankPool`, and measure what one round trip costs
#    compared with a fresh `labutils.launch`.
# 2. Drive every rank from a notebook cell with `%%ranks`: per-rank variables that persist between cells,
#    a subset of ranks, values fetched back into the notebook and pushed out to the ranks.
# 3. Read what happens when a rank raises, hangs or is interrupted: when the pool survives, and when it
#    is restarted (and says so).
#
# **GPUs needed for the live path:** 2 (NCCL, one GPU per rank). Everything here also runs live on CPU
# ranks (gloo); only the 2×H200 round-trip numbers are shown as a recording there. **Time:** ~10 min.

# %% [markdown]
# ## Setup

# %% tags=["nbval-ignore-output"]
import os
import signal
import threading
import time

import torch
import torch.distributed as dist

import labutils
from labutils import checks, hw, plots, recorded, timing

HW = hw.describe()
MODE = HW.mode
BACKEND = "nccl" if MODE == "multi-gpu" else "gloo"
labutils.default_config()
HW

# %% [markdown]
# ## 1 · Why a pool?
#
# `labutils.launch(fn)` starts fresh processes every time: process start, `import torch`, joining the
# process group (and, under NCCL, building the communicator). Then `fn` runs, and everything is torn down.
# For *k* experiments that costs $k\,(T_\text{start} + T_\text{work})$. A pool starts the ranks **once**
# and then sends each piece of work over a socket: $T_\text{start} + k\,(T_\text{round trip} + T_\text{work})$.
# `pool.run(fn)` has exactly the contract of `launch`: `fn(rank, world_size, *args)`, results in rank order,
# output under `[rank r]`, `RankError`/`RankTimeout`.
#
# **Predict:** for a tiny `all_reduce` of one number, how many times faster is one pool round trip than one
# launch?

# %%
my_prediction_speedup = None  # ✍ your number: launch time / pool round-trip time

# %% [markdown]
# Start a pool. The constructor waits until every rank has joined the process group.

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
# **Measure:** median wall-clock time of a round trip (`pool.run`) and of a launch, each around the whole
# call, after a warm-up. This machine is always measured live; the 2×H200 reference is recorded.

# %% tags=["nbval-ignore-output"]
def tiny_all_reduce(rank, world_size):
    t = torch.ones(1, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t)
    return t


def wall_ms(call, n):
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def measure_roundtrip(pool, n_pool=50, n_launch=2):
    wall_ms(lambda: pool.run(tiny_all_reduce), 5)  # warm-up
    return {"world_size": pool.world_size, "backend": pool.backend,
            "pool_ms": wall_ms(lambda: pool.run(tiny_all_reduce), n_pool),
            "launch_ms": wall_ms(lambda: labutils.launch(tiny_all_reduce, world_size=pool.world_size,
                                                         backend=pool.backend, output="quiet"), n_launch)}


here = measure_roundtrip(pool)
try:  # on 2 GPUs this is the measurement above (and the recording, with LABUTILS_RECORD=1)
    ref = recorded.live_or_recorded("07_roundtrip", lambda: here, gpus_needed=2)
except FileNotFoundError:
    ref = None
    print("(no 2×H200 recording of this measurement yet: showing this machine only)")

rows = {f"this machine ({here['backend']})": here}
if ref is not None and not ref.live:
    rows[f"{ref.label} ({ref.data['backend']})"] = ref.data
speedups = {}
for name, d in rows.items():
    pool_t, launch_t = timing.summarize(d["pool_ms"]), timing.summarize(d["launch_ms"])
    speedups[name] = launch_t.median_ms / pool_t.median_ms
    print(f"{name}: pool round trip {pool_t}; launch {launch_t.median_ms / 1e3:.2f} s median "
          f"-> {speedups[name]:,.0f}x")
labels, values = list(speedups), list(speedups.values())
if my_prediction_speedup is not None:
    labels, values = ["your prediction", *labels], [float(my_prediction_speedup), *values]
fig = plots.bar_plot(labels, values, ylabel="launch time / pool round trip (x)", annotate="{:,.0f}x",
                     title="How much faster is a pool round trip than a launch?")
fig.axes[0].set_yscale("log")
fig.axes[0].set_ylim(bottom=1)
fig

# %% [markdown]
# **Explain.** A launch is dominated by starting Python and importing torch (seconds; more on a GPU node,
# where CUDA and NCCL initialise too); a pool round trip is a pickle, two loopback messages per rank and the
# work itself (milliseconds). The pool's start-up is paid once — its price is that ranks keep their state:
# what one cell leaves behind (variables, allocated memory, a broken process group) is there for the next.
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
lr = 0.5
%ranks push lr
xs = %ranks fetch x
print(type(xs).__name__, len(xs), xs[0].device)

# %%
%%ranks
x -= lr * x
x.sum().item()

# %% [markdown]
# ## 3 · When a rank fails
#
# **An exception** in one rank comes back as `RankError` with *that rank's* traceback (the cell's own line).
# The other rank finished the cell normally, so the process group is sound and the pool keeps its state.

# %% tags=["raises-exception"]
%%ranks
print(f"rank {rank} starts")
if rank == 1:
    raise ValueError(f"bad input on rank {rank}")
print(f"rank {rank} done")

# %%
%%ranks
print(f"still here: steps = {steps}")

# %% [markdown]
# **A hang.** Only rank 0 calls the collective; it waits for a partner that never comes. After `--timeout`
# seconds the pool raises `RankTimeout`, **kills the ranks and starts fresh ones** (the message says so).
# Under NCCL `all_reduce` returns at once and the wait happens at `.item()`, which needs the result.

# %% tags=["raises-exception"]
%%ranks --timeout 5
print(f"rank {rank} before")
if rank == 0:
    dist.all_reduce(x)      # rank 1 never calls it
    print(x.sum().item())   # waits for the result
print(f"rank {rank} after")

# %%
%%ranks
print(f"fresh rank {rank}: steps defined? {'steps' in dir()}")

# %% [markdown]
# **An interrupt.** The ⏹ button (*Interrupt the kernel*) sends SIGINT to the notebook's kernel; the pool
# forwards it to the ranks, so Python code there stops with `KeyboardInterrupt` and the pool keeps its state.
# A rank stuck inside a collective cannot be interrupted (the wait is in C++): then the pool is restarted.
# The cell below presses the button for you, two seconds in (the same API works from Python: `pool.exec`).

# %% tags=["raises-exception"]
%ranks push lr
threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT)).start()  # = pressing ⏹ in 2 s
pool.exec("import time\nprint(f'rank {rank} sleeps')\ntime.sleep(60)")

# %%
print(pool.fetch("lr"))  # the variable pushed before the interrupt is still there

# %% [markdown]
# | what happened | what you get | pool |
# |---|---|---|
# | exception in some ranks, the others return | `RankError` + the rank's traceback | kept, with its state |
# | exception, the others stay busy | they get SIGINT after 2 s; `RankError` | kept if they stop, else **restarted** |
# | hang (a collective not every rank calls) | `RankTimeout` after `--timeout` | **restarted** |
# | a rank dies (`os._exit`, OOM killer, segfault) | `RankError` with its exit code and last output | **restarted** |
# | kernel interrupt (⏹) | `KeyboardInterrupt`, ranks interrupted | kept if they stop, else **restarted** |
# | kernel restart / shutdown, `%ranks stop` | ranks exit (they also watch the kernel's process) | gone |

# %% [markdown]
# ## 4 · Exercises
#
# **Exercise 1.** Complete the cell so that every rank ends with `mean_rank`, a Python float holding the mean of
# all ranks' `rank`, computed with one `dist.all_reduce` (use `device` for the tensor).

# %%
def check_on_ranks(name, expected, normalise, solution, hint):
    """Fetch ``name`` from every rank and compare it with ``expected``; a stub (None) runs the solution."""
    values = pool.fetch(name)
    if all(v is None for v in values):
        print(f"… exercise not attempted yet: running the reference solution for {name!r} instead "
              "so the notebook can continue.")
        pool.exec(solution, output="quiet")
        values = pool.fetch(name)
    try:
        got = [normalise(v) for v in values]
    except (TypeError, ValueError) as exc:
        checks.fail(f"{name} on the ranks is {values!r} ({exc})", hint)
    if got != [expected] * len(got):
        checks.fail(f"{name} on the ranks is {got}, expected {expected} on every rank", hint)
    checks.passed(f"{name} = {expected} on all {len(got)} ranks")


# %%
%%ranks
mean_rank = None  # ✍ your code: all_reduce a tensor holding this rank's `rank`, then divide

# %%
check_on_ranks("mean_rank", (pool.world_size - 1) / 2, lambda v: round(float(v), 6),
               "t = torch.tensor([float(rank)], device=device)\ndist.all_reduce(t)\n"
               "mean_rank = t.item() / world_size",
               "sum the ranks with dist.all_reduce(t) (op SUM by default), then divide by world_size; "
               "use .item() for a float")

# %% [markdown]
# **Exercise 2.** Make `squares` a list, on every rank, of every rank's `rank ** 2` in rank order, with one
# `dist.all_gather`.

# %%
%%ranks
squares = None  # ✍ your code: all_gather a one-element tensor holding rank ** 2

# %%
check_on_ranks("squares", [r * r for r in range(pool.world_size)],
               lambda v: [int(torch.as_tensor(s).item()) for s in v],
               "mine = torch.tensor([rank ** 2], device=device)\n"
               "parts = [torch.zeros_like(mine) for _ in range(world_size)]\n"
               "dist.all_gather(parts, mine)\nsquares = [int(p.item()) for p in parts]",
               "dist.all_gather(list_of_world_size_tensors, mine) fills the list in rank order; "
               "each tensor must have the same shape and dtype as `mine`")

# %% [markdown]
# ## Summary
#
# | claim | verdict | measured |
# |---|---|---|
# | a persistent pool makes a cell cost milliseconds instead of a launch | ✓ | the speedup in §1 (this machine, and 2×H200) |
# | `%%ranks` keeps per-rank state between cells | ✓ | `steps` counted on across cells |
# | an exception in one rank leaves a sound process group usable | ✓ when every other rank returned | §3 |
# | a hang can be recovered from without restarting the kernel | ✓ `RankTimeout`, then fresh ranks | §3 |
#
# **Two styles.** `labutils.launch(fn)`: fresh processes per call — clean state, exact failure isolation,
# the right tool for final measurements and for tests. `RankPool` / `%%ranks`: ranks that stay — milliseconds
# per call, state kept between cells, the right tool while exploring. Stop the pool when you are done:

# %%
%ranks stop
print(f"pool closed: {pool.closed}")

# %% [markdown]
# **Next:** use `%%ranks` in the other labs wherever you iterate on one collective, then confirm the final
# numbers with `launch`.
