# %% [markdown]
# # 00 · Setup: your machine, your first ranks, what joins the GPUs, your first bandwidth curve
#
# **Objectives**
# 1. Know which of the course's three hardware modes your machine is in.
# 2. Know the words (rank, world size, process group, backend, collective), launch ranks from a notebook cell with
#    `labutils.launch`, get their results back, and read their errors and hangs.
# 3. Know what joins two GPUs (NVLink, NVSwitch, PCIe) and what each quoted peak means; measure copy bandwidth
#    (host↔GPU, on a GPU, GPU→GPU) over message sizes and judge the copies against the peaks; write the course's
#    timing loop yourself and fit the alpha–beta model yourself.
#
# **GPUs needed for the live path:** 2 (GPU→GPU); 1 GPU runs the host↔GPU part live; CPU-only runs everything
# else and shows the GPU numbers recorded on 2×H200.
# **Time:** 55 min of study (two exercises: a timing loop, an alpha–beta fit; two predictions); under 45 s to run
# on 2×H200, under 90 s on a 2-core CPU.

# %% [markdown]
# ## Setup
# The first cell describes the machine. Its output depends on the hardware, so the course's tests ignore it;
# the last line, the *fingerprint*, is stamped on every recorded result.

# %% tags=["nbval-ignore-output"]
import math
import statistics
import time

import pandas as pd
import torch
import torch.distributed as dist

import labutils
from labutils import bandwidth, claims, config, hw, plots, procs, recorded, timing
from labutils.labs.lab00_setup import claims as lab_claims
from labutils.labs.lab00_setup import measure, picture
from labutils.checks import is_standin
from labutils.checks import lab00 as check

pd.set_option("display.max_colwidth", None)   # tables show whole sentences
HW = hw.describe()
MODE = HW.mode
BACKEND = "nccl" if MODE == "multi-gpu" else "gloo"
labutils.default_config()
HW

# %% [markdown]
# ## 1 · Three hardware modes
#
# | mode | what you have | what the labs do |
# |---|---|---|
# | `multi-gpu` | ≥ 2 CUDA GPUs | one rank per GPU over **NCCL**; every measurement is live |
# | `single-gpu` | 1 GPU | single-device parts live; ranks run on CPU tensors over **gloo**; GPU-to-GPU numbers are the recorded 2×H200 ones |
# | `cpu` | no GPU | ranks over **gloo** check every algorithm; every measurement is recorded, and labelled so |
#
# Recorded results are produced by the labs' own code on 2×H200 and carry the fingerprint of that machine;
# a cell that shows them prints **RECORDED** and the fingerprint. Nothing recorded is ever shown as yours.

# %% tags=["nbval-ignore-output"]
print(f"This machine is in mode {MODE!r}: {len(HW.gpus)} GPU(s); ranks will use backend {BACKEND!r}.")
if MODE != "multi-gpu":
    print("GPU-to-GPU measurements below are RECORDED on the reference machine, not measured here.")

# %% [markdown]
# ## 2 · Your first ranks
#
# ### The words, and a picture
# * A **rank** is one process of a distributed program, numbered `0 … world_size - 1`; on a GPU machine each
#   rank usually drives one GPU (rank r uses `cuda:r`). `dist.get_rank()` says which one a process is.
# * The **world size** is how many ranks there are (`dist.get_world_size()`).
# * A **process group** is a set of ranks that communicate together; `dist.init_process_group` makes the
#   default one, the *world*, of all ranks. Smaller groups (`dist.new_group`) come in later labs.
# * The **backend** is the library that moves the bytes for a group. **NCCL** (NVIDIA's collective library)
#   moves GPU tensors between GPUs over NVLink, PCIe or the network, with kernels on the GPUs; it is the backend
#   whenever the ranks' tensors are on CUDA GPUs. **gloo** (from Meta) moves CPU tensors over sockets, with CPU
#   threads; it is the backend on a machine without GPUs, and it is what this course uses on a CPU-only
#   machine or where there is a single GPU, so that every algorithm still runs.
# * A **collective** is an operation that every rank of the group calls, and that completes only once all have:
#   `all_reduce`, `all_gather`, `reduce_scatter`, `broadcast`, `all_to_all`, `barrier`. A rank that never
#   calls it leaves the others waiting (section 2 shows what that looks like). Point-to-point `send`/`recv`
#   involve two ranks only (lab 03).
# * **`all_reduce`** combines one tensor from every rank (sum, by default) and leaves the result on every rank.
#   The picture: 4 ranks, rank r holding `t = [r + 1]`, before and after `dist.all_reduce(t)`:

# %% tags=["nbval-ignore-output"]
picture.all_reduce_picture(world_size=4)   # a drawing: its pixels depend on the fonts installed

# %% [markdown]
# `labutils.launch(fn, *args)` runs `fn(rank, world_size, *args)` in `world_size` fresh processes with
# `torch.distributed` initialised (NCCL with one GPU per rank when there are enough GPUs, else gloo on CPU),
# and returns what each rank returned, in rank order. The function can be defined right here in a cell.
#
# **Predict:** each rank contributes `rank + 1` to an `all_reduce` (sum). With 2 ranks, what does every rank hold afterwards?

# %%
my_prediction_sum = None  # ✍ your number

# %% [markdown]
# Each rank says where it ran (that depends on the machine, so this cell's output is not checked); the
# next cell checks what came back.

# %% tags=["nbval-ignore-output"]
def hello(rank, world_size):
    device = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(t)                      # every rank ends with the same sum
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"rank {rank} of {world_size} on {device} ({name}), backend {dist.get_backend()}: "
          f"all_reduce gives {t.item():g}")
    return t                                # CUDA tensors come back as CPU tensors


t0 = time.perf_counter()
results = labutils.launch(hello, world_size=2, backend=BACKEND)
launch_s = time.perf_counter() - t0

# %%
expected = sum(r + 1 for r in range(2))
print("results:", [r.item() for r in results], "| every rank holds", expected, ":",
      all(r.item() == expected for r in results))
check.prediction_sum(my_prediction_sum, world_size=2)

# %% [markdown]
# ### What a launch costs
# The function above does one `all_reduce` of one number. Everything else a launch does is the same whatever
# the function: start fresh interpreters, import torch, create the process group (and, on GPUs, a CUDA
# context and the NCCL communicator), then tear it all down. A persistent `labutils.RankPool` pays this once and
# then runs each call on the same ranks, with nothing to start: lab 02 introduces it where it first needs it, and
# lab 07 looks inside it (its round trip, the `%%ranks` magic, what happens when a rank fails).

# %% tags=["nbval-ignore-output"]
print(f"one launch of hello on {BACKEND}: {launch_s:.2f} s of wall time, from start-up to clean-up")

# %% [markdown]
# ### When a rank fails
# An exception in any rank raises `labutils.RankError` in the notebook, naming the rank and carrying its
# traceback; the other ranks are stopped at once, not after the timeout. This and the next example run on
# gloo on every machine: what they show does not depend on the backend (lab 05 shows NCCL's own ways of
# failing), and gloo ranks start without CUDA or NCCL.

# %% tags=["raises-exception"]
def fails_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 has a bug")
    dist.barrier()            # rank 0 would wait here forever: labutils stops it


t0 = time.perf_counter()
try:
    labutils.launch(fails_on_rank_1, world_size=2, backend="gloo")
finally:
    gloo_launch_s = time.perf_counter() - t0   # start-up of 2 gloo ranks, the failure, the clean-up

# %% [markdown]
# ### When ranks hang
# A collective that not every rank calls never returns. `timeout=` bounds the wait: the ranks are killed and
# `labutils.RankTimeout` names those that had not finished, and where each one was. The timeout counts from
# the launch, start-up included, so it is set from the gloo launch above: its wall time rounded up to a whole
# second, plus two seconds of waiting. (Lab 05 is all about reading such failures.)

# %% tags=["raises-exception", "nbval-ignore-output"]
def never_arrives(rank, world_size):
    if rank == 0:
        dist.barrier()        # waits for rank 1 ...
    else:
        time.sleep(3600)      # ... which never arrives


labutils.launch(never_arrives, world_size=2, backend="gloo", timeout=math.ceil(gloo_launch_s) + 2)

# %% [markdown]
# Nothing is left behind: the ranks are gone (this check is the same on every machine).

# %%
print("rank processes still alive:", len(procs.leftover_ranks()))

# %% [markdown]
# ## 3 · What joins the GPUs
#
# `nvidia-smi topo -m` prints a matrix with one code per GPU pair. `NV#` means that the path between the two GPUs
# traverses a bonded set of `#` NVLinks; it does not say where those links end. Two designs give the same code:
# links wired from one GPU straight to the other, or every link of every GPU wired to **NVSwitch** chips, which
# connect each GPU to all the others (the 8-GPU HGX boards of H100 and H200 are built this way). The driver knows which:
# NVML reports the device at the far end of each link, `GPU` or `SWITCH`, and `hw.describe()` shows it. The other
# codes, `PIX`/`PXB`/`PHB`/`NODE`/`SYS`, are PCIe paths, through one or more PCIe switches, the CPU's host bridge,
# or across CPU sockets; a copy over them is bounded by the PCIe link (section 4 measures one: host→GPU).
#
# **Two peaks, and which one to compare with.** `nvidia-smi nvlink -s` prints each link's *line rate*: the raw
# signalling rate of one direction, coding overhead included (the table below shows it, per link and summed).
# The datasheet gives the *data rate*: 25 GB/s per direction per NVLink 4 link, 50 GB/s both ways. <!-- not measured: NVIDIA H100/H200 datasheet -->
# Its "900 GB/s" is 18 links × 50 GB/s, both directions added: 450 GB/s per direction. <!-- not measured: datasheet arithmetic -->
# The line rate counts coding bits as well, so a link's line rate sits above its data rate.
# labutils keeps both, per GPU and direction: `HW.link_peak_gbps` sums nvidia-smi's line rates (a ceiling no
# payload reaches; the later labs' plots draw it as "NVLink line rate" or "NVLink peak") and
# `HW.link_data_peak_gbps` multiplies the links by the datasheet rate of the NVLink version NVML reports (the
# ceiling a copy can approach). A measured copy is judged against the data rate.

# %% tags=["nbval-ignore-output"]
if MODE == "multi-gpu":
    TOPO, TOPO_LABEL, TOPO_SOURCE = measure.topology(HW), f"live: {HW.fingerprint().split(' | ')[0]}", recorded.live_source()
else:
    _ref = recorded.load("00_copy_bandwidth")
    TOPO, TOPO_LABEL, TOPO_SOURCE = _ref.data.get("topology") or {}, _ref.label, _ref.source
    print(f"No GPU pair on this machine: the table shows the topology recorded on {_ref.fingerprint}.")
pd.DataFrame({TOPO_LABEL: measure.topology_rows(TOPO)}) if TOPO else print("(this recording has no topology)")

# %% [markdown]
# The common reading of `NV18`, "the two GPUs are wired to each other by 18 NVLinks", is answered by the
# table's row *where they end (NVML)*: the links run directly to GPU 1 only if they all end at a `GPU`.
# Where they end at NVSwitch chips, every byte for GPU 1
# crosses a switch, and the same links reach every other GPU on the board: a switched board is built so that
# each GPU reaches each other one through all of its links. Where they end at the other GPU, they are wired
# to that pair alone.
#
# ## 4 · Copy bandwidth and the alpha–beta model
#
# Moving S bytes costs a fixed latency α (launch, synchronisation, protocol set-up) plus S/β at the link's
# bandwidth β (Hockney's model):
#
# $$t(S) = \alpha + \frac{S}{\beta}, \qquad \text{bandwidth}(S) = \frac{S}{t(S)} \xrightarrow{S\to\infty} \beta .$$
#
# Small messages are latency-bound, large ones bandwidth-bound; the crossover $n_{1/2} = \alpha\beta$ is the size
# that reaches half of β. We sweep 4 KiB … 1 GiB for copies host→GPU (pinned and pageable memory), GPU→host,
# within one GPU, and GPU0→GPU1, and fit α and β by least squares on the *relative* error
# (`bandwidth.fit_alpha_beta`), so that every size counts alike.
#
# How a sample is taken decides what α holds. Each sample is a pair of CUDA events around one `copy_` call,
# the samples back to back (`timing.benchmark`). When the copy is shorter than the host's work to issue it
# (Python, PyTorch's dispatch, the CUDA call), the GPU finishes early and waits for the host's next call: the
# time per copy is then the host's cost, whatever the size. When the copy is longer, the host runs ahead and
# the GPU's queue sets the pace: the time is the copy's own. (A copy from pageable memory holds the host until
# the driver has staged its bytes, so there the host cannot run far ahead.)
#
# **Predict** the GPU0→GPU1 bandwidth of a 1 GiB copy on the reference machine, in GB/s (the table above gives
# the link's two ceilings):

# %%
my_prediction_gbps = None  # ✍ your number, GB/s, for a 1 GiB copy cuda:0 -> cuda:1

# %% tags=["nbval-ignore-output"]
SIZES = [2**k for k in range(12, 31, 2)]        # 4 KiB ... 1 GiB
local = recorded.live_or_recorded("00_copy_local", lambda: measure.measure_local(SIZES), gpus_needed=1)
peer = recorded.live_or_recorded("00_copy_bandwidth", lambda: measure.measure_peer(SIZES, HW), gpus_needed=2)

# %% tags=["nbval-ignore-output"]
series = {**local.data["gbps"], **peer.data["gbps"]}
fit_p2p = bandwidth.AlphaBeta(**peer.data["fits"]["cuda:0 -> cuda:1"])
fit_h2d = bandwidth.AlphaBeta(**local.data["fits"]["H2D pinned"])
PEAKS = peer.data.get("topology") or {}
plots.bandwidth_plot(
    local.data["size_bytes"], series, fits={"cuda:0 -> cuda:1": fit_p2p, "H2D pinned": fit_h2d},
    peak_gbps=PEAKS.get("link_peak_gbps"), peak_label="NVLink line rate",
    peaks={"NVLink data rate": PEAKS.get("link_data_peak_gbps"), "PCIe ceiling": PEAKS.get("pcie_peak_gbps")},
    prediction=None if my_prediction_gbps is None else (2**30, my_prediction_gbps),
    title=f"copy bandwidth [{plots.source_label(local, peer)}]", logy=True)

# %% tags=["nbval-ignore-output"]
pd.DataFrame([{"copy": kind, "alpha (us)": f["alpha_us"], "beta (GB/s)": f["beta_gbps"],
               "n1/2": bandwidth.format_size(bandwidth.AlphaBeta(**f).half_bw_bytes),
               "1 GiB (GB/s)": m.data["gbps"][kind][-1], "fit within": f"{f['max_rel_err']:.0%}", "source": m.label}
              for m, kinds in ((local, measure.LOCAL_KINDS), (peer, measure.PEER_KINDS))
              for kind in kinds for f in [m.data["fits"][kind]]]).round(1)

# %% [markdown]
# **The verdicts.** Each line below is computed from the two sweeps through the threshold it prints:
# * *orders of magnitude*: one order of magnitude is a factor of 10, so "one to two orders slower" needs at least 10;
# * *most of the data rate*: NVLink carries data in packets with headers, and a copy engine keeps a limited number of
#   requests in flight; a copy within 20% of the data rate (≥ 0.8) has nothing else standing in its way;
# * *the model fits*: two numbers for sizes spanning more than five decades (4 KiB to 1 GiB); within 25% at
#   every size means no regime it misses;
# * *pinned vs pageable*: pageable memory is first copied into a pinned bounce buffer by the driver; a gain of at
#   least 1.5 is what makes pinning worth its cost (pinned memory cannot be swapped out);
# * *bandwidth-bound*: a claim about what a link carries is judged at every size where the copies are
#   bandwidth-bound by their own fit, $S \ge 8\,n_{1/2}$ (there the model puts at most a ninth of the time in α);
#   a claim stated without a size, at every size measured;
# * *both directions, one at a time*: a symmetric link copies GPU0→GPU1 and GPU1→GPU0 equally fast; the rule
#   allows 10% between them for run-to-run noise (an allowance, not a measurement of the noise). Each direction here is timed *alone*, so this tests symmetry only: whether the link
#   carries both directions *at the same time* (full duplex) needs both copies at once — the two-way sweep after
#   these verdicts;
# * *the prediction*: fitted on every other size, the model should predict the size it left out (256 MiB,
#   inside the range) within 10%.
#
# Each line ends with its source. On one GPU the host -> GPU sweep is live and the GPU -> GPU one recorded: the
# first verdict divides one by the other, so its source is `MIXED` and names where each of its two numbers came from.

# %% tags=["nbval-ignore-output"]
claims.show(lab_claims.copy_verdicts(local.data, peer.data, sources=(local, peer)))

# %% [markdown]
# **Both directions at once.** Full duplex means that each direction has its own wires, so GPU0→GPU1 and
# GPU1→GPU0 copied at the same time each keep the speed of a copy alone (the datasheet's "both directions"
# figure adds the two). The sweep below copies one way, the other way, and both at once (each direction on its
# own pair of streams, so that PyTorch does not order the two copies), timed like nccl-tests times: a host clock
# read after synchronizing both GPUs, around back-to-back copies. The verdict divides the slower one-way time by
# the time of one copy each way at once: full duplex gives about 1, one shared direction about a half; 0.9 is
# the same run-to-run allowance as above. It is judged where the one-way copies are bandwidth-bound.

# %% tags=["nbval-ignore-output"]
bidir = recorded.live_or_none("00_copy_bidirectional", lambda: measure.measure_bidirectional(SIZES), gpus_needed=2,
                              shows="GPU0 -> GPU1 and GPU1 -> GPU0 copied alone and both at once, from 4 KiB to "
                                    "1 GiB, and whether each direction keeps its one-way speed when both run.")
if bidir is not None:
    claims.show(lab_claims.duplex_verdicts(bidir.data), bidir)
    display(plots.bandwidth_plot(bidir.data["size_bytes"], bidir.data["gbps"],
                                 peaks={"NVLink data rate": PEAKS.get("link_data_peak_gbps")},
                                 title=f"GPU pair, one way and both ways at once (per direction) [{bidir.label}]",
                                 logy=True))

# %% [markdown]
# **What the curves say**
# * Below $n_{1/2}$ more than half of a copy's time is α; far below it the time hardly changes with size, so
#   bandwidth grows in proportion to S. Sending many small messages wastes the link — lab 01 tests this claim
#   of the source.
# * Above $n_{1/2}$ the curves flatten. The model *adds* α to S/β, but α is mostly the host's cost of issuing
#   a copy (see how a sample is taken, above), and a large copy does not pay it on top of its transfer: the
#   host issues the next copy while the GPU still copies. So in the middle of the range the measured times lie
#   below the straight line, and the fit answers with a slope that is too shallow — a β above the bandwidth the
#   largest copies reach. Compare the table's "beta" with its "1 GiB" column: where β is higher, this is why,
#   and it is also why the fit's prediction of a large copy comes out short. Lab 06 splits α into the host's
#   launch and the device's own latency.
# * GPU→GPU over NVLink is faster than host↔GPU over PCIe by the factor the first verdict prints: the ratio of
#   what the two links deliver. When both copies come near their link's ceiling, it is close to the ratio of
#   the two ceilings in the topology table (NVLink data rate, PCIe host link) — that ratio, not a rule of
#   thumb, decides whether "one to two orders of magnitude", often quoted for PCIe paths, holds.
# * Pageable host memory is slower than pinned: the driver first copies it into a pinned bounce buffer.
# * A copy within one GPU reads and writes every byte of GPU memory: its memory traffic is twice the bandwidth shown.
#
# ## 5 · Exercise: your timing loop
#
# Every number in this course comes from one loop. You write it now; `labutils.timing` is the same loop, with
# more around it. `time_collective(op, clock, *, warmup, iters, repeat)` is called by **every rank**, each with its
# own `op` (a function that issues one collective, or any work) and returns, on every rank, **the slowest rank's
# median time of one call, in ms**:
#
# 1. **Warm up:** call `op()` `warmup` times, untimed. First calls pay what later calls do not: NCCL builds its
#    communicator and starts its proxy thread on the first collective, the allocator and caches fill.
# 2. **Sample** `repeat` times: `dist.barrier()` so the ranks start together, `start = clock.mark()`, call `op()`
#    `iters` times back to back, `stop = clock.mark()`, `clock.synchronize()`, then
#    `clock.elapsed_ms(start, stop) / iters`. One pair of marks around many calls, because a pair costs about as
#    much as a short call, and back to back, because that is how a training step issues them.
# 3. **The slowest rank:** each rank has its own samples; a collective is done only when its last rank is. Put
#    the samples in a tensor on `clock.device` and `dist.all_reduce(t, op=dist.ReduceOp.MAX)`: sample by sample,
#    the slowest rank's.
# 4. **The median** of those samples (`statistics.median`): one slow sample (a noisy neighbour, a clock change)
#    moves a mean, not a median.
#
# **The clock.** `clock` is a `timing.Clock(device)`: on a GPU, `clock.mark()` records a CUDA event on the current
# stream (`e = torch.cuda.Event(enable_timing=True); e.record()`), `clock.synchronize()` is
# `torch.cuda.synchronize()` (the host waits until the GPU has passed every event) and `clock.elapsed_ms(a, b)` is
# `a.elapsed_time(b)`, the GPU's own time between the two events — reading it before the synchronize is an error,
# since the host runs ahead of the GPU. On a CPU rank there are no events: `mark()` reads `time.perf_counter()`
# and `synchronize()` does nothing. Your loop takes the clock as an argument, so the same code times GPU ranks
# over NCCL and CPU ranks over gloo.
#
# The checker runs your loop on 3 gloo ranks whose calls take a different time on each rank (the first calls
# longer, one sample slower on every rank), with a clock that logs every mark, synchronize and read. It checks
# what was timed (warm-up outside the samples, `iters` calls per sample, read after a synchronize), the answer
# (the slowest rank's median of those very marks, not rank 0's, not a mean), that a collective combined the
# ranks, and that `labutils.timing.benchmark_collective` measures the same work alike.

# %% nbgrader={"grade": false, "grade_id": "time_collective", "locked": false, "schema_version": 3, "solution": true}
def time_collective(op, clock, *, warmup, iters, repeat):
    """Every rank calls it; returns the slowest rank's median time of one op() call, in ms."""
    # ✍ your code here: warm-up, `repeat` samples of `iters` calls between two clock marks (synchronize before
    #    reading), ms per call, the slowest rank sample by sample (all_reduce MAX), the median
    ### BEGIN SOLUTION
    from labutils.solutions import lab00 as solution  # the instructor's edition: the reference answer
    return solution.time_collective(op, clock, warmup=warmup, iters=iters, repeat=repeat)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_time_collective", "locked": true, "points": 3, "schema_version": 3, "solution": false}
check.time_collective(time_collective)

# %% [markdown]
# **Use it.** Your loop (or, until you write it, `labutils.timing`'s, and the cell says so) times an `all_reduce` on
# this machine's ranks — NCCL and CUDA events on 2 GPUs, gloo and the host clock otherwise — next to
# `timing.benchmark_collective` on the same op. These are live numbers of this machine.

# %% tags=["nbval-ignore-output"]
def compare_timers(rank, world_size, my_timer, size_bytes):
    device = config.rank_device()
    t = torch.ones(size_bytes // 4, device=device)
    op = lambda: dist.all_reduce(t)  # noqa: E731
    mine = my_timer(op, timing.Clock(device), warmup=5, iters=20, repeat=5)
    return mine, timing.benchmark_collective(op, warmup=5, iters=20, repeat=5)


TIMED_BYTES = 16 * 2**20 if BACKEND == "nccl" else 2**20
timer = check.usable_timer(time_collective)
mine_ms, lib = labutils.launch(compare_timers, timer, TIMED_BYTES, world_size=2, backend=BACKEND, output="quiet")[0]
print(f"all_reduce of {bandwidth.format_size(TIMED_BYTES)} on 2 {BACKEND} ranks (live: {HW.fingerprint()})")
print(f"  {'the stand-in' if is_standin(timer) else 'your loop'}:{mine_ms * 1e3:>28.1f} us")
print(f"  timing.benchmark_collective:     {lib.median_us:9.1f} us  ({lib})")
print(f"  its samples (ms): {[round(x, 4) for x in lib.samples_ms]}; spread (p90 - p10) / median = {lib.spread:.2f}")

# %% [markdown]
# **`labutils.timing`: the same, plus what it adds.** `benchmark_collective` is the loop you wrote. Around it:
# * it returns a `Timing` — every sample, the median, min/max, p10/p90 and `spread = (p90 − p10) / median`, which
#   says when a number deserves suspicion (above about 0.1), where your loop returns the median alone;
# * an op started with `async_op=True` is waited for (`work.wait()`), so the stream waits for NCCL's;
# * `benchmark_loops` times several loops *in turn, sample by sample* (an op next to a bare loop, a replayed CUDA
#   graph), so that a drift of the machine affects them alike and their ratio stays honest;
# * `benchmark(fn, inner=...)` is the one-device form (the copies of section 4), run under the clock's device;
#   `Clock` / `SpanTimer` time regions that no loop fits (phases of a step, side streams);
# * bad counts (`iters=0`, a float) are refused at once with the rule, before any rank waits.
#
# **The course's method and nccl-tests'.** nccl-tests (`src/common.cu`, `BenchTime`) also warms up (`-w`, 5 calls
# by default, at the largest and the smallest size) and times `-n` back-to-back calls (20 by default) as one
# sample, divided by the count. But its clock is the *host's*: a timer started before the calls are issued, read
# after a stream synchronize (`completeColl` polls `cudaStreamQuery` until the stream is done), so a sample also
# holds the host's issue time and the polling; it takes one sample per size (no repeats, no median); and it
# combines the ranks' times with `-a`: 0 rank 0's, **1 the mean over ranks (the default)**, 2 the minimum, 3 the
# maximum. The course times on the GPU's own timeline (CUDA events), takes the median of `repeat` samples with
# a barrier before each, and reports the slowest rank — nccl-tests' `-a 3`, not its default. On a machine whose
# ranks run alike the two agree; where one rank is slow, the default mean hides it and the maximum does not.
# (Lab 00's two-way copies span two GPUs, which no single stream's events can bracket, so they are timed
# nccl-tests' way, and say so.)
#
# ## 6 · Exercise: fit α and β yourself
#
# Section 4's fit, `bandwidth.fit_alpha_beta`, is what you write now: `fit_alpha_beta(size_bytes, time_ms)` returns
# `(alpha_us, beta_gbps)` of $t(S) = \alpha + S/\beta$ from measured points (sizes in bytes, times in ms; α in µs,
# β in GB/s = 1e9 B/s).
#
# *Derive it.* The sizes span more than five decades, so an ordinary least-squares line, which minimises the
# squared *absolute* errors, is decided by the largest copies alone (their times are the largest by far) and leaves
# α to chance. Minimise the **relative** error instead:
# $$\min_{\alpha,\,\beta}\ \sum_i \left(\frac{\alpha + S_i/\beta - t_i}{t_i}\right)^2 .$$
# The model is linear in the unknowns $x = (\alpha, 1/\beta)$, so this is a linear least-squares problem
# $\min_x \lVert A x - b \rVert^2$: work out $A$ and $b$, solve it (`torch.linalg.lstsq(A, b)`, or the 2×2 normal
# equations by hand), and convert the units. Two points give a line too, but then two noisy measurements decide
# everything.
#
# The checker compares your α and β with `labutils.bandwidth.fit_alpha_beta` (within 1%) on the lab's own
# GPU0→GPU1 sweep (live or recorded) and on three fixed noisy sweeps, and then fits every other size of the lab's
# sweep and predicts the sizes in between.

# %% nbgrader={"grade": false, "grade_id": "fit_alpha_beta", "locked": false, "schema_version": 3, "solution": true}
def fit_alpha_beta(size_bytes, time_ms):
    """(alpha_us, beta_gbps) of t = alpha + S / beta: least squares of the relative error."""
    # ✍ your code here
    ### BEGIN SOLUTION
    from labutils.solutions import lab00 as solution  # the instructor's edition: the reference answer
    return solution.fit_alpha_beta(size_bytes, time_ms)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_fit_alpha_beta", "locked": true, "points": 2, "schema_version": 3, "solution": false}
check.fit_alpha_beta(fit_alpha_beta, peer.data["size_bytes"], peer.data["time_ms"]["cuda:0 -> cuda:1"])

# %% [markdown]
# **Use it**, on a size it has not seen: fitted on every size of the GPU0→GPU1 sweep but one (the size the last
# prediction verdict holds out, `lab_claims.PREDICTED_SIZE`; the cell prints it), it predicts that copy (the last verdict of section 4 judges the library's fit the same way); the fit on every size is
# next to the library's.

# %% tags=["nbval-ignore-output"]
fit_fn = check.usable_fit(fit_alpha_beta)
kind, size = "cuda:0 -> cuda:1", lab_claims.PREDICTED_SIZE
pts = [(s, t) for s, t in zip(peer.data["size_bytes"], peer.data["time_ms"][kind]) if s != size]
a_us, b_gbps = fit_fn([s for s, _ in pts], [t for _, t in pts])
pred_ms = bandwidth.AlphaBeta(a_us, b_gbps, 0.0).predict_ms(size)
meas_ms = peer.data["time_ms"][kind][peer.data["size_bytes"].index(size)]
print(f"fitted without {bandwidth.format_size(size)}: alpha = {a_us:.2f} us, beta = {b_gbps:.1f} GB/s; "
      f"{bandwidth.format_size(size)} predicted {pred_ms:.3f} ms, measured {meas_ms:.3f} ms "
      f"({(pred_ms - meas_ms) / meas_ms:+.1%}) [{peer.label}]")
a_all, b_all = fit_fn(peer.data["size_bytes"], peer.data["time_ms"][kind])
print(f"fitted on every size: {'the stand-in' if is_standin(fit_fn) else 'yours'} alpha = {a_all:.2f} us, beta = {b_all:.1f} GB/s; "
      f"labutils.bandwidth: {bandwidth.AlphaBeta(**peer.data['fits'][kind])}")

# %% [markdown]
# ## Summary
#
# * `hw.describe()` tells the mode (multi-gpu / single-gpu / cpu), the links (`NV18`: a bonded set of 18 NVLinks on
#   the path; NVML says whether they end at the other GPU or at NVSwitch), the two NVLink peaks (line rate, data
#   rate) and a fingerprint that labels every recorded number.
# * `labutils.launch` runs a notebook function on fresh ranks; failures come back as `RankError` (which rank,
#   its traceback) and hangs as `RankTimeout`, with every process cleaned up.
# * A copy costs α + S/β: latency dominates below n½, bandwidth above; α is mostly the host's cost of one call,
#   which large copies hide behind the transfer. α and β come from a least-squares fit of the relative error.
# * Timing honestly: warm-up, samples of `iters` back-to-back calls between two marks (CUDA events on a GPU),
#   synchronize, the median, the slowest rank; `labutils.timing` is that loop plus its statistics. nccl-tests
#   times with the host clock and averages over ranks by default (`-a 1`).
# * Timing the two directions one at a time tests symmetry; full duplex needs both at once.
#   Every verdict of this lab, with the numbers behind it:

# %% tags=["nbval-ignore-output"]
claims.table(lab_claims.all_verdicts(local.data, peer.data, sources=(local, peer))
             + ([] if bidir is None else claims.sourced(lab_claims.duplex_verdicts(bidir.data), bidir)))

# %% [markdown]
# **Next:** lab 01 takes the first source's `torch.cuda.comm` tutorial, runs its code as written, and measures
# each of its four performance tips.
