# %% [markdown]
# # 02 · Tensor parallelism: the `all_gather` example fixed — and the real thing
#
# The second source tutorial introduces tensor parallelism with a 15-line program: split a tensor,
# compute on each GPU, `all_gather` the pieces. It then claims that GPU-to-GPU transfers pay for
# *serialisation*, that many small parts make transfers slow, that uneven partitions leave GPUs idle
# (its §4.1), and that NCCL helps.
#
# **You will**
# 1. run the source's program through `labutils`, see each of its four bugs, and verify a fixed version
#    (gathered == 2 × the original tensor, on gloo and on NCCL);
# 2. measure `all_gather` (list) vs `all_gather_into_tensor` vs `reduce_scatter_tensor` (time, algbw, busbw),
#    and test the serialisation and partition claims with numbers;
# 3. build Megatron's column- and row-parallel layers and the MLP that needs one all-reduce per forward pass,
#    check forward and backward against `nn.Sequential`, and measure when tensor parallelism pays.
#
# **GPUs:** 2 or more for the live path (written for any number; recorded on 2×H200 with NVLink). On one GPU
# or a CPU-only machine, every correctness cell runs live on gloo ranks and every measurement is the
# recording made by this notebook's own code on 2×H200, labelled **RECORDED**.
# **Time:** about 60 minutes to work through; designed to execute in under 2 minutes on 2×H200.

# %% tags=["nbval-ignore-output"]
import re
import socket

import torch
import torch.distributed as dist

import labutils
from labutils import bandwidth, compat, hw, plots, recorded
from labutils.labs.lab02_tensor_parallel import comm, cost_model, measure, verify
from labutils.checks import lab02 as check

HW = hw.describe()
MODE = HW.mode                                       # "multi-gpu", "single-gpu" or "cpu"
BACKEND = "nccl" if MODE == "multi-gpu" else "gloo"  # pass backend=BACKEND explicitly in checked cells
labutils.default_config()
HW

# %% [markdown]
# ## 1 · The source's program, run as written
#
# ```python
# def tensor_parallel(rank, world_size):
#     dist.init_process_group(backend='nccl', init_method='tcp://localhost:23456',
#                             rank=rank, world_size=world_size)
#     tensor = torch.randn(1000, 1000)                       # "create a big tensor"
#     split_tensor = torch.chunk(tensor, world_size, dim=0)  # "split it"
#     local_tensor = split_tensor[rank]
#     result = local_tensor * 2                              # "compute on the local GPU"
#     all_results = [torch.empty_like(result) for _ in range(world_size)]
#     dist.all_gather(all_results, result)                   # "collect the results"
#     final_result = torch.cat(all_results, dim=0)
#     print(final_result)
#     dist.destroy_process_group()
#
# mp.spawn(tensor_parallel, args=(2,), nprocs=2, join=True)
# ```
#
# Below it is copied as written, with two changes that do not touch its behaviour: `init_method` and
# `backend` are parameters (defaulting to the source's values), and the function returns its data so that
# the notebook can inspect it. `labutils.launch(..., init="none")` replaces `mp.spawn`: it starts fresh
# processes, lets the function call `init_process_group` itself (it sets `MASTER_ADDR`, `MASTER_PORT`,
# `RANK`, `WORLD_SIZE` for `env://`), and, unlike `mp.spawn` from a notebook, can send a function defined in a
# cell to its ranks.

# %%
def tensor_parallel(rank, world_size, init_method="tcp://localhost:23456", backend="nccl"):
    dist.init_process_group(backend=backend, init_method=init_method, rank=rank, world_size=world_size)
    tensor = torch.randn(1000, 1000)
    split_tensor = torch.chunk(tensor, world_size, dim=0)
    local_tensor = split_tensor[rank]
    result = local_tensor * 2
    all_results = [torch.empty_like(result) for _ in range(world_size)]
    dist.all_gather(all_results, result)
    final_result = torch.cat(all_results, dim=0)
    print(final_result)
    dist.destroy_process_group()
    return tensor, final_result          # added: hand the data back to the notebook


# %% [markdown]
# ### Bug 1 — CPU tensors on an NCCL process group
# `torch.randn(1000, 1000)` lives on the CPU, and the group has only an NCCL backend, which moves CUDA
# tensors. Run with the source's backend (and `env://` instead of the fixed port, see bug 3). This needs
# two GPUs; elsewhere the cell shows the error recorded on 2×H200.

# %% tags=["nbval-ignore-output"]
def run_source_on_nccl():
    try:
        labutils.launch(tensor_parallel, world_size=2, backend="nccl", init="none", timeout=90,
                        kwargs=dict(init_method="env://"))
        return {"raised": False}
    except labutils.RankError as e:
        return {"raised": True, "rank": e.rank, "exc_type": e.exc_type, "message": e.remote_message}


NCCL_SRC = recorded.live_or_recorded("02_source_nccl_error", run_source_on_nccl, gpus_needed=2)
if NCCL_SRC.data["raised"]:
    print(f"[{NCCL_SRC.label}] rank {NCCL_SRC.data['rank']} raised {NCCL_SRC.data['exc_type']}: "
          f"{NCCL_SRC.data['message']}")
else:
    print(f"[{NCCL_SRC.label}] the program ran without an error")

# %% [markdown]
# `dist.all_gather` looks up the backend registered for the tensors' device type; a group created with
# `backend='nccl'` registers NCCL for `cuda` only, so a CPU tensor finds none. The fix is to put the data
# where the backend can move it: one GPU per rank, `torch.cuda.set_device(rank)` and
# `device = torch.device("cuda", rank)` (a bare `.cuda()` without `set_device` would put every rank on
# `cuda:0`). `labutils.launch` binds each rank to its GPU for you.
#
# ### Bugs 2 and 4 — every rank draws its own "big tensor", and a 1000 × 1000 print
# On gloo (CPU tensors are fine there) the program runs, in every mode. Its output is the two printed tensors:

# %% tags=["nbval-ignore-output"]
SRC = labutils.launch(tensor_parallel, world_size=2, backend="gloo", init="none",
                      kwargs=dict(init_method="env://", backend="gloo"))

# %% [markdown]
# Each process seeds its own random generator, so each rank drew a *different* 1000 × 1000 tensor. The
# gathered result is a mosaic — rank 0's top half next to rank 1's bottom half — which is twice neither:

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
# And `print(final_result)` shows 36 of the million numbers per rank (torch summarises tensors above 1000
# elements to their corners): it verifies nothing, and without `labutils`' grouping the ranks' prints
# interleave. Print a *check*.
#
# ### Bug 3 — a fixed port
# `tcp://localhost:23456` makes rank 0 open a rendezvous server on port 23456 — on *every* network interface
# of the machine — and the other ranks connect to it. Any other job that chose the same number (a second
# copy of this notebook, a colleague, a test running in parallel) collides with it: its rank 0 cannot
# listen, or, worse, its ranks join *our* rendezvous. We do not touch 23456 here; we hold a free port, as
# another job would, and start the program on it:

# %%
with socket.socket() as other_job:
    other_job.bind(("127.0.0.1", 0))                  # a port the OS picks: free a moment ago
    other_job.listen(1)
    busy_port = other_job.getsockname()[1]
    try:
        labutils.launch(tensor_parallel, world_size=2, backend="gloo", init="none", timeout=60,
                        output="quiet", kwargs=dict(init_method=f"tcp://localhost:{busy_port}", backend="gloo"))
    except labutils.RankError as e:
        PORT_ERROR = e
        in_use = "EADDRINUSE" in e.remote_message or "already in use" in e.remote_message
        print(f"rank {e.rank} raised {e.exc_type}; the port was already in use: {in_use}")

# %% [markdown]
# The error itself (its wording varies between PyTorch versions):

# %% tags=["nbval-ignore-output"]
print(PORT_ERROR.remote_message)

# %% [markdown]
# `labutils` never uses a fixed port: every launch gets a fresh one from the OS, on the loopback interface only.
#
# ### The fixed program, verified
# Four fixes: the data lives on the group's device; every rank draws the **same** tensor (a seeded
# generator); the rows are split with `torch.tensor_split` (balanced, always `world_size` parts; section 4
# says why) and gathered with `comm.all_gather_uneven`, which pads when the rows do not divide; and it
# prints a check instead of the tensor. The rendezvous is `labutils`' job. We run it for 1000 rows (the
# source's case) and for 999 (uneven):

# %%
def tensor_parallel_fixed(rank, world_size, seed=0):
    device = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    for rows in (1000, 999):
        gen = torch.Generator().manual_seed(seed)                 # same tensor on every rank
        tensor = torch.randn(rows, 1000, generator=gen).to(device)
        local_tensor = torch.tensor_split(tensor, world_size, dim=0)[rank]
        result = local_tensor * 2
        final_result = comm.all_gather_uneven(result)          # pads to the longest block
        print(f"{rows} x 1000: gathered == 2 x the original tensor: {torch.equal(final_result, 2 * tensor)}")


_ = labutils.launch(tensor_parallel_fixed, backend=BACKEND)

# %% [markdown]
# The same text comes out on CPU/gloo and on GPUs/NCCL — the course's tests compare it.
#
# This program is *data* parallelism of an elementwise operation: no weight matrix is split, and the whole
# answer is communicated. Real tensor parallelism (section 5) splits the weights so that far less has to move.
# First, the collectives it uses.

# %% [markdown]
# ## 2 · `all_gather` (list) vs `all_gather_into_tensor`, and `reduce_scatter_tensor`
#
# | op | each rank gives | each rank gets | size S (nccl-tests) | busbw / algbw |
# |---|---|---|---|---|
# | `all_gather(list, t)` | `t` (S/n bytes) | a list of n tensors | the gathered S | (n−1)/n |
# | `all_gather_into_tensor(out, t)` | `t` (S/n bytes) | one tensor of S bytes | the gathered S | (n−1)/n |
# | `reduce_scatter_tensor(out, t)` | `t` (S bytes) | its 1/n of the sum | the input S | (n−1)/n |
# | `all_reduce(t)` | `t` (S bytes) | the sum, S bytes | S | 2(n−1)/n |
#
# *algbw* = S / t; *busbw* = algbw × the factor: what each link must carry in a ring, comparable to the
# hardware peak whatever n is (nccl-tests, `doc/PERFORMANCE.md`). NCCL has one all-gather, into one buffer.
# `all_gather(list)` therefore allocates a flat buffer, runs it, then **copies** each of the n pieces into
# your list (`ProcessGroupNCCL::allgather`); `all_gather_into_tensor` writes straight into your tensor.
# `reduce_scatter` is the conjugate of all-gather, and an all-reduce is exactly a reduce-scatter followed by
# an all-gather — hence its factor 2(n−1)/n. (PyTorch ≥ 2.13 renames the two `_tensor` functions
# `all_gather_single` / `reduce_scatter_single`; `labutils.compat` calls whichever your torch has.)
#
# **Predict:** the NVLink peak of an H200 is 478 GB/s per direction. What busbw will `all_gather_into_tensor`
# reach at 1 GiB on 2×H200?

# %%
my_prediction_busbw_gbps = None  # ✍ your number, in GB/s

# %% tags=["nbval-ignore-output"]
SWEEP_SIZES = bandwidth.size_sweep(4 * 2**10, 2**30, 4)      # 4 KiB ... 1 GiB


def measure_collectives():
    data = labutils.launch(measure.collective_sweep, SWEEP_SIZES, backend="nccl", timeout=300)[0]
    return dict(data, link_peak_gbps=HW.link_peak_gbps)


SWEEP = recorded.live_or_recorded("02_collectives", measure_collectives, gpus_needed=2)
OPS = SWEEP.data["ops"]
sizes = OPS["all_gather_into_tensor"]["size_bytes"]
star = (sizes[-1], my_prediction_busbw_gbps) if my_prediction_busbw_gbps is not None else None
plots.bandwidth_plot(sizes, {op: OPS[op]["busbw_gbps"] for op in OPS}, peak_gbps=SWEEP.data["link_peak_gbps"],
                     peak_label="NVLink peak", prediction=star, ylabel="busbw (GB/s)",
                     title=f"busbw, {SWEEP.data['world_size']} ranks, {SWEEP.data['dtype']} — {SWEEP.label}")

# %% tags=["nbval-ignore-output"]
plots.time_plot(sizes, {op: OPS[op]["time_ms"] for op in OPS}, title=f"time per call — {SWEEP.label}")

# %% tags=["nbval-ignore-output"]
print(f"{'size':>9} | " + " | ".join(f"{op:>22}" for op in OPS) + "   (time us / busbw GB/s)")
for i, s in enumerate(sizes):
    print(f"{bandwidth.format_size(s):>9} | " + " | ".join(
        f"{OPS[op]['time_ms'][i] * 1e3:9.1f} / {OPS[op]['busbw_gbps'][i]:8.1f}" for op in OPS))
AG = OPS["all_gather_into_tensor"]
BUSBW_1G = AG["busbw_gbps"][-1]
print(f"\nall_gather_into_tensor at {bandwidth.format_size(sizes[-1])}: busbw {BUSBW_1G:.0f} GB/s"
      + (f" = {BUSBW_1G / SWEEP.data['link_peak_gbps']:.0%} of the NVLink peak" if SWEEP.data["link_peak_gbps"] else ""))
print(f"all_gather (list) / all_gather_into_tensor, time: {OPS['all_gather']['time_ms'][0] / AG['time_ms'][0]:.2f}x "
      f"at {bandwidth.format_size(sizes[0])}, {OPS['all_gather']['time_ms'][-1] / AG['time_ms'][-1]:.2f}x at "
      f"{bandwidth.format_size(sizes[-1])}")

# %% [markdown]
# **What the numbers say.** Small messages are latency-bound: a few KiB take about as long as a few hundred
# KiB, so busbw is tiny there — the real content of the source's "many small parts are slow". Large messages
# approach the link: busbw is the number to compare with 478 GB/s. The list version pays the extra copies
# (and the allocation of the flat buffer) on top of the same NCCL kernel; prefer `all_gather_into_tensor`
# whenever you can gather into one tensor. At the same S an all-reduce moves twice the bytes of an all-gather
# (a reduce-scatter, then an all-gather), so expect about twice the time for large S and about the same busbw
# — the factor 2(n−1)/n accounts for it; the table shows how close the hardware comes.

# %% [markdown]
# ## 3 · "GPU-to-GPU transfers pay for serialisation" — tested
#
# A tensor is already a block of bytes in GPU memory. NCCL's kernels copy those bytes over NVLink into the
# peer's memory (through NCCL's buffers, in its Simple / LL / LL128 protocols): nothing is serialised.
# Pickling happens only in the *object* collectives — `all_gather_object`, `broadcast_object_list`, … —
# which turn any Python object into bytes, all-gather the sizes, pad, all-gather the bytes and unpickle (the
# padding trick of section 4, done by PyTorch). Their documentation warns: *"Calling all_gather_object() with
# GPU tensors is not well supported and inefficient as it incurs GPU → CPU transfer since tensors would be
# pickled."* So measure both paths on the same tensor, and count the bytes NVLink carried (NVML's data
# counter, when the machine exposes it).
#
# **Predict:** how many times slower is `all_gather_object` than `all_gather_into_tensor` for a 64 MiB tensor?

# %%
my_prediction_object_slowdown = None  # ✍ your number (a ratio)

# %% tags=["nbval-ignore-output"]
OBJECT_SIZES = [4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20, 64 * 2**20]
OBJ = recorded.live_or_recorded(
    "02_object_vs_tensor",
    lambda: labutils.launch(measure.object_vs_tensor, OBJECT_SIZES, backend="nccl", timeout=300)[0],
    gpus_needed=2)
rows = OBJ.data["rows"]
osz = [r["size_bytes"] for r in rows]
star = (osz[-1], rows[-1]["tensor_ms"] * my_prediction_object_slowdown) if my_prediction_object_slowdown else None
plots.time_plot(osz, {"all_gather_into_tensor": [r["tensor_ms"] for r in rows],
                      "all_gather_object": [r["object_ms"] for r in rows],
                      "pickle.dumps alone": [r["pickle_ms"] for r in rows]},
                prediction=star, title=f"one tensor per rank, gathered two ways — {OBJ.label}")

# %% tags=["nbval-ignore-output"]
print(f"{'tensor':>9} {'pickled':>10} {'tensor path':>12} {'object path':>12} {'slower':>7} {'pickle':>9} {'unpickle':>9}")
for r in rows:
    print(f"{bandwidth.format_size(r['size_bytes']):>9} {r['pickled_bytes']:>10} {r['tensor_ms']:>10.3f}ms "
          f"{r['object_ms']:>10.3f}ms {r['object_ms'] / r['tensor_ms']:>6.0f}x {r['pickle_ms']:>7.3f}ms {r['unpickle_ms']:>7.3f}ms")
SLOWDOWN = rows[-1]["object_ms"] / rows[-1]["tensor_ms"]
print("devices of the tensors all_gather_object handed back:", rows[-1]["received_devices"])
link = OBJ.data["link"]
print(f"\nNVLink bytes per call at {bandwidth.format_size(link['size_bytes'])} per rank "
      f"(payload that must move: {link['payload_bytes_per_call'] / 2**20:.1f} MiB):")
for path in ("tensor", "object"):
    b = link[f"{path}_link_bytes_per_call"]
    print(f"  {path:>6} path: " + (f"{b / 2**20:.1f} MiB = {b / link['payload_bytes_per_call']:.2f} x payload"
                                   if b is not None else "NVML counter not available on this machine"))

# %% [markdown]
# **Verdict.** For tensors the claim is false: NCCL moves the tensor's own bytes — where the NVML counter is
# available, the tensor path's NVLink bytes above are the payload, not a serialised copy of it — and the cost
# is the link's. The object path puts about the same bytes on NVLink (the pickle adds only a small header,
# see the "pickled" column), yet it is slower by the factor above because of what happens *around* the
# transfer: a GPU → CPU copy and a pickle on the sender, a CPU → GPU copy, two collectives, a GPU → CPU copy
# and an unpickle on every receiver. Note also where the unpickled tensors land: on the GPU they were pickled
# from, so rank 0 ends up holding a tensor on its peer's GPU. Use object collectives for small Python
# metadata only.

# %% [markdown]
# ## 4 · Partition balance (source §4.1)
#
# `torch.chunk(t, n)` makes chunks of `ceil(rows / n)` rows, so the last one is smaller — and it may return
# **fewer than n** chunks. `torch.tensor_split(t, n)` always returns n parts whose sizes differ by at most one:

# %%
print(" n | torch.chunk(1000 rows)           | torch.tensor_split(1000 rows)")
for n in range(2, 9):
    chunk = [len(c) for c in torch.chunk(torch.empty(1000), n)]
    split = [len(c) for c in torch.tensor_split(torch.empty(1000), n)]
    print(f"{n:>2} | {str(chunk):<32} | {split}")
print("torch.chunk of 10 rows into 6 parts gives", len(torch.chunk(torch.empty(10), 6)),
      "parts: rank 5 of the source program would raise IndexError")

# %% [markdown]
# NCCL's `ncclAllGather` moves the **same count** from every rank, and NCCL does not check that the ranks
# agree: the source's `empty_like(result)` buffers are sized from each rank's *own* block, so with uneven
# blocks the ranks pass different counts — undefined behaviour (a hang, a crash, or wrong data), not an
# error. `TORCH_DISTRIBUTED_DEBUG=DETAIL` makes PyTorch compare every collective's shapes across ranks first
# and raise instead. Then the fix — pad to the longest block, one `all_gather_into_tensor`, drop the padding:

# %%
def uneven_source_style(rank, world_size):
    device = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    tensor = torch.randn(999, 1000, generator=torch.Generator().manual_seed(0)).to(device)
    result = torch.chunk(tensor, world_size, dim=0)[rank] * 2           # 500 and 499 rows
    all_results = [torch.empty_like(result) for _ in range(world_size)]
    try:
        dist.all_gather(all_results, result)
        verdict = "no error (!)"
    except RuntimeError as e:
        shapes = re.findall(r"TensorShape=\[([\d, ]+)\]", str(e))
        verdict = f"caught a mismatch: {'Detected mismatch' in str(e)}, shapes {shapes}"
    padded = comm.all_gather_uneven(result)
    return f"source-style all_gather: {verdict}; padded all_gather == 2 x tensor: {torch.equal(padded, 2 * tensor)}"


for r, line in enumerate(labutils.launch(uneven_source_style, world_size=2, backend=BACKEND, output="quiet",
                                         env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"})):
    print(f"rank {r}: {line}")

# %% [markdown]
# `all_gather` into a list of *different* sizes is the remaining option: gloo refuses it, and PyTorch's NCCL
# backend emulates it with one broadcast per rank (`ProcessGroupNCCL::allgather`, "unequal size" branch) —
# correct, but n collectives instead of one.
#
# **What imbalance costs.** A step is "compute, then all-gather"; rank 0 gets k × the rows of every other
# rank. The all-gather cannot finish before rank 0 arrives, so the step takes as long as rank 0's compute,
# and the other ranks wait *inside the collective*. One launch measures this and tries the unequal-size list.
#
# **Predict:** with k = 4, how many times longer is a step than with k = 1?

# %%
my_prediction_step_ratio = None  # ✍ your number (a ratio)

# %% tags=["nbval-ignore-output"]
FACTORS = [1, 1.25, 1.5, 2, 3, 4]
PART = recorded.live_or_recorded(
    "02_partitions", lambda: labutils.launch(measure.partitions, FACTORS, backend="nccl", timeout=300)[0],
    gpus_needed=2)
for backend, outcome in PART.data["uneven_list"].items():
    print(f"[{PART.label}] all_gather into a list of unequal tensors, {backend:>5}: {outcome}")
if not PART.live:
    print(f"[live: this machine] all_gather into a list of unequal tensors,  gloo: "
          f"{labutils.launch(verify.uneven_list_gather, backend='gloo', world_size=2)[0]['gloo']}")
d = PART.data["imbalance"]
step = [max(s) for s in d["step_ms"]]
unit, gather1 = d["compute_ms"][0][1], d["all_gather_ms"][0][1]
series = {"step (slowest rank)": step,
          "rank 0 compute": [c[0] for c in d["compute_ms"]],
          "rank 1 all_gather (incl. waiting)": [g[1] for g in d["all_gather_ms"]],
          "model: k x compute(k=1) + all_gather(k=1)": [k * unit + gather1 for k in d["factors"]]}
star = (4, step[0] * my_prediction_step_ratio) if my_prediction_step_ratio else None
plots.line_plot(d["factors"], series, xlabel="k (rank 0 has k x the rows of the others)", ylabel="ms",
                dashed=["model: k x compute(k=1) + all_gather(k=1)"], prediction=star,
                title=f"imbalance: unit = ({d['rows']} x {d['cols']}) @ ({d['cols']} x {d['out_cols']}), "
                      f"{d['world_size']} ranks — {PART.label}")

# %% tags=["nbval-ignore-output"]
for k, s, c, g in zip(d["factors"], step, d["compute_ms"], d["all_gather_ms"]):
    print(f"k = {k:<4}: step {s:6.3f} ms | compute per rank {[round(x, 3) for x in c]} ms | "
          f"all_gather per rank {[round(x, 3) for x in g]} ms")
IMB_RATIO = step[d["factors"].index(4)] / step[0]
print(f"\nk = 4 makes the step {IMB_RATIO:.2f}x longer; rank 1 spends {d['all_gather_ms'][-1][1]:.3f} ms per step "
      f"in all_gather, of which about {d['all_gather_ms'][-1][1] - gather1:.3f} ms is waiting for rank 0.")

# %% [markdown]
# **Reading it.** The step grows with k along the dashed model, and the fast ranks' compute stays flat while
# their all_gather time grows: the idle time does not show up as idle — it shows up as a slow collective on
# the fast ranks, and a profiler would blame NCCL. So the source's §4.1 is right, and the fix is cheap:
# balance first (`tensor_split`: at most one row of difference), then pad; padding costs at most one row per
# rank on the wire.

# %% [markdown]
# ## 5 · Real tensor parallelism, Megatron style
#
# Megatron-LM (Shoeybi et al. 2019, §3) splits the *weights* of a transformer MLP `Z = GeLU(X A) B`:
#
# * **column-parallel** `A = [A_1, …, A_p]`: rank i computes `Y_i = GeLU(X A_i)` — no communication, because
#   GeLU is elementwise and each column of `Y` needs only its column of `A`;
# * **row-parallel** `B = [B_1; …; B_p]`: rank i computes the partial product `Y_i B_i`, and **one all-reduce**
#   (Megatron's `g`) sums them: `Z = Σ_i Y_i B_i`;
# * backward mirrors it: `g`'s backward is the identity, and the operator `f` in front of the column layer
#   all-reduces `dL/dX` (each rank holds only its part of it).
#
# So a forward pass moves `tokens × hidden` elements once, however large the 4 × hidden inner layer is. The
# code is in `labutils/labs/lab02_tensor_parallel/layers.py` (`ColumnParallelLinear`, `RowParallelLinear`,
# `TensorParallelMLP`), the autograd-aware communication in `comm.py` beside it (`copy_to_tp_region` = f,
# `reduce_from_tp_region` = g). `ColumnParallelLinear(gather_output=True)` is the source's pattern done right:
# all-gather of a column-split output.
#
# Check it: a one-device `nn.Sequential(Linear, GELU, Linear)`, sharded onto the ranks with
# `TensorParallelMLP.from_sequential`; forward output and every gradient compared with
# `torch.testing.assert_close` (in float64, so that rounding cannot hide a bug):

# %%
VERIFY = labutils.launch(verify.verify_mlp, backend=BACKEND, output="quiet",
                         kwargs=dict(hidden=64, ffn_hidden=840, tokens=8))   # 840: divisible by 1..8 ranks
for name, verdict in VERIFY[0].items():
    print(f"{name:<26} {verdict}")
print("every rank agrees:", all(v == VERIFY[0] for v in VERIFY))

# %% [markdown]
# **Predict:** on 2×H200, forward + backward of the MLP with hidden = 16384, 4096 tokens, bf16: what speedup
# does tensor parallelism give over one GPU?

# %%
my_prediction_speedup = None  # ✍ your number (2 would be perfect)

# %% tags=["nbval-ignore-output"]
HIDDENS = [512, 1024, 2048, 4096, 8192, 16384]
TOKENS = 4096


def measure_tp_mlp():
    n = 1 << (len(HW.gpus).bit_length() - 1)   # a power of two, so that it divides every 4 x hidden
    rows = labutils.launch(measure.tp_mlp_sweep, HIDDENS, world_size=n, backend="nccl", timeout=400,
                           kwargs=dict(tokens=TOKENS))[0]          # rank 0's baseline, on its own GPU
    return {"world_size": n, "rows": rows}


TP = recorded.live_or_recorded("02_tp_mlp", measure_tp_mlp, gpus_needed=2)
N_TP, TP_TOKENS = TP.data["world_size"], TP.data["rows"][0]["tokens"]
ar = OPS["all_reduce"]
FIT = bandwidth.fit_alpha_beta(ar["size_bytes"], ar["time_ms"])      # section 2's all_reduce sweep
hs = [r["hidden"] for r in TP.data["rows"]]
speed = {m: [r[f"one_gpu_{m}_ms"] / r[f"tp_{m}_ms"] for r in TP.data["rows"]] for m in ("fwd", "train")}
model = {m: [r[f"one_gpu_{m}_ms"] / cost_model.tp_step_ms(r[f"one_gpu_{m}_ms"], N_TP, FIT.predict_ms(r["allreduce_bytes"]),
                                                        1 if m == "fwd" else 2) for r in TP.data["rows"]]
         for m in ("fwd", "train")}
star = (hs[-1], my_prediction_speedup) if my_prediction_speedup else None


def plain_ticks(fig):
    """Hidden sizes as plain numbers on the log2 axis."""
    from matplotlib.ticker import ScalarFormatter
    fig.axes[0].xaxis.set_major_formatter(ScalarFormatter())
    return fig


fig_tp = plots.line_plot(hs, {"measured, forward": speed["fwd"], "measured, forward + backward": speed["train"],
                     "model, forward": model["fwd"], "model, forward + backward": model["train"]},
                xlabel="hidden size (ffn = 4 x hidden)", ylabel=f"speedup, {N_TP} GPUs vs 1", logx=True,
                dashed=["model, forward", "model, forward + backward"], prediction=star,
                hline=(1.0, "break-even"),
                title=f"TP MLP, {TP_TOKENS} tokens, {TP.data['rows'][0]['dtype']} — {TP.label}")
plain_ticks(fig_tp)

# %% tags=["nbval-ignore-output"]
share = {"forward": [r["allreduce_fwd_ms"] / r["tp_fwd_ms"] for r in TP.data["rows"]],
         "forward + backward": [2 * r["allreduce_train_ms"] / r["tp_train_ms"] for r in TP.data["rows"]]}
plain_ticks(plots.line_plot(hs, {k: [100 * x for x in v] for k, v in share.items()}, xlabel="hidden size", logx=True,
                            ylabel="% of the TP step in all-reduce", title=f"share of time in communication — {TP.label}"))

# %% tags=["nbval-ignore-output"]
print(f"all_reduce fit from section 2: {FIT}   (max error {FIT.max_rel_err:.0%})")
print(f"{'hidden':>6} {'AR size':>8} | {'1 GPU fwd':>9} {'TP fwd':>8} {'speedup':>7} {'model':>6} | "
      f"{'1 GPU f+b':>9} {'TP f+b':>8} {'speedup':>7} {'model':>6} | {'AR in step':>10} {'AR fit':>8} {'comm share':>10}")
for i, r in enumerate(TP.data["rows"]):
    print(f"{r['hidden']:>6} {bandwidth.format_size(r['allreduce_bytes']):>8} | {r['one_gpu_fwd_ms']:>7.3f}ms "
          f"{r['tp_fwd_ms']:>6.3f}ms {speed['fwd'][i]:>6.2f}x {model['fwd'][i]:>5.2f}x | {r['one_gpu_train_ms']:>7.3f}ms "
          f"{r['tp_train_ms']:>6.3f}ms {speed['train'][i]:>6.2f}x {model['train'][i]:>5.2f}x | "
          f"{r['allreduce_fwd_ms'] * 1e3:>8.1f}us {FIT.predict_ms(r['allreduce_bytes']) * 1e3:>6.1f}us "
          f"{share['forward + backward'][i]:>9.0%}")
TP_SPEEDUP = speed["train"][-1]
paying = [h for h, s in zip(hs, speed["train"]) if s >= 1.0]
print(f"\nBenchmark: TP MLP forward+backward speedup on {N_TP} GPUs at hidden {hs[-1]}: {TP_SPEEDUP:.2f}x "
      f"(forward only: {speed['fwd'][-1]:.2f}x) [{TP.label}]; all_gather_into_tensor busbw at "
      f"{bandwidth.format_size(sizes[-1])}: {BUSBW_1G:.0f} GB/s [{SWEEP.label}]")
if paying and paying[0] != hs[0]:
    print(f"Tensor parallelism stops paying below hidden = {paying[0]} at {TP_TOKENS} tokens (forward + backward).")
elif paying:
    print(f"Tensor parallelism paid at every size shown (down to hidden = {hs[0]}, {TP_TOKENS} tokens).")
else:
    print("Tensor parallelism did not pay at any size shown.")

# %% [markdown]
# **Reading it.** The cost model is `t_TP = t_1 / p + k · t_allreduce(tokens × hidden × 2 bytes)` with k = 1
# all-reduce per forward pass and 2 per forward + backward. Compute grows as hidden², the all-reduce only as
# hidden: large layers approach the ideal speedup, small ones lose — the all-reduce's fixed latency and the
# halved matmuls' lower efficiency (the model assumes exactly half the one-GPU time) dominate. Where the
# measured speedup falls below the model, the split matmuls ran less efficiently than half the big one; where
# it falls below 1, tensor parallelism costs more than it saves. That is why it is used within a node
# (NVLink) and for wide layers, and why later Megatron-LM versions split each all-reduce into a
# reduce-scatter and an all-gather (sequence parallelism, Korthikanti et al. 2022) and overlap them with the
# matmuls.
#
# The measured all-reduce times inside these steps are recorded in `recorded/02_comm_summary.json`, for the
# capstone (lab 06) to predict from its own fits:

# %% tags=["nbval-ignore-output"]
SUMMARY = recorded.live_or_recorded("02_comm_summary", lambda: cost_model.comm_summary(TP.data["rows"], N_TP),
                                    gpus_needed=2)
for op in SUMMARY.data["ops"]:
    print(f"{op['what']:<52} {op['size_bytes']:>10} B  {op['measured_ms'] * 1e3:8.1f} us of a {op['step_ms']:.3f} ms step")

# %% [markdown]
# ## 6 · Exercises
#
# ### Exercise 1 — all-gather blocks of different lengths
# Write `my_gather_rows_uneven(x, group)`: `x` is this rank's block of rows (the counts differ between ranks,
# a rank may have none); return every rank's rows concatenated in rank order, on every rank. Use one
# `compat.all_gather_into_tensor(output, input, group)` for the data (plus whatever small collective you
# need first). The checker runs it on 3 gloo ranks.

# %%
def my_gather_rows_uneven(x, group=None):
    raise NotImplementedError  # ✍ your code here


# %%
check.gather_rows_uneven(my_gather_rows_uneven)

# %% [markdown]
# ### Exercise 2 — the row-parallel layer
# Write the forward of `RowParallelLinear`: `x_shard` is this rank's slice `X_i` of the input features,
# `weight_shard` the matching columns `B_i` of the `nn.Linear` weight (`[out, in / p]`), `bias` the full bias.
# Return `Z = Σ_i X_i B_iᵀ + b` on every rank, with correct gradients for `x_shard`, `weight_shard` and `bias`.
# Hint: `comm.reduce_from_tp_region` is Megatron's `g`. (Beware `torch.distributed.nn.functional.all_reduce`:
# its backward all-reduces the gradient again, which is wrong here — the checker will tell you why.)

# %%
def my_row_parallel_forward(x_shard, weight_shard, bias, group=None):
    raise NotImplementedError  # ✍ your code here


# %%
check.row_parallel_forward(my_row_parallel_forward)

# %% [markdown]
# ### Exercise 3 — predict the MLP's all-reduce from the fit
# `FIT` is the alpha–beta fit of section 2's all-reduce sweep (`FIT.alpha_us`, `FIT.beta_gbps`). Write
# `my_predict_allreduce_ms(tokens, hidden, bytes_per_element, fit)`: the time of the all-reduce in the MLP's
# forward pass. Then compare it with the all-reduce time measured *inside* the TP steps.

# %%
def my_predict_allreduce_ms(tokens, hidden, bytes_per_element, fit):
    raise NotImplementedError  # ✍ your code here


# %%
check.predict_allreduce_ms(my_predict_allreduce_ms, FIT)

# %% tags=["nbval-ignore-output"]
try:
    predicted = [my_predict_allreduce_ms(r["tokens"], r["hidden"], 2, FIT) for r in TP.data["rows"]]
except NotImplementedError:
    from labutils.solutions import lab02 as solution
    predicted = [solution.predict_allreduce_ms(r["tokens"], r["hidden"], 2, FIT) for r in TP.data["rows"]]
measured = [r["allreduce_fwd_ms"] for r in TP.data["rows"]]
plots.time_plot([r["allreduce_bytes"] for r in TP.data["rows"]],
                {"measured inside the TP forward step": measured, "predicted from the sweep's fit": predicted},
                title=f"the MLP's all-reduce: prediction vs measurement — {TP.label}")

# %% [markdown]
# Inside a step, the all-reduce also waits for the slower rank's matmul and competes with nothing else; the
# sweep measured it back to back. Where the two differ, that difference is what a step adds to a benchmark.
#
# ### Explorer: when does tensor parallelism pay?
# The model of section 5 with your knobs: tokens per step, number of GPUs (the all-reduce is extrapolated from
# the 2-GPU fit with the ring model — optimistic beyond one NVLink pair), the GPU's sustained TFLOP/s (starts
# at the one-GPU MLP's measured rate) and a fixed per-step overhead. Dots: the 2-GPU measurements.

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets
from IPython.display import display

big = TP.data["rows"][-1]
MEASURED_TFLOPS = cost_model.mlp_flops(big["tokens"], big["hidden"], big["ffn_hidden"], train=True) / (
    big["one_gpu_train_ms"] * 1e-3) / 1e12


def explore(tokens=TP_TOKENS, world_size=2, tflops=round(MEASURED_TFLOPS), overhead_us=20.0, train=True):
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


widgets.interact(explore, tokens=widgets.SelectionSlider(options=sorted({2**k for k in range(8, 16)} | {TP_TOKENS}),
                                                        value=TP_TOKENS),
                 world_size=widgets.IntSlider(value=2, min=2, max=8),
                 tflops=widgets.FloatSlider(value=round(MEASURED_TFLOPS), min=50, max=1000, step=10),
                 overhead_us=widgets.FloatSlider(value=20.0, min=0.0, max=200.0, step=5.0),
                 train=widgets.Checkbox(value=True, description="forward + backward"));

# %% [markdown]
# ## 7 · Summary
#
# What the source claims, and what this lab measured (numbers from the runs above; "recorded" when they came
# from the 2×H200 recording):

# %% tags=["nbval-ignore-output"]
from IPython.display import Markdown

small = OPS["all_gather_into_tensor"]
peak = SWEEP.data["link_peak_gbps"]
tensor_link = OBJ.data["link"].get("tensor_link_bytes_per_call")
link_note = (f"NVLink carried {tensor_link / OBJ.data['link']['payload_bytes_per_call']:.2f}× the payload for the tensor path"
             if tensor_link else "NCCL moved the tensor's bytes (NVML counter unavailable)")
verdict = lambda ok, yes, no: f"**{yes}**" if ok else f"**{no}**"  # noqa: E731
Markdown("\n".join([
    "| claim | verdict | measured |", "|---|---|---|",
    "| the 15-line program is tensor parallelism that works | **false** | on NCCL: "
    f"{NCCL_SRC.data.get('exc_type') or 'no error'} ({NCCL_SRC.label}); on gloo it gathers a mosaic of different "
    "random tensors; fixed port; prints instead of checking. Fixed: gathered == 2 × tensor, checked above |",
    f"| GPU-to-GPU transfers pay for serialisation | {verdict(SLOWDOWN > 1, 'false for tensors', 'not tested')} | "
    f"{link_note}; `all_gather_object` (pickle) was {SLOWDOWN:.0f}× slower at "
    f"{bandwidth.format_size(rows[-1]['size_bytes'])} ({OBJ.label}) |",
    f"| many small parts make transfers slow | {verdict(small['busbw_gbps'][0] < 0.1 * BUSBW_1G, 'true (latency)', 'not here')} | "
    f"{bandwidth.format_size(small['size_bytes'][0])}: {small['busbw_gbps'][0]:.1f} GB/s busbw vs {BUSBW_1G:.0f} GB/s at "
    f"{bandwidth.format_size(small['size_bytes'][-1])}; all-reduce latency α ≈ {FIT.alpha_us:.0f} µs ({SWEEP.label}) |",
    f"| uneven partitions leave GPUs idle (§4.1) | {verdict(IMB_RATIO > 1.5, 'true', 'not measurable here')} | "
    f"k = 4 → step {IMB_RATIO:.1f}× longer; the idle time appears inside the fast ranks' all_gather ({PART.label}) |",
    f"| NCCL helps | {verdict(bool(peak) and BUSBW_1G > 0.5 * peak, 'true', 'see the numbers')} | "
    f"all_gather_into_tensor busbw {BUSBW_1G:.0f} GB/s at {bandwidth.format_size(small['size_bytes'][-1])}"
    + (f" = {BUSBW_1G / peak:.0%} of the NVLink peak" if peak else "") + f" ({SWEEP.label}) |",
    f"| (this lab) Megatron TP speeds up an MLP | {verdict(TP_SPEEDUP > 1, 'for wide layers', 'not at these sizes')} | "
    f"{TP_SPEEDUP:.2f}× on {N_TP} GPUs at hidden {hs[-1]} (fwd+bwd); all-reduce = "
    f"{share['forward + backward'][-1]:.0%} of that step ({TP.label}) |",
]))

# %% [markdown]
# **Take-aways.** Put tensors where the backend moves them; make every rank agree on the data and the sizes;
# gather into one tensor; never pickle tensors through object collectives; balance before you pad; and split
# *weights*, not just data — Megatron's MLP needs one all-reduce per forward pass, and pays when the layer is
# wide enough for compute to dwarf it.
#
# **Next:** lab 03 — asynchronous point-to-point (`isend`/`irecv`): the source's second program, why it
# deadlocks, and what overlap really buys.
