# %% [markdown]
# # 02 · Tensor parallelism: the `all_gather` example fixed — and the real thing
#
# The second source tutorial introduces tensor parallelism with a 15-line program: split a tensor,
# compute on each GPU, `all_gather` the pieces. It then claims that GPU-to-GPU transfers pay for
# *serialisation*, that many small parts make transfers slow, that uneven partitions leave GPUs idle
# (its §4.1), and that NCCL helps.
#
# **You will**
# 1. run the source's program exactly as written — its own file, its own `mp.spawn` launcher — see each of
#    its bugs, and verify a fixed version (gathered == twice the original tensor, on gloo and on NCCL);
# 2. measure `all_gather` (list) vs `all_gather_into_tensor` vs `reduce_scatter_tensor` vs `all_reduce`,
#    and find out, with your own measurement, why a collective gets less of the link than a plain copy;
# 3. test the source's claims on serialisation and uneven partitions with numbers;
# 4. write Megatron's `f` and `g` operators as `torch.autograd.Function`s, build the column- and
#    row-parallel layers and the MLP from them, check each against `nn.Linear` on every rank, gradients
#    included, and measure when tensor parallelism pays — and what its all-reduce costs inside a step.
#
# **GPUs:** 2 or more for the live path (written for any number; recorded on 2×H200 with NVLink). One GPU runs
# the one-GPU MLP baseline (section 5) live; on fewer GPUs than a measurement needs, every correctness cell
# runs live on gloo ranks and the measurement is the recording made by this notebook's own code, labelled
# **RECORDED**.
#
# **Time:** 100 min of study (three exercises, five predictions); about 25 s to run on 2×H200, about 14 s on a
# 2-core CPU.

# %% [markdown]
# ## Setup
# Every experiment here runs on several **ranks**: processes that each hold one GPU (or, without GPUs, CPU
# tensors) and belong to one process group, so that `torch.distributed`'s collectives connect them. A
# `labutils.RankPool` is a set of such ranks that stays alive between cells: it starts the processes and sets up
# their process group once, then runs each function you give it on every rank and hands back the results.
# Why not start fresh ranks for each experiment? Each start pays for new processes, `import torch` and the
# process group's set-up — seconds, on every cell — while a call into a running pool costs a round trip. The
# few calls this lab uses:
#
# ```python
# POOL = labutils.RankPool(world_size=3, backend="gloo", wait=False)  # start (in the background: wait=False)
# results = POOL.run(fn, arg1, arg2)     # fn(rank, world_size, arg1, arg2) on every rank; results in rank order
# POOL.world_size, POOL.backend          # what it runs on
# POOL.close()                           # stop the ranks (the lab's last cell)
# ```
#
# A rank that raises makes `run` raise, naming the rank; one that hangs is stopped after the call's timeout,
# with where every rank was waiting. Lab 07 opens the pool up: its `%%ranks` magic, what travels to the ranks,
# and how a pool survives a failing cell.
#
# This lab keeps three pools: `POOL` for the experiments (NCCL with one GPU per rank when there are enough
# GPUs, else gloo on CPU tensors); `GLOO`, 2 gloo ranks for what needs CPU tensors on every machine (the source's
# program on gloo); and `CHECKERS`, 3 gloo ranks for the exercise checkers — 3, because on 2 ranks "mine and the
# other one" can pass for "every rank in rank order". Without GPUs, `POOL` and `GLOO` are the same pool. All of
# them start in the background while section 1 runs the source's program; their first task waits for them.

# %% tags=["nbval-ignore-output"]
import datetime
import re
import socket

import pandas as pd
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from IPython.display import display

import labutils
from labutils import bandwidth, claims, compat, hw, plots, recorded
from labutils.checks import lab02 as check
from labutils.config import rank_device
from labutils.instruments import compare
from labutils.labs.lab02_tensor_parallel import cost_model, measure, one_gpu, paths, script, steps, verify
from labutils.labs.lab02_tensor_parallel.claims import (CLAIMS, allreduce_fit, fits_its_step, model_terms,
                                                        model_train_ms, paths_verdicts, sweep_verdicts)

HW = hw.describe()
MODE = HW.mode                                       # "multi-gpu", "single-gpu" or "cpu"
BACKEND = "nccl" if MODE == "multi-gpu" else "gloo"  # the lab's ranks: one GPU each, else CPU tensors
labutils.default_config()
POOL = labutils.RankPool(backend=BACKEND, output="quiet", wait=False)    # starts in the background
GLOO = (POOL if POOL.backend == "gloo" and POOL.world_size == 2
        else labutils.RankPool(world_size=2, backend="gloo", output="quiet", wait=False))
CHECKERS = labutils.RankPool(world_size=3, backend="gloo", output="quiet", wait=False)   # the exercise checkers
HW

# %% [markdown]
# ## 1 · The source's program, run as written
#
# Below is the source's program (§1.1), indented as Python needs and with its comments translated; nothing
# else is changed. It starts its two ranks with `torch.multiprocessing.spawn`, which cannot run from a
# notebook: `spawn` starts fresh interpreters that import `__main__` to find `tensor_parallel`, and a
# notebook's `__main__` is not a file. So the notebook writes the program to a temporary folder and runs it
# the way its author would, `python program.py`, once, with a time limit, and keeps what it printed.

# %%
SOURCE_PROGRAM = '''\
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
# initialise the distributed environment
def init_distributed(rank, world_size):
    dist.init_process_group(
        backend='nccl',
        init_method='tcp://localhost:23456',
        rank=rank,
        world_size=world_size
    )
# tensor-parallel computation
def tensor_parallel(rank, world_size):
    init_distributed(rank, world_size)
    # create a big tensor
    tensor = torch.randn(1000, 1000)
    # split it into parts
    split_tensor = torch.chunk(tensor, world_size, dim=0)
    local_tensor = split_tensor[rank]
    # compute on the local GPU
    result = local_tensor * 2
    # more complex computations could go here
    # collect the results
    all_results = [torch.empty_like(result) for _ in range(world_size)]
    dist.all_gather(all_results, result)
    final_result = torch.cat(all_results, dim=0)
    print(final_result)
    dist.destroy_process_group()
if __name__ == '__main__':
    world_size = 2
    mp.spawn(tensor_parallel, args=(world_size,), nprocs=world_size, join=True)
'''

# %% [markdown]
# The table shows the run on 2 GPUs, the one the source has in mind. On a machine with fewer GPUs that run is
# the recording, and the program also runs here once, in a second column:

# %% tags=["nbval-ignore-output"]
def run_as_written():
    """The program in its own python process, stopped after 120 s: exit code, last exception, its output."""
    return script.run_program(SOURCE_PROGRAM, timeout_s=120)


AS_WRITTEN = recorded.live_or_recorded("02_source_nccl_error", run_as_written, gpus_needed=2)
RUNS = {AS_WRITTEN.label: AS_WRITTEN.data}
if not AS_WRITTEN.live:
    RUNS["live: this machine"] = run_as_written()
pd.DataFrame({where: {"exit code": run.get("returncode"), "exception": run.get("exc_type"),
                      "message": run.get("message"), "lines printed": run.get("printed_lines"),
                      "seconds": run.get("seconds")} for where, run in RUNS.items()})

# %% tags=["nbval-ignore-output"]
claims.show(CLAIMS["02_source_nccl_error"](AS_WRITTEN.data), AS_WRITTEN)
print("\nthe end of what the program wrote on this machine:\n")
print(list(RUNS.values())[-1].get("output_tail", "(not recorded)"))

# %% [markdown]
# ### Bug 1 — CPU tensors on an NCCL process group
# `torch.randn(1000, 1000)` lives on the CPU, and the group has only an NCCL backend, which moves CUDA
# tensors. `dist.all_gather` looks up the backend registered for the tensors' device type; a group created
# with `backend='nccl'` registers NCCL for `cuda` only, so a CPU tensor finds none and the call raises. A
# PyTorch built without NCCL (a CPU-only build) refuses `backend='nccl'` already in `init_process_group`.
# `mp.spawn` then reports the first rank's exception and stops the other rank. The fix is to put the data
# where the backend can move it: one GPU per rank, `torch.cuda.set_device(rank)` and
# `device = torch.device("cuda", rank)` (a bare `.cuda()` without `set_device` would put every rank on
# `cuda:0`). The lab's ranks are bound to their GPUs already (`labutils.config.rank_device()`).
#
# ### Bug 2 — a fixed port
# `tcp://localhost:23456` makes rank 0 open a rendezvous server (a `TCPStore`) on port 23456 — on every
# network interface of the machine — and the other ranks connect to it. Any other job that chose the same
# number (a second copy of this program, a colleague, a test running in parallel) collides with it: whichever
# comes second cannot listen, or, worse, its ranks join the first job's rendezvous. We leave 23456 alone; we
# hold a free port, as another job would, and do what rank 0 does first with `init_method` on that port:

# %%
with socket.socket() as other_job:                   # another job holds a port (the OS picked a free one)
    other_job.bind(("127.0.0.1", 0))
    other_job.listen(1)
    busy_port = other_job.getsockname()[1]
    try:                                             # rank 0's first step for init_method=tcp://localhost:PORT
        dist.TCPStore("localhost", busy_port, world_size=2, is_master=True, wait_for_workers=False,
                      timeout=datetime.timedelta(seconds=10))
        PORT_ERROR = None
    except RuntimeError as exc:                      # torch's DistNetworkError is a RuntimeError
        PORT_ERROR = exc
print("rank 0 could not open its rendezvous server:", PORT_ERROR is not None)
print("the port was already in use:", PORT_ERROR is not None and ("EADDRINUSE" in str(PORT_ERROR)
                                                                  or "already in use" in str(PORT_ERROR)))

# %% [markdown]
# The error itself (its wording varies between PyTorch versions):

# %% tags=["nbval-ignore-output"]
print(f"{type(PORT_ERROR).__name__}: {PORT_ERROR}")

# %% [markdown]
# `labutils` never uses a fixed port: every launch and every pool gets a fresh one from the OS, on the
# loopback interface only.
#
# ### Bugs 3 and 4 — every rank draws its own "big tensor", and a print of a million numbers
# With CPU tensors on a gloo group the rest of the program runs. Here is its body, after
# `init_distributed`, as written, on the 2-rank gloo pool (whose ranks joined their group already); it
# returns its data so that we can look at it:

# %% tags=["nbval-ignore-output"]
def tensor_parallel_body(rank, world_size):
    tensor = torch.randn(1000, 1000)
    split_tensor = torch.chunk(tensor, world_size, dim=0)
    local_tensor = split_tensor[rank]
    result = local_tensor * 2
    all_results = [torch.empty_like(result) for _ in range(world_size)]
    dist.all_gather(all_results, result)
    final_result = torch.cat(all_results, dim=0)
    print(final_result)
    return tensor, final_result          # added: hand the data back to the notebook


SRC = GLOO.run(tensor_parallel_body, output="grouped")

# %% [markdown]
# Each process seeds its own random generator, so each rank drew a *different* tensor. The gathered result
# is a mosaic — rank 0's top half next to rank 1's bottom half — which is twice neither:

# %%
tensors = [t for t, _ in SRC]
finals = [f for _, f in SRC]
print("every rank gathered the same result:", all(torch.equal(f, finals[0]) for f in finals))
print("the ranks drew the same 'big tensor':", all(torch.equal(t, tensors[0]) for t in tensors))
for r, t in enumerate(tensors):
    print(f"gathered == 2 x rank {r}'s tensor:", torch.equal(finals[0], 2 * t))
blocks = torch.chunk(finals[0], len(SRC))
print("block r of the result == 2 x block r of rank r's own tensor:",
      all(torch.equal(b, 2 * torch.chunk(tensors[r], len(SRC))[r]) for r, b in enumerate(blocks)))

# %% [markdown]
# And `print(final_result)` shows 36 of the million numbers per rank (torch summarises large tensors to their
# corners): it verifies nothing, and without a launcher that groups the ranks' output the prints interleave.
# Print a *check*.
#
# ### The fixed program, verified
# Four fixes: the data lives on the rank's device; every rank draws the **same** tensor (a seeded
# generator); the rows are split with `torch.tensor_split` (balanced, always `world_size` parts; section 4
# says why); and it prints a check instead of the tensor. The rendezvous is the pool's job. With 999 rows (or
# 1000 rows on 3 ranks) the blocks differ in length, and NCCL's all-gather moves the same count from every
# rank — but every rank can compute every block's length, since all split the same tensor the same way. So:
# pad every block to the longest, gather into one tensor, cut the padding away.

# %%
def gather_padded(block, counts, group=None):
    """All-gather row blocks whose lengths every rank knows (counts[r] rows on rank r), in rank order."""
    longest = max(counts)
    padded = block.new_zeros((longest,) + tuple(block.shape[1:]))
    padded[: block.shape[0]] = block
    out = block.new_empty((len(counts) * longest,) + tuple(block.shape[1:]))
    compat.all_gather_into_tensor(out, padded, group)          # one NCCL all-gather, equal counts
    return torch.cat([out[r * longest: r * longest + c] for r, c in enumerate(counts)])


def tensor_parallel_fixed(rank, world_size, seed=0):
    device = rank_device()                                     # this rank's GPU, or the CPU on gloo
    checks = {}
    for rows in (1000, 999):
        gen = torch.Generator().manual_seed(seed)              # the same tensor on every rank
        tensor = torch.randn(rows, 1000, generator=gen).to(device)
        parts = torch.tensor_split(tensor, world_size, dim=0)
        result = parts[rank] * 2
        final_result = gather_padded(result, [len(p) for p in parts])
        checks[rows] = torch.equal(final_result, 2 * tensor)
    return checks


FIXED = POOL.run(tensor_parallel_fixed)
for rows in (1000, 999):
    print(f"{rows} rows: gathered == 2 x the original tensor on every rank: {all(c[rows] for c in FIXED)}")

# %% [markdown]
# The same text comes out on CPU/gloo and on GPUs/NCCL — the course's tests compare it.
#
# This program is data parallelism of an elementwise operation: no weight matrix is split, and the whole
# answer is communicated. The source's §2.1 goes further and calls splitting a batch of images over the GPUs
# and summing their gradients "tensor parallelism": that is **data parallelism**, which lab 08 builds by hand
# and with DDP. Real tensor parallelism (section 5) splits the *weights*, so that far less has to move.
# First, the collectives it uses.

# %% [markdown]
# ## 2 · `all_gather` (list) vs `all_gather_into_tensor`, `reduce_scatter_tensor` and `all_reduce`
#
# | op | each rank gives | each rank gets | size S (nccl-tests) | busbw / algbw |
# |---|---|---|---|---|
# | `all_gather(list, t)` | `t` (S/n bytes) | a list of n tensors | the gathered S | (n−1)/n |
# | `all_gather_into_tensor(out, t)` | `t` (S/n bytes) | one tensor of S bytes | the gathered S | (n−1)/n |
# | `reduce_scatter_tensor(out, t)` | `t` (S bytes) | its 1/n of the sum | the input S | (n−1)/n |
# | `all_reduce(t)` | `t` (S bytes) | the sum, S bytes | S | 2(n−1)/n |
#
# *algbw* = S / t; *busbw* = algbw × the factor: what each link carries in each direction in a ring,
# comparable to the hardware peak whatever n is (nccl-tests, `doc/PERFORMANCE.md`). NCCL has one all-gather,
# into one buffer. `all_gather(list)` therefore allocates a flat buffer, runs it, then **copies** each of the
# n pieces into your list (`ProcessGroupNCCL::allgather`); `all_gather_into_tensor` writes straight into your
# tensor. `reduce_scatter` is the conjugate of all-gather, and a ring all-reduce is a reduce-scatter followed
# by an all-gather — hence its factor 2(n−1)/n. (PyTorch ≥ 2.13 renames the two `_tensor` functions
# `all_gather_single` / `reduce_scatter_single`; `labutils.compat` calls whichever your torch has.)
#
# **Predict:** the NVLink line rate of an H200 is 478 GB/s per direction (18 links of 26.56 GB/s, <!-- not measured: nvidia-smi's link rate -->
# as nvidia-smi reports them; the datasheet's data rate is 450 GB/s, lab 00). What busbw will <!-- not measured: datasheet -->
# `all_gather_into_tensor` reach at 1 GiB on 2×H200?

# %%
my_prediction_busbw_gbps = None  # ✍ your number, in GB/s

# %% tags=["nbval-ignore-output"]
SWEEP_SIZES = bandwidth.size_sweep(4 * 2**10, 2**30, 4)      # 4 KiB ... 1 GiB


def measure_collectives():
    sweep = POOL.run(measure.collective_sweep, SWEEP_SIZES, kwargs=dict(warmup=3, iters=10))[0]
    link = POOL.run(paths.link_paths, SWEEP_SIZES[-1])[0]        # the same bytes by every path (below)
    return dict(sweep, paths=link, link_peak_gbps=HW.link_peak_gbps, link_data_peak_gbps=HW.link_data_peak_gbps)


SWEEP = recorded.live_or_recorded("02_collectives", measure_collectives, gpus_needed=2)
OPS = SWEEP.data["ops"]
sizes = OPS["all_gather_into_tensor"]["size_bytes"]
star = (sizes[-1], my_prediction_busbw_gbps) if my_prediction_busbw_gbps is not None else None
plots.bandwidth_plot(sizes, {op: OPS[op]["busbw_gbps"] for op in OPS}, peak_gbps=SWEEP.data["link_peak_gbps"],
                     peak_label="NVLink line rate (nvidia-smi)",
                     peaks={"NVLink data rate": SWEEP.data.get("link_data_peak_gbps")}, prediction=star,
                     ylabel="busbw (GB/s)",
                     title=f"busbw, {SWEEP.data['world_size']} ranks, {SWEEP.data['dtype']} — {SWEEP.label}")

# %% tags=["nbval-ignore-output"]
pd.DataFrame({(op, what): [v * 1e3 if what == "time (µs)" else v for v in OPS[op][key]]
              for op in OPS for what, key in (("time (µs)", "time_ms"), ("busbw (GB/s)", "busbw_gbps"))},
             index=pd.Index([bandwidth.format_size(s) for s in sizes], name="S")).round(1)

# %% tags=["nbval-ignore-output"]
claims.show(sweep_verdicts(SWEEP.data), SWEEP)

# %% [markdown]
# **What the numbers say.** Every call pays a fixed cost — the host's work to issue it, the launch of NCCL's
# kernel, the handshakes of its protocol — that a few KiB cannot amortise: the real content of the source's
# "many small parts are slow" (the verdict's threshold: a small call reaching at most a tenth of the large
# call's busbw). For large messages the fixed cost vanishes against the transfer, and busbw is the number to
# compare with the link: the verdict judges it against NVLink's line rate as nvidia-smi reports it (the dotted
# line; "a large share" is at least half of it). The datasheet's data rate (dash-dot, where the recording has
# it) is the lower ceiling a copy can approach (lab 00). The list
# version pays extra copies and the allocation of the flat buffer on top of the same NCCL kernel (judged at every size, at a
# tenth more time, above the run-to-run spread of a large call); prefer `all_gather_into_tensor` whenever you
# can gather into one tensor.
#
# Since busbw already accounts for an all-reduce moving twice the bytes of an all-gather, one might expect the
# two to reach the same busbw (within 10 %). Where they do not, the next measurement shows why.
#
# ### Why a collective gets less of the link than a copy
# A copy from one GPU's memory into the other's (`y.copy_(x)` across devices) is done by a **copy engine**, a
# DMA unit that needs no SM. NCCL instead moves data with a **kernel**: each of its *channels* is one thread
# block on one SM, which reads a slice of the data and writes it into a buffer on the peer GPU, chunk by chunk,
# with flags telling the peer what has arrived (NCCL's Simple / LL / LL128 protocols); the peer's kernel copies
# it onward (into the output, or added into a sum). How many channels a call gets is NCCL's choice (printed in
# its `NCCL_DEBUG=INFO` log, lab 05); every channel takes an SM away from compute, so NCCL does not use them
# all. Two more facts matter: a ring collective sends in **both directions at once** (each GPU sends to its
# right neighbour while receiving from its left — on two GPUs, to and from the same peer), so its fair
# comparison is a copy both ways at once; and NCCL's point-to-point `send`/`recv` uses the same kind of kernel
# without a collective's steps. The measurement above also sent the largest size by each of these paths, ran
# the two collectives on communicators whose calls use a fixed number of CTAs (NCCL's `min_ctas =
# max_ctas`: one channel per CTA), and ran the all-gather once more from a single process that drives both
# GPUs (`torch.cuda.nccl`, as in lab 01), to see whether the process boundary plays a part:
#
# **Predict:** which of these three explains most of the all-gather's distance from the copy: sending both
# ways at once, NCCL's kernel (SMs, buffers), or the number of channels NCCL chose?

# %%
my_prediction_main_cause = None  # ✍ "both ways", "kernel" or "channels"

# %% tags=["nbval-ignore-output"]
LINK = SWEEP.data.get("paths")
if LINK:
    link_rows = pd.DataFrame(LINK["rows"]).set_index("path")
    display(plots.bar_plot(list(link_rows.index), list(link_rows["gbps_per_direction"]),
                           ylabel="GB/s per direction", annotate="{:.0f}",
                           title=f"{bandwidth.format_size(LINK['size_bytes'])} between two GPUs, every path — "
                                 f"{SWEEP.label}"))
    display(link_rows[["engine", "directions", "ctas", "time_ms", "gbps_per_direction", "spread"]].round(3))
    claims.show(paths_verdicts(LINK), SWEEP)
else:
    print(f"[{SWEEP.label}] this recording has no path measurements; they run live on 2 or more GPUs.")

# %% [markdown]
# **Reading it.** The verdicts judge three things, each with a tenth as its margin (the table's last column is
# each path's run-to-run spread, p10–p90; the last verdict prints the largest): whether the link carries both
# directions at once at nearly the one-way rate (if so, "both ways" cannot be the main cause); whether the
# all-gather moves less per direction than a copy both ways (if so, the link is not what limits it); and whether
# giving NCCL more CTAs raises the all-gather's busbw (if so, the number of channels is what limits it). The
# one-process all-gather's row is there to rule out the process boundary: compare it with the all-gather's row
# of one process per GPU. NCCL's own send/recv both ways shows what its kind of kernel reaches without a
# collective's steps. Compare with your prediction.
#
# **How the one-process all-gather is timed.** The other paths take turns sample by sample, every rank in
# step. The one-process all-gather is timed apart, after them: rank 0 runs it while every other rank waits in
# a barrier of a gloo group — a wait on the host, with no kernel on any GPU (`paths.time_alone`). Waiting in
# an NCCL barrier instead would leave a kernel of rank 1's own process spinning on GPU 1, and kernels of two
# processes do not run side by side on one GPU: without NVIDIA's MPS the GPU switches between the processes'
# contexts in time slices, and the all-gather would have GPU 1 only part of the time. Timed alone, the two
# all-gathers differ only in how many processes drive the GPUs.
#
# The same table answers the all-reduce vs all-gather verdict of section 2's sweep. Compare each collective's
# row with 64 CTAs with its row under NCCL's choice: if the all-gather gains much more than the all-reduce and
# the two come close, then at NCCL's default it is the all-gather that is short of channels — busbw's
# definition is not what fails. NCCL's default is a trade-off: in a training step communication overlaps
# compute, and every channel's SM is missing from the matmuls beside it.

# %% [markdown]
# ## 3 · "GPU-to-GPU transfers pay for serialisation" — tested
#
# A tensor is already a block of bytes in GPU memory. NCCL's kernels copy those bytes over NVLink into the
# peer's memory (through NCCL's buffers, as above): nothing is serialised. Pickling happens only in the
# *object* collectives — `all_gather_object`, `broadcast_object_list`, … — which turn any Python object into
# bytes, all-gather the sizes, pad, all-gather the bytes and unpickle (the padding trick of section 1, with
# the sizes exchanged first as in exercise 1 below, done by PyTorch). Their documentation warns: *"Calling
# all_gather_object() with GPU tensors is not well supported and inefficient as it incurs GPU → CPU transfer
# since tensors would be pickled."* So measure both paths on the same tensor, and count the bytes NVLink
# carried (NVML's data counter, when the machine exposes it).
#
# **Predict:** how many times slower is `all_gather_object` than `all_gather_into_tensor` for a 16 MiB tensor?

# %%
my_prediction_object_slowdown = None  # ✍ your number (a ratio)

# %% tags=["nbval-ignore-output"]
OBJECT_SIZES = [4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20]
OBJ = recorded.live_or_recorded(
    "02_object_vs_tensor",
    lambda: POOL.run(measure.object_vs_tensor, OBJECT_SIZES, kwargs=dict(repeat=3, link_iters=2))[0],
    gpus_needed=2)
rows = OBJ.data["rows"]
osz = [r["size_bytes"] for r in rows]
star = (osz[-1], rows[-1]["tensor_ms"] * my_prediction_object_slowdown) if my_prediction_object_slowdown else None
plots.time_plot(osz, {"all_gather_into_tensor": [r["tensor_ms"] for r in rows],
                      "all_gather_object": [r["object_ms"] for r in rows],
                      "pickle.dumps alone": [r["pickle_ms"] for r in rows]},
                prediction=star, title=f"one tensor per rank, gathered two ways — {OBJ.label}")

# %% tags=["nbval-ignore-output"]
display(pd.DataFrame({"tensor": [bandwidth.format_size(r["size_bytes"]) for r in rows],
                      "pickled bytes": [r["pickled_bytes"] for r in rows],
                      "tensor path (ms)": [r["tensor_ms"] for r in rows],
                      "object path (ms)": [r["object_ms"] for r in rows],
                      "object / tensor": [r["object_ms"] / r["tensor_ms"] for r in rows],
                      "pickle (ms)": [r["pickle_ms"] for r in rows],
                      "unpickle (ms)": [r["unpickle_ms"] for r in rows]}).set_index("tensor").round(3))
print("devices of the tensors all_gather_object handed back:", rows[-1]["received_devices"])
link = OBJ.data["link"]
for path in ("tensor", "object"):
    b = link.get(f"{path}_link_bytes_per_call")
    print(f"NVLink bytes per call, {path} path, {bandwidth.format_size(link['size_bytes'])} per rank: "
          + (f"{b / link['payload_bytes_per_call']:.3f} x the payload" if b is not None else "no NVML counter here"))
claims.show(CLAIMS["02_object_vs_tensor"](OBJ.data), OBJ)

# %% [markdown]
# **Verdict.** The first line judges the claim by the bytes: if NCCL serialised a tensor, NVLink would carry
# more than the tensor (a threshold of a tenth more leaves room for the counter's granularity and NCCL's
# flags). The object path has about the same bytes to move — the pickle adds only a small header (the
# "pickled bytes" column, and the NVLink counter where it exists) — yet it is slower because of what happens
# *around* the transfer (the second line: at least ten times slower counts as "far more"). Note also where
# the unpickled tensors land: on the GPU they were pickled from, so rank 0 ends up holding a tensor on its
# peer's GPU. Use object collectives for small Python metadata only.
#
# **Where the object path's time goes.** `all_gather_object(objs, t)` does, on every rank, in this order
# (`torch/distributed/distributed_c10d.py`, `_object_to_tensor` and `_tensor_to_object`):
# 1. pickle `t`: a CUDA tensor's storage is copied to the host (GPU → CPU) and serialised into a byte buffer;
# 2. the bytes become a `ByteTensor` (a host copy) and are copied to this rank's GPU (CPU → GPU), with a
#    one-element tensor holding their length;
# 3. an all_gather of the lengths, then `.item()` on their maximum: the host waits for the GPU here;
# 4. the byte tensor is padded to that maximum and all-gathered: this is the only step that moves the payload
#    between GPUs, the same bytes as the tensor path;
# 5. for **each** of the world-size results: copy to the host (GPU → CPU), turn into Python bytes (another
#    host copy), unpickle — which rebuilds the tensor and copies it back to the GPU it was pickled on.
#
# Every step but 3 and 4 touches all the bytes once more, on the host or across PCIe, one after another, with
# the host waiting on each; the tensor path touches them once, on the GPUs, in one NCCL kernel. The recording
# timed two of those steps alone (pickle, unpickle), so the cell below can say how much of a call they
# account for, and how the call's time grows with the bytes; the rest of a call — the copies between host
# and GPU, the two collectives and the waits between them — the recording does not split, and the cell says
# so rather than guess. It also times the host-only steps (1, 2 and 5 without the GPU) on this machine's CPU.

# %% tags=["nbval-ignore-output"]
import pickle

from labutils import timing

obj_world = OBJ.data.get("world_size", 2)
print(f"object path per call, and what its pickle + {obj_world} unpickles (each timed alone) account for "
      f"[{OBJ.label}]:")
for r in rows:
    serial_ms = r["pickle_ms"] + obj_world * r["unpickle_ms"]
    print(f"  {bandwidth.format_size(r['size_bytes']):>7}: {r['object_ms']:8.2f} ms per call; pickle + "
          f"{obj_world} x unpickle {serial_ms:7.2f} ms ({serial_ms / r['object_ms']:.0%}); not split by this "
          f"recording {r['object_ms'] - serial_ms:7.2f} ms")
lo, hi = rows[-2], rows[-1]
extra_mib = (hi["size_bytes"] - lo["size_bytes"]) / 2**20
print(f"from {bandwidth.format_size(lo['size_bytes'])} to {bandwidth.format_size(hi['size_bytes'])} per rank, each "
      f"extra MiB costs {(hi['object_ms'] - lo['object_ms']) / extra_mib:.2f} ms on the object path and "
      f"{(hi['tensor_ms'] - lo['tensor_ms']) / extra_mib:.4f} ms on the tensor path")


def object_path_host_steps(t, world_size):
    """all_gather_object's host work for one rank's tensor ``t`` (steps 1, 2 and 5), without GPUs."""
    blob = pickle.dumps(t)                                       # 1. serialise
    as_bytes = torch.frombuffer(bytearray(blob), dtype=torch.uint8)   # 2. bytes -> ByteTensor (a copy)
    return [pickle.loads(as_bytes.numpy().tobytes()[:len(blob)])     # 5. per result: bytes, unpickle
            for _ in range(world_size)]


cpu_t = torch.zeros(OBJECT_SIZES[-1] // 4)
host = timing.benchmark(lambda: object_path_host_steps(cpu_t, obj_world), warmup=1, repeat=5, device="cpu")
alone = timing.benchmark(lambda: pickle.dumps(cpu_t), warmup=1, repeat=5, device="cpu")
print(f"this machine's CPU, a {bandwidth.format_size(OBJECT_SIZES[-1])} CPU tensor: host steps of one call "
      f"{host.median_ms:.2f} ms (pickle alone {alone.median_ms:.2f} ms); on GPUs the copies between host and "
      "GPU come on top")

# %% [markdown]
# ## 4 · Partition balance (source §4.1)
#
# `torch.chunk(t, n)` makes chunks of `ceil(rows / n)` rows, so the last one is smaller — and it may return
# **fewer than n** chunks. `torch.tensor_split(t, n)` always returns n parts whose sizes differ by at most one:

# %%
pd.DataFrame({"torch.chunk(1000 rows)": {n: str([len(c) for c in torch.chunk(torch.empty(1000), n)]) for n in range(2, 9)},
              "torch.tensor_split(1000 rows)": {n: str([len(c) for c in torch.tensor_split(torch.empty(1000), n)])
                                                for n in range(2, 9)}}).rename_axis("n")

# %%
print("torch.chunk of 10 rows into 6 parts gives", len(torch.chunk(torch.empty(10), 6)),
      "parts: rank 5 of the source program would raise IndexError")

# %% [markdown]
# NCCL's `ncclAllGather` moves the **same count** from every rank, and NCCL does not check that the ranks
# agree: the source's `empty_like(result)` buffers are sized from each rank's *own* block, so with uneven
# blocks the ranks pass different counts — undefined behaviour (a hang, a crash, or wrong data), not an error.
# `TORCH_DISTRIBUTED_DEBUG=DETAIL` makes PyTorch compare every collective's shapes across ranks first and raise
# instead; `dist.set_debug_level` does the same for the groups made after it. The source's call on such a
# group, then the fix of section 1:

# %%
def uneven_source_style(rank, world_size):
    old = dist.get_debug_level()
    dist.set_debug_level(dist.DebugLevel.DETAIL)      # = TORCH_DISTRIBUTED_DEBUG=DETAIL, for new groups
    checked = dist.new_group(backend=dist.get_backend())
    dist.set_debug_level(old)
    tensor = torch.randn(999, 1000, generator=torch.Generator().manual_seed(0)).to(rank_device())
    result = torch.chunk(tensor, world_size, dim=0)[rank] * 2           # 500 and 499 rows on 2 ranks
    all_results = [torch.empty_like(result) for _ in range(world_size)]
    try:
        dist.all_gather(all_results, result, group=checked)
        verdict = "no error (!)"
    except RuntimeError as e:
        shapes = re.findall(r"TensorShape=\[([\d, ]+)\]", str(e))
        verdict = f"caught a mismatch: {'Detected mismatch' in str(e)}, shapes {shapes}"
    finally:
        dist.destroy_process_group(checked)
    counts = [len(p) for p in torch.chunk(tensor, world_size, dim=0)]
    padded = gather_padded(result, counts)
    return f"source-style all_gather: {verdict}; padded all_gather == 2 x tensor: {torch.equal(padded, 2 * tensor)}"


for r, line in enumerate(POOL.run(uneven_source_style)):
    print(f"rank {r}: {line}")

# %% [markdown]
# `all_gather` into a list whose tensors have each rank's true block size (the same list on every rank) is the
# remaining option: gloo refuses it, and PyTorch's NCCL backend emulates it with one broadcast per rank
# (`ProcessGroupNCCL::allgather`, "unequal size" branch) — correct, but n collectives instead of one.
#
# **What imbalance costs.** A step is "compute, then all-gather"; rank 0 gets k times the rows of every other
# rank. The all-gather cannot finish before rank 0 arrives, so the step takes as long as rank 0's compute plus
# the all-gather's own transfer, and the other ranks wait *inside the collective*. One call measures this and
# tries the unequal-size list.
#
# **Predict:** with k = 4, how many times longer is a step than with k = 1?

# %%
my_prediction_step_ratio = None  # ✍ your number (a ratio)

# %% tags=["nbval-ignore-output"]
FACTORS = [1, 1.5, 2, 3, 4]
PART = recorded.live_or_recorded("02_partitions", lambda: POOL.run(measure.partitions, FACTORS)[0], gpus_needed=2)
for backend, outcome in PART.data["uneven_list"].items():
    print(f"[{PART.label}] all_gather into a list of unequal tensors, {backend:>5}: {outcome}")
if not PART.live:
    print(f"[live: this machine] all_gather into a list of unequal tensors,  gloo: "
          f"{GLOO.run(verify.uneven_list_gather)[0]['gloo']}")
d = PART.data["imbalance"]
step = [max(s) for s in d["step_ms"]]
star = (4, step[0] * my_prediction_step_ratio) if my_prediction_step_ratio else None
plots.line_plot(d["factors"], {"step (slowest rank)": step, "rank 0 compute": [c[0] for c in d["compute_ms"]],
                               "rank 1 compute": [c[1] for c in d["compute_ms"]],
                               "rank 0 all_gather": [g[0] for g in d["all_gather_ms"]],
                               "rank 1 all_gather (incl. waiting)": [g[1] for g in d["all_gather_ms"]]},
                xlabel="k (rank 0 has k times the rows of the others)", ylabel="ms", prediction=star,
                title=f"imbalance: unit = ({d['rows']} x {d['cols']}) @ ({d['cols']} x {d['out_cols']}), "
                      f"{d['world_size']} ranks — {PART.label}")

# %% tags=["nbval-ignore-output"]
display(pd.DataFrame({"step (ms)": step, "compute per rank (ms)": [[round(x, 3) for x in c] for c in d["compute_ms"]],
                      "all_gather per rank (ms)": [[round(x, 3) for x in g] for g in d["all_gather_ms"]]},
                     index=pd.Index(d["factors"], name="k")).round(3))
print(f"step at k = {d['factors'][-1]} / step at k = 1: {step[-1] / step[0]:.2f}")
claims.show(CLAIMS["02_partitions"](PART.data), PART)

# %% [markdown]
# **Reading it.** Rank 0's work grows with k; the fast ranks have the same work at every k, so whatever they
# lose can only show up inside their all_gather, which cannot finish before rank 0 joins. Rank 0's own
# all_gather moves more bytes as k grows (every block is padded to rank 0's length), so the fast ranks' wait
# is their all_gather time minus rank 0's. The idle time does not show up as idle: it shows up as a slow
# collective on the fast ranks, and a profiler would blame NCCL. The verdicts: the fast ranks "idle" if they
# wait a quarter of the step or more, and their wait "is" rank 0's extra compute if the two agree within a
# quarter. The fix is cheap: balance first (`tensor_split`: at most one row of difference), then pad; padding
# costs at most one row per rank on the wire.
#
# ### Exercise 1 — all-gather blocks whose lengths only their own rank knows
# In section 1 every rank could compute every block's length. Often it cannot: after filtering, routing or
# sampling, each rank knows only its own count. Write `my_gather_rows_uneven(x, group)`: `x` is this rank's
# block of rows (a rank may have none); return every rank's rows concatenated in rank order, on every rank. Use
# one `compat.all_gather_into_tensor(output, input, group)` for the data, plus whatever small collective you
# need first (and `gather_padded` from section 1 if you like). The checker runs it on the 3 gloo ranks of
# `CHECKERS`, and reads what each rank issued (`labutils.instruments.ledger.Ledger`): the rows must travel in one
# all-gather of the blocks padded to the longest — an all-reduce of a zero-filled buffer, one broadcast per rank
# or pickled objects get the right rows too, and send more.

# %% nbgrader={"grade": false, "grade_id": "gather_rows_uneven", "locked": false, "schema_version": 3, "solution": true}
def my_gather_rows_uneven(x, group=None):
    ### BEGIN SOLUTION
    from labutils.solutions import lab02 as solution  # the instructor's edition: the reference answer
    return solution.gather_rows_uneven(x, group)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_gather_rows_uneven", "locked": true, "points": 2, "schema_version": 3, "solution": false}
check.gather_rows_uneven(my_gather_rows_uneven, pool=CHECKERS)

# %% [markdown]
# ## 5 · Real tensor parallelism, Megatron style
#
# Megatron-LM (Shoeybi et al. 2019, §3) splits the *weights* of a transformer MLP `Z = GeLU(X A) B` over p ranks:
#
# * **column-parallel** `A = [A_1, …, A_p]`: rank i computes `Y_i = GeLU(X A_i)` — no communication, because
#   GeLU is elementwise and each column of `Y` needs only its column of `A`;
# * **row-parallel** `B = [B_1; …; B_p]`: rank i computes the partial product `Y_i B_i`, and **one all-reduce**
#   sums them: `Z = Σ_i Y_i B_i`.
#
# Two conjugate operators carry all the communication, forward *and* backward:
#
# | operator | forward | backward | where |
# |---|---|---|---|
# | `f` | identity: every rank already has `X` | all-reduce: `dL/dX = Σ_i dL/dX` through each `A_i` | in front of the column layer |
# | `g` | all-reduce: `Z = Σ_i Y_i B_i` | identity: `∂Z/∂(Y_i B_i) = 1` | after the row layer |
#
# So a forward pass moves `tokens × hidden` elements once, and so does the backward pass, however large the
# inner layer is. In PyTorch an operator with a hand-written backward is a `torch.autograd.Function`:

# %%
class CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward; backward all-reduces (sums) the gradient over the group."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()                       # autograd may hand this same tensor to other branches
        dist.all_reduce(grad, group=ctx.group)    # X fed every rank's A_i: its gradient is the sum
        return grad, None                         # one gradient per forward input (none for group)


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g: forward all-reduces (sums) the partial results; backward is the identity."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.clone()                             # leave the caller's tensor alone (Megatron reduces in place)
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None                         # each rank's term entered the sum with weight 1


# %% [markdown]
# Checked on the lab's ranks against their definitions: `f(x) = x`, and its input gradient is the sum of every
# rank's output gradient (each rank weights the output differently here); `g` sums every rank's input, and
# hands the output gradient back unchanged (float64, `torch.testing.assert_close`):

# %%
compare.report(POOL.run(verify.operators, CopyToTP, ReduceFromTP))

# %% [markdown]
# ### The column-parallel layer
# `nn.Linear` stores `Aᵀ` (`weight` is `[out_features, in_features]`), so "A's columns `A_i`" are rows of the
# weight: `weight.chunk(p, dim=0)[rank]`, and the matching slice of the bias. Built here from an existing
# `nn.Linear`, so that the check can compare against it exactly (Megatron initialises each shard on its own
# GPU instead of building the whole layer first):

# %%
class ColumnParallelLinear(nn.Module):
    """Y_i = X A_i + b_i: this rank's share of the output columns of an nn.Linear."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        rank, p = dist.get_rank(group), dist.get_world_size(group)
        if linear.out_features % p:
            raise ValueError(f"out_features = {linear.out_features} does not split into {p} equal shards. "
                             f"HINT: use a multiple of {p} (or pad the layer).")
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach().chunk(p, dim=0)[rank].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().chunk(p, dim=0)[rank].clone())

    def forward(self, x):
        x = CopyToTP.apply(x, self.group)              # f: nothing now, the all-reduce of dL/dX in backward
        return F.linear(x, self.weight, self.bias)     # X A_i + b_i: no communication


# %% [markdown]
# Check it against the `nn.Linear` it came from, on every rank: rank r's output is the r-th block of columns
# of the layer's output, each rank gets the gradient of its own columns, and after `f` every rank holds the
# *whole* gradient of `X`. A ledger inside each rank (`labutils.instruments.ledger.Ledger`) also lists what the
# layer communicated, forward and backward, against what Megatron's design needs (here: nothing forward, `f`'s
# all-reduce of dL/dX backward):

# %%
compare.report(POOL.run(verify.column_parallel, ColumnParallelLinear))

# %% [markdown]
# ### Exercise 2 — the source's `all_gather`, done right inside autograd
# Sometimes the next layer needs the whole `Y` on every rank (the source gathered a column-split result too).
# Write the autograd operator that all-gathers the column-parallel output along the last dimension: forward
# returns every rank's `Y_i` side by side, in rank order; backward returns *this rank's* columns of the
# incoming gradient (every rank holds the whole `dL/dY` already, and `f` in front of the layer sums `dL/dX`).
# The checker puts it behind your `ColumnParallelLinear` and compares with `nn.Linear` on the 3 gloo ranks of
# `CHECKERS`, gradients included, and checks the communication: forward one all-gather of Y, backward only the
# all-reduce of dL/dX that `f` makes (the gather's backward needs none).

# %% nbgrader={"grade": false, "grade_id": "gather_from_tp", "locked": false, "schema_version": 3, "solution": true}
class MyGatherFromTP(torch.autograd.Function):
    """All-gather y_shard along the last dim (rank order); backward: this rank's columns of the gradient."""

    @staticmethod
    def forward(ctx, y_shard, group):
        ### BEGIN SOLUTION
        from labutils.solutions import lab02 as solution  # the instructor's edition: the reference answer
        return solution.GatherFromTP.forward(ctx, y_shard, group)
        ### END SOLUTION

    @staticmethod
    def backward(ctx, grad):
        ### BEGIN SOLUTION
        from labutils.solutions import lab02 as solution  # the instructor's edition: the reference answer
        return solution.GatherFromTP.backward(ctx, grad)
        ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_gather_from_tp", "locked": true, "points": 3, "schema_version": 3, "solution": false}
check.gather_from_tp(MyGatherFromTP, ColumnParallelLinear, pool=CHECKERS)

# %% [markdown]
# ### The row-parallel layer
# The rows `B_i` of `B` are columns of the weight: `weight.chunk(p, dim=1)[rank]`. The layer's input is this
# rank's slice `X_i` of the features — exactly what the column layer left on the rank. The bias is whole on
# every rank and is added once, *after* the sum (before it, it would be counted p times):

# %%
class RowParallelLinear(nn.Module):
    """Z = Σ_i X_i B_i + b: this rank holds the rows of B that meet its slice X_i of the input features."""

    def __init__(self, linear: nn.Linear, group=None):
        super().__init__()
        rank, p = dist.get_rank(group), dist.get_world_size(group)
        if linear.in_features % p:
            raise ValueError(f"in_features = {linear.in_features} does not split into {p} equal shards. "
                             f"HINT: use a multiple of {p} (or pad the layer).")
        self.group = group
        self.weight = nn.Parameter(linear.weight.detach().chunk(p, dim=1)[rank].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x_shard):
        partial = F.linear(x_shard, self.weight)       # X_i B_i: this rank's term of the sum
        z = ReduceFromTP.apply(partial, self.group)    # g: the sum over ranks, on every rank
        return z if self.bias is None else z + self.bias


# %%
compare.report(POOL.run(verify.row_parallel, RowParallelLinear))

# %% [markdown]
# ### The MLP: one all-reduce forward, one backward
# Chained, the two layers need nothing between them: the column layer leaves `Y_i` on rank i, the row layer
# wants exactly `Y_i`. Built from a one-device `nn.Sequential(Linear, GELU, Linear)` and checked against it —
# output and every gradient, in float64 so that rounding cannot hide a bug — and by its communication: one
# all-reduce of tokens × hidden each way:

# %%
class TensorParallelMLP(nn.Module):
    """Megatron's MLP Z = GeLU(X A) B from a one-device nn.Sequential(Linear(h, f), GELU, Linear(f, h))."""

    def __init__(self, mlp: nn.Sequential, group=None):
        super().__init__()
        up, act, down = mlp
        self.up = ColumnParallelLinear(up, group)     # Y_i = GeLU(X A_i): stays on this rank
        self.act = act
        self.down = RowParallelLinear(down, group)    # Z = Σ_i Y_i B_i: the one all-reduce (g)

    def forward(self, x):
        return self.down(self.act(self.up(x)))


# %%
compare.report(POOL.run(verify.mlp, TensorParallelMLP))

# %% [markdown]
# **Predict:** on 2×H200, forward + backward of the MLP with hidden = 16384, 4096 tokens, bf16: what speedup
# does tensor parallelism give over one GPU?

# %%
my_prediction_speedup = None  # ✍ your number (2 would be perfect)

# %% tags=["nbval-ignore-output"]
HIDDENS = [512, 1024, 2048, 4096, 8192, 16384]
TOKENS = 4096


def measure_tp_mlp():
    n = 1 << (POOL.world_size.bit_length() - 1)   # a power of two, so that it divides every 4 x hidden
    rows = POOL.run(steps.tp_mlp_sweep, TensorParallelMLP, HIDDENS,
                    kwargs=dict(tokens=TOKENS, tp_size=n))[0]         # baseline: rank 0's own GPU
    return {"world_size": n, "rows": rows}


TP = recorded.live_or_recorded("02_tp_mlp", measure_tp_mlp, gpus_needed=2)
N_TP, TP_ROWS = TP.data["world_size"], TP.data["rows"]
TP_TOKENS = TP_ROWS[0]["tokens"]
FIT = allreduce_fit(SWEEP.data)                                      # section 2's all_reduce sweep
hs = [r["hidden"] for r in TP_ROWS]
speed = {m: [r[f"one_gpu_{m}_ms"] / r[f"tp_{m}_ms"] for r in TP_ROWS] for m in ("fwd", "train")}
model_fwd = [r["one_gpu_fwd_ms"] / cost_model.tp_step_ms(
    r["one_gpu_fwd_ms"], N_TP, cost_model.allreduce_ms(r["allreduce_bytes"], N_TP, FIT.alpha_us, FIT.beta_gbps))
    for r in TP_ROWS]
model_train = [r["one_gpu_train_ms"] / model_train_ms(r, N_TP, FIT) for r in TP_ROWS]
star = (hs[-1], my_prediction_speedup) if my_prediction_speedup else None


def plain_ticks(fig):
    """Hidden sizes as plain numbers on the log2 axis."""
    from matplotlib.ticker import ScalarFormatter
    fig.axes[0].xaxis.set_major_formatter(ScalarFormatter())
    return fig


plain_ticks(plots.line_plot(hs, {"measured, forward": speed["fwd"], "measured, forward + backward": speed["train"],
                                 "model, forward": model_fwd, "model, forward + backward": model_train},
                            xlabel="hidden size (ffn = 4 x hidden)", ylabel=f"speedup, {N_TP} GPUs vs 1", logx=True,
                            dashed=["model, forward", "model, forward + backward"], prediction=star,
                            hline=(1.0, "break-even"),
                            title=f"TP MLP, {TP_TOKENS} tokens, {TP_ROWS[0]['dtype']} — {TP.label}"))

# %% tags=["nbval-ignore-output"]
display(pd.DataFrame({"all-reduce size": [bandwidth.format_size(r["allreduce_bytes"]) for r in TP_ROWS],
                      "1 GPU fwd (ms)": [r["one_gpu_fwd_ms"] for r in TP_ROWS], "TP fwd (ms)": [r["tp_fwd_ms"] for r in TP_ROWS],
                      "speedup fwd": speed["fwd"], "model fwd": model_fwd,
                      "1 GPU fwd+bwd (ms)": [r["one_gpu_train_ms"] for r in TP_ROWS],
                      "TP fwd+bwd (ms)": [r["tp_train_ms"] for r in TP_ROWS],
                      "speedup fwd+bwd": speed["train"], "model fwd+bwd": model_train},
                     index=pd.Index(hs, name="hidden")).round(3))
print(f"all_reduce fit from section 2: {FIT}   (largest deviation {FIT.max_rel_err:.0%})")
claims.show(CLAIMS[("02_collectives", "02_tp_mlp")](SWEEP.data, TP.data), [SWEEP, TP])

# %% [markdown]
# **Reading it.** The cost model is `t_TP = t_1 / p + k · t_allreduce(tokens × hidden × 2 bytes)` with k = 1
# all-reduce per forward pass and 2 per forward + backward, `t_allreduce` from section 2's alpha–beta fit.
# Compute grows as hidden², the all-reduce only as hidden, so in the model wide layers approach the ideal
# speedup and narrow ones lose much or all of it to the all-reduce's fixed cost. The verdicts: "speeds up a
# wide MLP" needs at least half of the ideal extra speed (1.5 on 2 GPUs), "slows down a narrow one" a speedup
# below 1, and the model "predicts" a step if within a quarter — at every width measured. A wide layer's step
# is almost all t_1 / p, so there the whole step agrees with nearly any communication term; the model's
# communication term is therefore also judged on its own, against what the step takes beyond t_1 / p, at every
# width. The table below puts the terms side by side, with the forward all-reduce the profiler saw inside the
# step (the longest rank's kernel) and its transfer (the shortest rank's).

# %% tags=["nbval-ignore-output"]
terms = [model_terms(r, N_TP, FIT) for r in TP_ROWS]
display(pd.DataFrame({"t_1 / p (ms)": [t["compute_ms"] for t in terms],
                      "model: 2 all-reduces (ms)": [t["comm_ms"] for t in terms],
                      "measured: step - t_1 / p (ms)": [t["beyond_ms"] for t in terms],
                      "measured / model": [t["beyond_ms"] / t["comm_ms"] for t in terms],
                      "TP step (ms)": [t["measured_ms"] for t in terms],
                      "fwd all-reduce in the step (ms)": [r.get("allreduce_fwd_ms") for r in TP_ROWS],
                      "its transfer (ms)": [r.get("allreduce_fwd_kernel_ms") for r in TP_ROWS]},
                     index=pd.Index(hs, name="hidden")).round(3))
a, b = TP_ROWS[0], TP_ROWS[1]
print(f"[{TP.label}] hidden {a['hidden']} -> {b['hidden']}: "
      f"{(b['hidden'] * b['ffn_hidden']) / (a['hidden'] * a['ffn_hidden']):g}x the FLOPs; one GPU "
      f"{a['one_gpu_train_ms']:.3f} -> {b['one_gpu_train_ms']:.3f} ms, TP step {a['tp_train_ms']:.3f} -> "
      f"{b['tp_train_ms']:.3f} ms ({b['tp_train_ms'] / a['tp_train_ms']:.2f}x)")

# %% [markdown]
# **Where the model fails, and why.** The model counts GPU time only: each halved matmul lasting exactly half
# the one-GPU time, and each all-reduce lasting what a standalone all-reduce of its size lasts. Read the table
# against those two assumptions:
# * where the one-GPU step and the TP step barely change while the work grows several-fold (the printed line
#   compares the two narrowest widths), neither is paced by the GPU's work but by a fixed cost per step: the
#   host's Python, autograd and kernel launches. Such a floor does not divide by p, so t_1 / p is wrong there
#   before any communication is counted, and the TP step's floor is higher than one GPU's: it also issues the
#   NCCL calls and runs the autograd Functions `f` and `g`. The model has no term for either, so it is off by
#   that floor, however right the all-reduce's alpha–beta fit;
# * where the forward all-reduce inside the step lasts much longer than its transfer, the difference is the
#   first rank's GPU waiting inside the kernel for the other rank to arrive — again host time, seen on the
#   device (the next subsection measures it call by call);
# * where both hold little and `step − t_1 / p` still exceeds the all-reduces, the halved matmuls do not run at
#   half the time: smaller matrices keep the GPU less busy than the whole.
#
# That is why tensor parallelism is used within a node (NVLink) and for layers wide enough that compute hides
# these fixed costs, and why later Megatron-LM versions split each all-reduce into a reduce-scatter and an
# all-gather (sequence parallelism, lab 09) and overlap them with the matmuls.
#
# ### What an all-reduce costs inside a step
# The measurement also profiled a few TP steps (`torch.profiler`) and kept, on every rank, the device time of
# each NCCL all-reduce kernel. Call i is the same all-reduce on every rank; its kernel starts when *its* rank's
# GPU gets there and ends when the data of every rank has arrived. The rank that arrives first therefore spins
# inside the kernel until the last one comes: the longest of the ranks' kernel times is what the call cost the
# step, the shortest is the transfer itself: the device work that a standalone benchmark of the same
# all-reduce times too (a benchmark's time per call can carry the host's cost of issuing the call as well).
#
# ### Exercise 3 — transfer and wait, from every rank's kernel times
# Write `my_transfer_and_wait(calls_ms)`: `calls_ms[rank][i]` is the kernel time (ms) of call i on that rank.
# Return `(transfer_ms, wait_ms)`: per call, the transfer is the shortest time over the ranks and the wait the
# longest minus the shortest; return the median of each over the calls.

# %% nbgrader={"grade": false, "grade_id": "transfer_and_wait", "locked": false, "schema_version": 3, "solution": true}
def my_transfer_and_wait(calls_ms):
    ### BEGIN SOLUTION
    from labutils.solutions import lab02 as solution  # the instructor's edition: the reference answer
    return solution.transfer_and_wait(calls_ms)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_transfer_and_wait", "locked": true, "points": 2, "schema_version": 3, "solution": false}
check.transfer_and_wait(my_transfer_and_wait)

# %% tags=["nbval-ignore-output"]
transfer_and_wait = check.usable_transfer_and_wait(my_transfer_and_wait)   # None while not attempted
WITH_CALLS = [r for r in TP_ROWS if r.get("allreduce_fwd_calls_ms")]
if WITH_CALLS and transfer_and_wait is None:
    print(f"[{TP.label}] the split of each call into transfer and wait needs your transfer_and_wait above.")
elif WITH_CALLS:
    split = [transfer_and_wait(r["allreduce_fwd_calls_ms"]) for r in WITH_CALLS]
    display(pd.DataFrame({"all-reduce size": [bandwidth.format_size(r["allreduce_bytes"]) for r in WITH_CALLS],
                          "in the step (µs)": [1e3 * r["allreduce_fwd_ms"] for r in WITH_CALLS],
                          "transfer (µs)": [1e3 * t for t, _ in split],
                          "wait for the slower rank (µs)": [1e3 * w for _, w in split],
                          "standalone fit (µs)": [1e3 * FIT.predict_ms(r["allreduce_bytes"]) for r in WITH_CALLS],
                          "whole TP fwd step (µs)": [1e3 * r["tp_fwd_ms"] for r in WITH_CALLS],
                          "fits inside the step": [fits_its_step(r) for r in WITH_CALLS]},
                         index=pd.Index([r["hidden"] for r in WITH_CALLS], name="hidden")).round(1))
    display(plots.time_plot([r["allreduce_bytes"] for r in WITH_CALLS],
                            {"in the step (the longest kernel)": [r["allreduce_fwd_ms"] for r in WITH_CALLS],
                             "transfer (the shortest kernel)": [t for t, _ in split],
                             "predicted from section 2's fit": [FIT.predict_ms(r["allreduce_bytes"]) for r in WITH_CALLS]},
                            title=f"the MLP's forward all-reduce — {TP.label}"))
else:
    print(f"[{TP.label}] this recording has no per-call kernel times; they are measured live on 2 or more GPUs.")

# %% [markdown]
# The transfer inside the step is the same work as in section 2's sweep, so the fit should predict it; the
# verdict in the cell before the exercise judges that at the largest size, where fixed costs matter least
# (within a quarter). At small sizes read the two columns knowing that the fit's α includes the host's cost of
# issuing a call, which a kernel's own device time does not. What a step adds is the wait: the ranks' matmuls
# and their hosts do not finish at the same instant, and whichever rank is early waits inside the collective —
# the partition effect of section 4 on a small scale. Where the hosts set the pace (a short step, in which the
# host's work of issuing the kernels outlasts the GPU's work), the wait is the gap between the two hosts: the
# GPU of the rank whose host issues the all-reduce sooner finishes its short matmuls, enters the kernel and
# spins there until the other host has issued its own — and in a short step that gap can be most of the step,
# whatever the bytes. In a wide layer the GPUs set the pace, both hosts are ahead of their GPUs, and what is
# left of the wait is the difference between the ranks' matmuls. A model of a step built from standalone
# benchmarks must add the wait (or the ranks must be kept in lockstep).
#
# How the profiler is kept from adding to the wait it measures: it records only the GPU's activity
# (`ProfilerActivity.CUDA`). Recording every operator on the host as well adds host work to each step, and in
# a short step whose pace the hosts set (the narrow layers) that lets the ranks drift further apart than they
# do unprofiled. Its first step is a warm-up whose kernels are dropped (`torch.profiler.schedule` with
# `warmup=1`): starting the profiler takes each rank its own time, which the rank that starts sooner would
# spend waiting inside its first all-reduce. Kept calls are summarised by medians, over calls, of the longest
# and the shortest kernel (`steps.split_calls`). And the verdict "an all-reduce can cost well beyond its
# transfer", printed with the TP sweep above ("well beyond": the in-step time at least a quarter above the
# transfer, at the size where it is furthest above), is judged only at the hidden sizes whose in-step time
# fits inside the whole forward step timed without the profiler (the table's last column, `fits_its_step`):
# a longer one can only have been lengthened by the profiling itself.
#
# These per-call times are recorded for the capstone (lab 06), which predicts them from its own fits:
# `measured_ms` is the time in the step (the wait included), `kernel_ms` the transfer.

# %% tags=["nbval-ignore-output"]
SUMMARY = recorded.live_or_recorded("02_comm_summary", lambda: cost_model.comm_summary(TP_ROWS, N_TP), gpus_needed=2)
pd.DataFrame(SUMMARY.data["ops"]).set_index("what")

# %% [markdown]
# ### The one-GPU baseline
# Every speedup above is measured against the whole MLP on one GPU, and that baseline needs one GPU only:
# `one_gpu.mlp_baseline` times it, forward and forward + backward, at every hidden size of the sweep, and turns
# each time into the TFLOP/s it sustains (`cost_model.mlp_flops`: `2 matmuls × 2 × tokens × h × 4h` forward,
# three times that with backward). The explorer below models a layer with *one* sustained rate; the verdicts
# say whether the GPU keeps one: a wide layer's time should grow as its FLOPs, and a narrow one, whose matmuls
# are too small to fill the GPU, runs at a lower rate.

# %% tags=["nbval-ignore-output"]
BASE = recorded.live_or_recorded("02_mlp_one_gpu", lambda: one_gpu.mlp_baseline(HIDDENS, tokens=TOKENS),
                                 gpus_needed=1)
display(pd.DataFrame(BASE.data["rows"]).set_index("hidden").round(2))
print(f"[{BASE.label}] {BASE.data['tokens']} tokens, {BASE.data['dtype']}")
claims.show(CLAIMS["02_mlp_one_gpu"](BASE.data), BASE)

# %% [markdown]
# Where the second verdict is FALSE, the narrow layers' steps are not set by their FLOPs: their matmuls are too
# small to fill the GPU's SMs, and the fixed cost of launching each kernel and running autograd weighs as much as
# the arithmetic. The explorer's single rate is the widest layer's, so for narrow layers it makes one GPU look
# faster than it is; its "fixed overhead per step" knob is where that fixed cost goes.

# %% [markdown]
# ### Explorer: when does tensor parallelism pay?
# The model of section 5 with your knobs: tokens per step, number of GPUs (the all-reduce is extrapolated from
# the 2-GPU fit with the ring model — optimistic beyond one NVLink pair), the GPU's sustained TFLOP/s (starts
# at the rate the one-GPU baseline above sustained at its widest, forward + backward) and a fixed per-step
# overhead. Dots: the measurements.

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets

big = BASE.data["rows"][-1]
MEASURED_TFLOPS = big["train_tflops"]
print(f"the TFLOP/s slider starts at {MEASURED_TFLOPS:.0f}: the one-GPU MLP at hidden {big['hidden']}, "
      f"forward + backward [{BASE.label}]; the dots are {TP.label}")


def explore(tokens, world_size, tflops, overhead_us, train):
    grid = [2**k for k in range(7, 16)]
    pred = [cost_model.speedup_model(h, tokens, world_size, tflops, FIT.alpha_us, FIT.beta_gbps,
                                     overhead_us=overhead_us, train=train) for h in grid]
    fig = plots.line_plot(grid, {"model": pred}, xlabel="hidden size", ylabel=f"speedup, {world_size} GPUs vs 1",
                          logx=True, dashed=["model"], hline=(1.0, "break-even"),
                          title=f"{tokens} tokens, {tflops:.0f} TFLOP/s, {'fwd+bwd' if train else 'fwd'}")
    if world_size == N_TP and tokens == TP_TOKENS:
        fig.axes[0].plot(hs, speed["train" if train else "fwd"], "ko", label=f"measured ({TP.label})")
        fig.axes[0].legend(fontsize=8)
    display(plain_ticks(fig))


WIDE = {"style": {"description_width": "initial"}, "layout": widgets.Layout(width="460px")}
widgets.interact(explore,
                 tokens=widgets.SelectionSlider(options=sorted({2**k for k in range(8, 16)} | {TP_TOKENS}),
                                                value=TP_TOKENS, description="tokens per step", **WIDE),
                 world_size=widgets.IntSlider(value=2, min=2, max=8, description="GPUs", **WIDE),
                 tflops=widgets.FloatSlider(value=round(MEASURED_TFLOPS), min=50, max=1000, step=10,
                                            description="sustained TFLOP/s", **WIDE),
                 overhead_us=widgets.FloatSlider(value=20.0, min=0.0, max=200.0, step=5.0,
                                                 description="fixed overhead per step (µs)", **WIDE),
                 train=widgets.Checkbox(value=True, description="forward + backward", **WIDE));

# %% [markdown]
# ## 6 · Summary
#
# Every verdict of this lab, from the runs above; the source column says, row by row, whether its numbers
# were measured live or come from a recording (which machine, which date):

# %% tags=["nbval-ignore-output"]
claims.table(claims.judge(CLAIMS, AS_WRITTEN, SWEEP, OBJ, PART, (SWEEP, TP), BASE))

# %% [markdown]
# **Take-aways.** Put tensors where the backend moves them; make every rank agree on the data and the sizes;
# never use a fixed port; gather into one tensor; never pickle tensors through object collectives; balance
# before you pad; and split *weights*, not just data — Megatron's MLP needs one all-reduce forward and one
# backward, carried by two small autograd operators, and pays when the layer is wide enough for compute to
# dwarf them. A collective's busbw depends on NCCL's kernel and its channel count as well as on the link; inside
# a step, its time also carries the wait for the slowest rank.
#
# **Next:** lab 03 — asynchronous point-to-point (`isend`/`irecv`): the source's second program, what really
# happens when it runs, and what overlap really buys.

# %%
if GLOO is not POOL:
    GLOO.close()
CHECKERS.close()
POOL.close()
