# %% [markdown]
# # 03 · Async isend/irecv: the source's example fixed, a crash and a deadlock explained, overlap measured
#
# The second source recommends `dist.isend` / `dist.irecv` for tensor parallelism because "while the
# data moves, the GPU can keep computing" (异步通信: "在数据传输的同时，GPU 可以继续进行其他计算"), and gives
# an example. We run that example, watch each of its defects happen, find out why its exchange fails on
# GPUs, fix it three ways, and then measure the claim itself.
#
# **You will**
# 1. run the source's isend/irecv program and see each defect happen: CPU tensors handed to NCCL, a
#    wrong `torch.cat`, and, on GPUs, an exchange that never completes — reduced to a standalone script
#    whose variants tell a deadlock by design from a failure inside NCCL, and the NCCL defect behind it;
# 2. write the three correct exchanges (ordered send/recv, `batch_isend_irecv`, `all_gather_into_tensor`)
#    and verify them bit for bit on every rank, on gloo and NCCL;
# 3. know what `req.wait()` guarantees on CUDA (stream order, not the host);
# 4. run an overlapped step (the transfer on a side stream, compute, then wait) and measure how much
#    communication hides behind compute — NCCL kernels and copy-engine copies; read from a profiler trace which
#    engine a copy between GPUs runs on and what `copy_` makes it wait for; write a pipeline that keeps each
#    chunk's all-reduce in flight while the next chunk is produced; on one GPU, hide host <-> GPU copies on a
#    side stream behind a matmul, and cause and fix the race a missing `wait_stream` leaves;
# 5. write a ring all-gather and a ring all-reduce from point-to-point operations, checked on three ranks
#    against torch's collectives and against the ring's own messages and bytes, and time the ring against
#    NCCL and against no GPU library at all.
#
# **GPUs:** 2 for the live path (NCCL); 1 for section 3b (streams and copies on one GPU). With fewer, every
# correctness cell runs on gloo (CPU tensors) and every measurement that needs more GPUs than the machine has is
# the recording made by this notebook's own code, labelled **RECORDED**.
#
# **Time:** 85 min of study (three exercises, six predictions); about 20 s to run on 2×H200, about 12 s on a
# 2-core CPU.

# %% tags=["nbval-ignore-output"]
import itertools
import os
import shutil
import tempfile

import pandas as pd
import torch
import torch.distributed as dist
from IPython.display import display

import labutils
from labutils import bandwidth, claims, compat, hw, plots, procs, recorded
from labutils.checks import lab03 as check
from labutils.labs.lab03_async_p2p import exchange, measure, overlap, repro, streams, wait
from labutils.labs.lab03_async_p2p.claims import CLAIMS

HW = hw.describe()
MODE = HW.mode                                       # "multi-gpu", "single-gpu" or "cpu"
BACKEND = "nccl" if MODE == "multi-gpu" else "gloo"  # the lab's ranks: one GPU each, else CPU tensors
labutils.default_config()
SCRATCH = tempfile.mkdtemp(prefix="lab03-")          # section 1's standalone script is written here
EXCHANGE_SCRIPT = os.path.join(SCRATCH, "exchange.py")
HW

# %%
REPRO_TIMEOUT_S = 30           # a variant still running then has its host blocked: killed, counted as a hang
OVERLAP_BYTES = 256 << 20      # the transfer in section 3
RING_SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20]   # gathered bytes, section 4

# %% [markdown]
# ## 1 · The source program
#
# The source's rank function (section 5.2 of the second source; comments ours), for `world_size = 2`
# and NCCL:
#
# ```python
# tensor = torch.randn(1000, 1000)
# local_tensor = torch.chunk(tensor, world_size, dim=0)[rank]
# result = local_tensor * 2
# reqs = []
# for i in range(world_size):
#     if i != rank:
#         reqs.append(dist.isend(result, dst=i))          # 1. send to every peer ...
# received_results = [torch.empty_like(result) for _ in range(world_size)]
# for i in range(world_size):
#     if i != rank:
#         reqs.append(dist.irecv(received_results[i], src=i))   # 2. ... then receive from every peer
# for req in reqs:
#     req.wait()
# final_result = torch.cat([result] + received_results, dim=0)
# print(final_result)
# ```
#
# Before running anything, predict:

# %%
my_prediction_rows = None    # ✍ rows of final_result on each rank with 2 ranks (a number)
my_prediction_gpu = None     # ✍ "completes", "hangs" or "crashes": the exchange with its tensors on the GPUs

# %% [markdown]
# ### 1a · The exchange on GPUs, as a standalone script
# The source creates its tensors on the CPU, which NCCL does not accept (1b). To see what the *exchange*
# does on GPUs, we move the tensors to each rank's GPU and run it outside this course's tools: a plain
# script that anyone can run with `torchrun`, one process per rank. It prints each step and ends with
# `COMPLETED`, or with `HANG` when the GPU has not finished the exchange a short while after `wait()`
# returned (under NCCL the host is free to look; section 2 shows why). A crash ends a process early,
# with the error on its stderr.

# %% tags=["nbval-ignore-output"]
# %%writefile {EXCHANGE_SCRIPT}
"""The second source's isend/irecv exchange (002, section 5.2) on CUDA tensors: a standalone reproducer.

    torchrun --nproc-per-node 2 exchange.py as_written        # every isend, then every irecv, then wait()
    NCCL_CUMEM_ENABLE=0 torchrun --nproc-per-node 2 exchange.py as_written
    torchrun --nproc-per-node 2 exchange.py preconnected      # one matched exchange first, then as written
    torchrun --nproc-per-node 2 exchange.py batched           # the same requests in one batch_isend_irecv
    torchrun --nproc-per-node 2 exchange.py recv_first        # pre-connected; every rank receives first

Each rank prints its steps and ends with COMPLETED, or with HANG when the GPU has not finished HANG_S
seconds after wait() returned. A crash ends the process early, with the error on stderr.
"""
import os
import sys
import time

import torch
import torch.distributed as dist

HANG_S = 2.0                  # far longer than a connected pair needs for this exchange
variant = sys.argv[1]
rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)      # the communicator is created here (eager)


def say(what):
    print(f"rank {rank}: {what}", flush=True)


def gpu_finished(what, reqs=()):
    """Poll, without blocking the host, until the GPU has done everything issued so far."""
    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + HANG_S
    while not (all(req.is_completed() for req in reqs) and done.query()):
        if time.monotonic() > deadline:
            say(f"HANG: {what} not finished on the GPU after {HANG_S:g} s")
            os._exit(3)       # a stuck NCCL kernel never ends: leave without clean-up
        time.sleep(0.01)


peers = [i for i in range(world_size) if i != rank]
tensor = torch.randn(1000, 1000, device=device)               # the source's tensor, on this rank's GPU
result = torch.chunk(tensor, world_size, dim=0)[rank] * 2
received_results = [torch.empty_like(result) for _ in range(world_size)]

if variant in ("preconnected", "recv_first"):
    for i in peers:           # one matched pair of blocking calls per peer: the lower rank sends first
        if rank < i:
            dist.send(result, dst=i)
            dist.recv(received_results[i], src=i)
        else:
            dist.recv(received_results[i], src=i)
            dist.send(result, dst=i)
    gpu_finished("the pre-connecting exchange")
    say("connected to every peer")

reqs = []
if variant == "batched":
    ops = [dist.P2POp(dist.isend, result, i) for i in peers]
    ops += [dist.P2POp(dist.irecv, received_results[i], i) for i in peers]
    reqs = dist.batch_isend_irecv(ops)
elif variant == "recv_first":
    reqs = [dist.irecv(received_results[i], src=i) for i in peers]
    reqs += [dist.isend(result, dst=i) for i in peers]
else:                         # the source's order
    for i in peers:
        reqs.append(dist.isend(result, dst=i))
    say("isend returned")
    for i in peers:
        reqs.append(dist.irecv(received_results[i], src=i))
say("all requests posted")
for req in reqs:
    req.wait()
say("wait() returned")
gpu_finished("the exchange", reqs)
say("COMPLETED")
dist.destroy_process_group()

# %% [markdown]
# Five runs of this script, each a pair of fresh processes, all at once. Each variant changes one thing,
# so that together they say what fails and where:
#
# | variant | what it changes | what it tests |
# |---|---|---|
# | as written | nothing | what the source's exchange does on GPUs |
# | as written, `NCCL_CUMEM_ENABLE=0` | NCCL shares its buffers between processes with CUDA IPC handles instead of the CUDA virtual-memory (`cuMem`) API | whether the failure depends on how NCCL maps the peer's memory when it connects |
# | pre-connected, then as written | one matched send/recv first, so NCCL has set up the connection before the exchange | whether the exchange itself, or the set-up of the connection, fails |
# | `batch_isend_irecv` | the same requests, posted together | the fix NCCL's documentation prescribes |
# | pre-connected, both ranks receive first | every rank posts its receive before its send | a circular wait that nothing can resolve |
#
# Every variant runs with `NCCL_DEBUG=WARN`, so that where NCCL itself detects a failure it says so in its own
# words (`NCCL WARN` lines, on a rank's output); an error that the GPU raises and PyTorch's watchdog catches
# need not pass through NCCL's log at all. The `NCCL WARN` column in 1d shows which it was. The processes take some seconds to start (each imports torch and
# creates its NCCL communicator): they start now, in the background, and we look at the source's other defects
# meanwhile.

# %%
VARIANTS = {                                        # name: (the script's argument, extra environment)
    "as written": ("as_written", {}),
    "as written, NCCL_CUMEM_ENABLE=0": ("as_written", {"NCCL_CUMEM_ENABLE": "0"}),
    "pre-connected, then as written": ("preconnected", {}),
    "batch_isend_irecv": ("batched", {}),
    "pre-connected, both ranks receive first": ("recv_first", {}),
}
EXCHANGE_RUNS = (repro.start(EXCHANGE_SCRIPT, VARIANTS, env={"NCCL_DEBUG": "WARN"}, timeout_s=REPRO_TIMEOUT_S)
                 if MODE == "multi-gpu" else None)   # with fewer than 2 GPUs: the recording, in 1d

# %% [markdown]
# ### 1b · CPU tensors handed to NCCL
# The ranks for the rest of the lab start here, once: `POOL` (NCCL with one GPU per rank, else gloo)
# keeps its processes between cells, so an experiment costs milliseconds instead of a launch. `GLOO` is a
# pair of CPU ranks for what only gloo can run, and `CHECKERS` three CPU ranks for the exercises' checkers
# (section 4 says why three). `torch.randn(1000, 1000)` lives on the CPU; NCCL moves
# CUDA tensors only. Here is what NCCL says (live with 2 GPUs, else as recorded on 2×H200):

# %% tags=["nbval-ignore-output"]
POOL = labutils.RankPool(backend=BACKEND, output="quiet", wait=False)   # all start side by side; the first
GLOO = POOL if BACKEND == "gloo" and POOL.world_size == 2 else labutils.RankPool(  # task waits for its pool
    world_size=2, backend="gloo", output="quiet", wait=False)
CHECKERS = labutils.RankPool(world_size=3, backend="gloo", output="quiet", wait=False)  # the exercises' ranks
SRC_NCCL = recorded.live_or_recorded("03_source_on_nccl",
                                     lambda: exchange.attempt(POOL.run, exchange.source_as_written), gpus_needed=2)
claims.show(CLAIMS["03_source_on_nccl"](SRC_NCCL.data), SRC_NCCL)

# %% [markdown]
# ### 1c · What `final_result` holds
# gloo accepts CPU tensors, so the same code runs unchanged there (on every machine). A block of
# `final_result` is "chunk k" if it equals rank k's `result`, and "never written" if it equals nobody's:

# %%
SRC_GLOO = GLOO.run(exchange.source_as_written)
print("completed on gloo (isend to every peer, then irecv from every peer): True")
print("\n".join(exchange.diagnose_source(SRC_GLOO)))
print(f"your prediction: {my_prediction_rows} rows")
exchange.source_blocks(SRC_GLOO)

# %% [markdown]
# What went wrong, line by line:
# * **Shape**: `received_results` has a slot for *every* rank, its own included, and the local
#   `result` is put in front: `world_size + 1` blocks, 1500 rows instead of 1000.
# * **Never written**: the rank's own slot in `received_results` comes from `torch.empty_like`:
#   uninitialised memory, whatever bytes were there, glued into the output.
# * **Order**: every rank puts its own chunk first, so on rank 1 the rows are out of order.
# * **No seed**: each rank draws its *own* `torch.randn(1000, 1000)`, so the chunks come from
#   different matrices: even a perfect gather would not rebuild any one tensor.
# * **Uneven chunks**: with 3 ranks `torch.chunk` gives 334, 334 and 332 rows, and each rank receives
#   into `empty_like` of its *own* chunk, so the sizes of a send and its receive differ. What gloo
#   does with that (fresh processes: a rank that aborts must not take the lab's ranks with it):

# %% tags=["nbval-ignore-output"]
THREE = exchange.attempt(labutils.launch, exchange.source_as_written, backend="gloo", world_size=3,
                         timeout=60, output="quiet")
print(f"source as written, gloo, 3 ranks -> {THREE['status']}: {THREE['message'].split('. HINT')[0]}")

# %% [markdown]
# ### 1d · The exchange on GPUs: what happened, and why
# The runs started in 1a, collected (live with 2 GPUs, else as recorded on 2×H200 by this same code).
# `evidence` is the line that decided the outcome (cut at whole words; `…` marks text left out);
# `rank 0's steps` is how far rank 0's host got (a step printed is a call that returned). With `NCCL_DEBUG`
# set, NCCL writes its log to a rank's standard output unless `NCCL_DEBUG_FILE` names a file, so its lines
# (its version, its warnings) arrive among the script's steps: the harness takes them out of the steps, and
# the `NCCL WARN` column shows the first `NCCL WARN` line of any rank, from either output. `seconds` is each
# variant's own time, from the start of its processes to the exit of its last rank (a rank killed at the
# timeout: until its kill); it includes starting Python, importing torch and creating the communicator.

# %%
pd.set_option("display.max_colwidth", None)   # tables show whole lines: a message cut short misleads

# %% tags=["nbval-ignore-output"]
EXCHANGE = recorded.live_or_recorded("03_exchange_variants", lambda: EXCHANGE_RUNS.wait(), gpus_needed=2)
display(repro.table(EXCHANGE.data))
claims.show(CLAIMS["03_exchange_variants"](EXCHANGE.data), EXCHANGE)
print(f"your prediction: {my_prediction_gpu}")

# %% [markdown]
# Nothing of those runs is left behind, whether it completed, crashed or hung — and neither is a rank
# of the aborted 3-rank launch in 1c (the lab's pools stay until its end):

# %%
print(f"processes still running the reproducer: {len(repro.leftover_processes(EXCHANGE_SCRIPT))}")
POOL_PIDS = {pid for pool in (POOL, GLOO, CHECKERS) for pid in pool.status().pids}
print(f"labutils rank processes besides the pools: {len(procs.leftover_ranks(ignore=POOL_PIDS))}")

# %% [markdown]
# **Why the source's order can never be trusted on GPUs.** NCCL's `ncclSend` and `ncclRecv` are each a
# GPU kernel, and the NCCL documentation says: *"This operation is blocking for the GPU. If multiple
# ncclSend() and ncclRecv() operations need to progress concurrently to complete, they must be fused
# within a ncclGroupStart()/ncclGroupEnd() section."* An unbatched `dist.isend` or `dist.irecv` is one
# such call, enqueued on the stream of the communicator it uses, and both requests to the same peer land
# on the **same stream** (ProcessGroupNCCL warns: *"unbatched P2P ops are treated as independent
# collective ops, and are thus serialized with all other ops on this ProcessGroup"*). So each rank's
# receive is queued behind its own send. If a send can finish only once its receive runs, every rank
# waits for a receive that is queued behind the peer's send: a circular wait, **on the GPU**. The host
# does not notice — `isend`, `irecv` and `wait()` all return (section 2) — and the program stops only
# where something needs the data, in the source at `print(final_result)`.
#
# Whether a send can finish before its receive is posted is up to NCCL: a message that fits its internal
# buffers may get through, "but this is not guaranteed" (an NCCL maintainer, NVIDIA/nccl#1252). That is
# what the pre-connected variant tests, and why its verdict says nothing about another message size or
# another machine. When both ranks post their *receive* first, no buffer helps: a receive ends only when
# data arrives, and the data's send is queued behind the peer's receive. That deadlock is by design
# (1e).
#
# **Why it can crash instead of hanging.** NCCL connects two ranks lazily, at their first point-to-point
# call to each other, and sets up what the calls of that moment need: for a lone send, the sending side.
# For two ranks that talk to each other, NCCL's set-up (`ncclTransportP2pSetup`) sends the peer one
# message with this rank's connection details and assumes that the peer's message mirrors it: my send
# side meets your receive side. In the source's order the first call of *both* ranks is a send, so each
# rank receives the peer's *send-side* details and wires its own send connection with them, as if they
# described where the peer receives. The send kernel then writes into, and waits on, memory that is not
# the peer's receive buffer. The defect is diagnosed in NVIDIA/nccl pull request #2407 (*"both ranks do
# `ncclSend` and then `ncclRecv` without a group … each rank ends up passing the peer's send-side info to
# its own send connector"*), and NVIDIA's reviewer confirmed the diagnosis there. NCCL's documentation
# allows this order to block (the circular wait above); crashing is not part of the contract.
#
# What the miswired connection does next depends on how NCCL mapped the peer's memory: with `cuMem`
# (NCCL's default on recent versions) through CUDA virtual-memory handles, with `NCCL_CUMEM_ENABLE=0`
# through CUDA IPC handles. That is why the `NCCL_CUMEM_ENABLE=0` variant is in the table, and why its
# outcome may differ from the as-written one. The program's own tensors play no part: every `isend` reads
# `result`, every `irecv` writes a buffer of exactly `result`'s size, and all of them live until the end.
# The second verdict weighs the evidence: if the pre-connected exchange completes — same tensors, same
# calls, only the connection already set up by a matched pair — and the other memory mapping changes the
# failure, the fault lies in setting up the connection, not in the program's memory use. An illegal memory
# access on the GPU is reported wherever the host next asks CUDA: NCCL's watchdog thread (it aborts the
# process), or the next NCCL call — `irecv`'s own connection set-up included (it raises
# `DistBackendError`). Rank 0's steps in the table show how far its host got.
#
# The fix is the same for the crash and for the deadlock: post a rank's sends and receives together — the
# third verdict: in one `batch_isend_irecv` both ranks set up both directions at once, so their set-up
# messages mirror each other, and the operations progress together — or in an order in which every send
# meets a posted receive.

# %% [markdown]
# ### 1e · A genuine deadlock, on purpose
# The last variant is the textbook deadlock, kept apart from the crash: the pair is connected first
# (so NCCL's set-up plays no part), then both ranks post `irecv` before `isend`. Its outcome, from the
# same runs:

# %% tags=["nbval-ignore-output"]
DEADLOCK = EXCHANGE.data["variants"]["pre-connected, both ranks receive first"]
print(f"{DEADLOCK['status']}: {DEADLOCK['evidence']}")
for r, rank_run in enumerate(DEADLOCK["ranks"]):
    print(f"  rank {r}: " + " -> ".join(rank_run["steps"]))

# %% [markdown]
# A `HANG` printed by the script means every step returned on the host and only the GPU never finished
# (the script looks only after `wait()` returned). A program without that check blocks silently at its
# first use of the data (the source's `print(final_result)`), until NCCL's watchdog aborts it at the
# process group's timeout (ten minutes by default); `labutils.launch` stops a launch at its own, shorter
# timeout (lab 05 reads such a hang in detail). gloo is different: it
# progresses each `isend`/`irecv` in its own threads, so the source's order completes there (1c), but a
# *blocking* `dist.send` on every rank deadlocks gloo as surely (`tests/test_p2p.py` shows it).

# %% [markdown]
# ### 1f · Three fixes, verified
# Every rank now draws the *same* seeded tensor (`exchange.source_input`), the tensors live on the rank's
# device, each buffer has its sender's chunk size, and the pieces are concatenated in rank order. The
# exchange three ways:
# * **ordered send/recv**: pairs `(i, j)`, `i < j`, in one global order; the lower rank sends first, the
#   higher rank receives first, so every send meets a receive that is already posted;
# * **`batch_isend_irecv` with `P2POp`**: all sends and receives of a rank in one batch — one
#   `ncclGroupStart`/`ncclGroupEnd` under NCCL, so they progress together, in any order;
# * **`all_gather_into_tensor`**: the collective made for the job (uneven chunks padded to the largest,
#   then trimmed). `compat.all_gather_into_tensor` calls it under the name this torch version prefers.

# %%
def receive_buffers(result, rows):
    """One buffer per rank, sized for that rank's chunk; our own slot is our result (nothing to receive)."""
    buffers = [result.new_empty(r, *result.shape[1:]) for r in rows]
    buffers[dist.get_rank()] = result
    return buffers


def gather_ordered(result, rows):
    """Blocking send/recv, deadlock-free by order: pairs (i, j), i < j, in one global order; in each pair
    the lower rank sends first and the higher rank receives first."""
    rank, parts = dist.get_rank(), receive_buffers(result, rows)
    for i, j in itertools.combinations(range(dist.get_world_size()), 2):
        if rank == i:
            dist.send(result, dst=j)
            dist.recv(parts[j], src=j)
        elif rank == j:
            dist.recv(parts[i], src=i)
            dist.send(result, dst=i)
    return torch.cat(parts, dim=0)


def gather_batched(result, rows):
    """Every send and receive of this rank in one batch_isend_irecv (one ncclGroupStart/End under NCCL):
    they progress together, so their order in the list does not matter."""
    rank, parts = dist.get_rank(), receive_buffers(result, rows)
    ops = []
    for i in range(dist.get_world_size()):
        if i != rank:
            ops += [dist.P2POp(dist.isend, result, i), dist.P2POp(dist.irecv, parts[i], i)]
    for req in dist.batch_isend_irecv(ops) if ops else []:
        req.wait()
    return torch.cat(parts, dim=0)


def gather_collective(result, rows):
    """The collective made for the job. all_gather_into_tensor needs equal pieces: pad every chunk to the
    largest, gather, trim."""
    n, m = dist.get_world_size(), max(rows)
    padded = result.new_zeros(m, *result.shape[1:])
    padded[: result.shape[0]] = result
    out = result.new_empty(n * m, *result.shape[1:])
    compat.all_gather_into_tensor(out, padded)
    return torch.cat([out[k * m: k * m + rows[k]] for k in range(n)], dim=0)


# %% [markdown]
# Each result is compared bit for bit with the one-device reference `tensor * 2` on every rank (the same
# output under gloo and NCCL):

# %%
FIXES = {"ordered send/recv": gather_ordered, "batch_isend_irecv (P2POp)": gather_batched,
         "all_gather_into_tensor": gather_collective}
exchange.fixes_table(POOL.run(exchange.verify_fixes, FIXES))

# %% [markdown]
# ## 2 · What `wait()` really guarantees
# For an NCCL request, `Work.wait()` is, in PyTorch's words, *"the same as calling synchronize():
# Letting the current stream block on the completion of the NCCL work"*. It orders the **current CUDA
# stream** after the transfer; it does not block the host (unless you pass a timeout). For a gloo
# request, `wait()` blocks the host until the transfer is done. Two bugs follow:
# * reading a receive buffer before `wait()` (or on a stream that `wait()` did not order) reads whatever
#   was there before;
# * writing a send buffer before the send has completed changes what the peer receives.
#
# `wait.wait_semantics_gloo` and `wait.wait_semantics_nccl` make both mistakes on purpose, between ranks
# 0 and 1; the sender's data is ready only after a delay (`delay_s` of host sleep on gloo, a GPU sleep of
# `delay_ms` under NCCL).

# %%
my_prediction_wait_ms = None   # ✍ ms the receiver's host spends inside req.wait() under NCCL, data ready after 100 ms

# %% [markdown]
# gloo, live on every machine:

# %%
gw = GLOO.run(wait.wait_semantics_gloo)[1]
print(f"gloo: wait() blocked the host until the data arrived: {gw['wait_ms'] >= 150}")
print(f"gloo: a copy of the receive buffer taken before wait() holds the old zeros: {gw['early_read_stale']}")
print(f"gloo: after wait() the buffer holds the data: {gw['after_wait_ok']}")
print(f"gloo: writing the send buffer before wait() changed what arrived: {gw['send_race_fraction'] > 0}")

# %% [markdown]
# NCCL (live with 2 GPUs, else recorded on 2×H200):

# %% tags=["nbval-ignore-output"]
W = recorded.live_or_recorded("03_wait_nccl", lambda: POOL.run(wait.wait_semantics_nccl)[1], gpus_needed=2)
wd = W.data
display(pd.DataFrame({"measured": {
    "host time inside req.wait() (ms)": round(wd["wait_ms"], 3),
    "host time until torch.cuda.synchronize() returned (ms)": round(wd["sync_ms"], 1),
    "copy on the current stream before wait() was stale": wd["early_read_stale"],
    "copy on the current stream after wait() was correct": wd["after_wait_ok"],
    "copy on another stream after wait() was stale": wd["other_stream_stale"],
    "received elements the sender overwrote after isend returned": f"{wd['send_race_fraction']:.1%}"}}))
claims.show(CLAIMS["03_wait_nccl"](wd), W)
labels, values = ["host time in wait()", "until synchronize()"], [wd["wait_ms"], wd["sync_ms"]]
if my_prediction_wait_ms is not None:
    labels, values = labels + ["your prediction"], values + [float(my_prediction_wait_ms)]
plots.bar_plot(labels, values, ylabel="ms", annotate="{:.3g}", title=f"wait() under NCCL ({W.label})")

# %% [markdown]
# **What it says.** Under NCCL `wait()` only makes the current stream wait; the first verdict compares the
# host's time inside `wait()` with the time until the data was there (`synchronize()`). A host that is
# free while the data moves is what makes "the GPU can keep computing" possible, and it can keep *issuing*
# work too. The price is that ordering is your job:
# * use the data on the **current stream after `wait()`**: correct; on another stream, first make that
#   stream wait (`side.wait_stream(torch.cuda.current_stream())`, or call `req.wait()` inside
#   `with torch.cuda.stream(side):`). The "another stream" row above is a race: whether that copy ran
#   before the data arrived depends on timing;
# * don't write a buffer you passed to `isend` until `wait()` (work on the current stream after it is then
#   ordered after the send). ProcessGroupNCCL's `recordStream` keeps the *memory* alive until the send is
#   done, not its *contents*. The share of overwritten elements is what one run saw; it depends on when
#   NCCL's kernel reads the buffer, so it can be anything from none to all: it is a race.

# %% [markdown]
# ## 3 · Overlap, measured
# The claim, made measurable: run a compute kernel and a transfer **back to back**, then **overlapped**
# (the transfer with `async_op=True` on its own stream, the compute on the current one), and compare
# with each alone:
#
# $$E = \frac{t_\text{compute} + t_\text{comm} - t_\text{overlapped}}{\min(t_\text{compute}, t_\text{comm})}$$
#
# (this course's overlap efficiency): $E = 1$ if the shorter one is completely hidden, $E = 0$ if
# overlapping gains nothing, $E < 0$ if together is *slower* than back to back. Each verdict's rule says
# which E counts as hidden (TRUE) and which as partly hidden (PARTLY): the upper threshold leaves room for
# the few percent a sample varies; the lower one separates a real gain from none.
#
# The experiment moves 256 MiB (float32) against two kinds of compute — a bf16 matmul that
# keeps every SM busy, and a memory-bound `x *= 1` over 256 MiB — each repeated `k` times, `k` picked from
# one kernel's and one transfer's time so that compute alone comes close to the transfer alone (the table
# prints both; E divides by the shorter). The transfers:
# * NCCL `all_reduce`, and an NCCL send/recv pair to the ring neighbours: kernels on the SMs;
# * a copy into a buffer on the next GPU by the GPU's **copy engines** (DMA units, no kernel), three ways:
#   `Tensor.copy_` on every rank; `copy_` on rank 0 only; and the bare `cudaMemcpyAsync` that `copy_`
#   issues, called directly (through ctypes), on every rank.
#
# Times are CUDA events on the streams that do the work, medians of 10 samples of the slowest rank.
#
# **The overlapped step** is the code below: the whole of what "while the data moves, the GPU can keep
# computing" asks you to write. `transfer()` issues the transfer (`async_op=True`, or a copy) and returns
# its works; `compute()` queues the compute on the current stream. On GPUs the step puts the transfer on a
# side stream, so that waiting for it holds up that stream and not the compute, and makes the current
# stream wait for the side stream only at the end, where the data is needed. Under gloo there are no
# streams: `wait()` blocks the host, so the step simply waits after computing. `overlap.overlap_experiment`
# is the harness around it: it picks `k`, times compute alone, the transfer alone and the two back to back,
# then runs this step, with marks where the step puts each part (the transfer it hands the step marks its
# start and, at the last `wait()`, its end on the stream that waits; `compute` marks its own end).

# %%
def overlapped_step(compute, transfer, side):
    """Start the transfer, compute while it is in flight, then wait for it. side: a CUDA stream, or None."""
    if side is None:                   # CPU (gloo): the transfer progresses in gloo's own threads
        works = transfer()
        compute()                      # the host computes meanwhile
        for w in works:
            w.wait()                   # blocks the host until the transfer is done
        return
    main = torch.cuda.current_stream()
    side.wait_stream(main)             # the transfer starts after what was issued before it
    with torch.cuda.stream(side):
        for w in transfer():           # NCCL's kernel, or a copy queued on `side`
            w.wait()                   # `side` waits for NCCL's stream; the host goes on at once
    compute()                          # queued on the current stream while the transfer runs
    main.wait_stream(side)             # from here on, the current stream also waits for the transfer


# %%
my_prediction_efficiency = None   # ✍ E for matmul + NCCL all_reduce, a number between -1 and 1
my_prediction_copy_efficiency = None   # ✍ E for matmul + peer copy_ on every rank (copy engines, no SMs)

# %% tags=["nbval-ignore-output"]
OV = recorded.live_or_recorded("03_overlap", lambda: POOL.run(overlap.overlap_experiment, overlapped_step,
                                                              OVERLAP_BYTES)[0], gpus_needed=2)
cases = {f"{c['compute']} + {c['transfer']}": c for c in OV.data["cases"]}
print(f"transfer: {bandwidth.format_size(OV.data['size_bytes'])} on {OV.data['world_size']} ranks ({OV.label})")
display(pd.DataFrame.from_dict({name: {"k": c["k"], "compute (ms)": c["compute_ms"], "transfer (ms)": c["comm_ms"],
                                       "back to back (ms)": c["serial_ms"], "overlapped (ms)": c["overlapped_ms"],
                                       "E": c["efficiency"], "reading": overlap.describe_efficiency(c["efficiency"])}
                                for name, c in cases.items()}, orient="index").round(3))
fig = plots.bar_plot([f"{c['compute'].split(' (')[0]}\n+ {c['transfer']}" for c in cases.values()],
                     [c["efficiency"] for c in cases.values()], ylabel="overlap efficiency E", annotate="{:+.2f}",
                     title=f"Overlap efficiency, {bandwidth.format_size(OV.data['size_bytes'])} ({OV.label})")
for label in fig.axes[0].get_xticklabels():
    label.set(rotation=35, fontsize=8)
for value, style, label in ((my_prediction_efficiency, "--", "your prediction (all_reduce)"),
                            (my_prediction_copy_efficiency, ":", "your prediction (copy_)")):
    if value is not None:
        fig.axes[0].axhline(float(value), color="r", linestyle=style, label=label)
        fig.axes[0].legend(fontsize=8)
fig

# %% tags=["nbval-ignore-output"]
claims.show(CLAIMS["03_overlap"](OV.data), OV)

# %% [markdown]
# The timeline of rank 0's last back-to-back and overlapped samples, for a matmul with an NCCL all_reduce,
# with `copy_` on every rank, and with the bare `cudaMemcpyAsync`. Bars are CUDA events on the compute
# stream and on the stream that waits for the transfer.

# %% tags=["nbval-ignore-output"]
def short(name):
    return name.split(" + ")[1]


shown = [n for n in cases if n.startswith("matmul") and any(t in n for t in ("all_reduce", overlap.PEER_COPY, overlap.PEER_MEMCPY))
         and overlap.PEER_COPY_ONE not in n] or list(cases)[:2]
plots.timeline_plot([dict(s, lane=f"{short(n)} | {s['lane']}") for n in shown for s in cases[n]["spans"]],
                    title=f"matmul and a transfer, back to back vs overlapped, rank 0 ({OV.label})")

# %% [markdown]
# Explore every case (widget; in a static view only the default case's numbers show):

# %% tags=["nbval-ignore-output"]
import ipywidgets as widgets


def show_case(case):
    c = cases[case]
    print(f"{case}: compute {c['compute_ms']:.3f} ms, transfer {c['comm_ms']:.3f} ms, back to back "
          f"{c['serial_ms']:.3f} ms, overlapped {c['overlapped_ms']:.3f} ms -> E = {c['efficiency']:+.2f}")
    display(plots.timeline_plot(c["spans"], title=f"{case} ({OV.label})"))


widgets.interact(show_case, case=widgets.Dropdown(
    options=list(cases), value=shown[0], description="case", style={"description_width": "initial"},
    layout=widgets.Layout(width=f"{max(len(n) for n in cases) + 12}ch")));

# %% [markdown]
# **Where overlap helps and where it cannot.** Overlap hides a transfer only as far as the transfer and
# the compute do not need the same part of the GPU. Where the verdicts above read PARTLY they do, and the
# part they share differs by pair:
#
# * **matmul + NCCL** (`all_reduce`, send/recv). An NCCL transfer is itself a kernel: one thread block per
#   channel, each resident on an SM for the whole transfer. A bf16 matmul is sized to keep every SM busy,
#   so while both run the matmul has fewer SMs, and NCCL's blocks start only where SMs free up. Each slows
#   the other, so the overlapped time stays above the longer of the two alone: E below 1.
# * **memory-bound kernel + NCCL.** `x *= 1` over 256 MiB is limited by HBM bandwidth, not by SMs. NCCL's
#   kernels move every byte through memory too: between processes the data lands in a buffer of NCCL's
#   own on the receiving GPU, and the receiving kernel copies it out into the destination, so each byte
#   is read and written more than once. Both want the bandwidth that limits each of them, and overlapping
#   them can only gain what the memory system has to spare: a small E is what that competition looks like.
# * **copy engine + compute.** A copy engine needs no SMs, so a copy has nothing to share with a matmul
#   but memory bandwidth, of which a matmul uses little; the `rank 0 only` and `cudaMemcpyAsync` verdicts test
#   that. Its bytes still cross HBM — it reads this GPU's memory and writes the other GPU's — but only at the
#   rate the link between the GPUs carries them, a fraction of what HBM gives a kernel, and it takes no SM from
#   the memory-bound kernel. An NCCL transfer takes both: SMs for its blocks, and HBM for every byte it moves
#   through its own buffers. Whether that makes the difference is the verdict that puts every copy-engine case
#   next to a memory-bound kernel against every NCCL case there (on the rank-0-only row, the other GPU takes in
#   no copy: compare it with the rows where both ranks copy to see what the second direction costs).
#
# That leaves `copy_` on every rank behind a matmul: where it hides less than the bare `cudaMemcpyAsync` on
# every rank, the difference is what `copy_` does around the copy. Which engine ran the copy, and which
# CUDA calls the host made for it, is in a profiler trace of one copy (rank 0's; live with 2 GPUs, else as
# recorded):

# %% tags=["nbval-ignore-output"]
PROFILES = OV.data.get("profiles", {})
for name, p in PROFILES.items():
    print(f"{name}:")
    for g in p["gpu"]:
        print(f"  GPU {g['device']}: {g['name']} on the {g['engine']} ({g['dur_us']:.0f} us)")
    print("  CUDA runtime calls: " + ", ".join(f"{k} x{v}" for k, v in p["runtime"].items()))
if not PROFILES:
    print("this recording holds no profile (it predates the trace); run the lab on 2 GPUs to make one")

# %% [markdown]
# PyTorch's `copy_` between two GPUs is written to issue one `cudaMemcpyAsync` — a copy engine, no SMs —
# plus two events and two stream waits, and its source says why (`aten/src/ATen/native/cuda/Copy.cu`):
# *"We always perform the copy on the source device, using the current stream on the source device, and we
# fully synchronize on both src and dst's current streams for completion of the copy."* Before the copy,
# the copy stream waits for an event recorded on the **destination GPU's current stream**; after it, that
# stream waits for the copy. The trace above, and the last two verdicts of the overlap cell, check that
# this is what ran on the machine that measured. Within one process that makes the copy wait for whatever the destination GPU's current
# stream was doing, and makes everything issued there afterwards wait for the copy.
#
# In this lab each rank is its own process, and each rank's copy goes *to the other rank's GPU*, where the other
# rank is computing. `copy_`'s events on that GPU are recorded and waited on in *this* process's context
# there. A GPU without MPS (NVIDIA's Multi-Process Service) does not run kernels of two processes side by
# side: it time-slices between their contexts, so work that one process queues on a GPU busy with another
# process's kernels may wait for its turn. The three copy cases separate what costs: `copy_` on rank 0
# only puts such foreign work on one GPU; the bare `cudaMemcpyAsync` on every rank copies in both
# directions with no foreign work; `copy_` on every rank does both at once. Their verdicts say which of
# them hides on the machine that measured. If only the last falls short, neither a barrier on one GPU nor two copies
# explains it alone — it takes barriers of both processes on both GPUs. The profiler in this measurement sees one
# process, not how the GPU scheduled the two; a system-wide trace of both ranks (`nsys profile`) or the
# same run under MPS would show it. The lesson does not depend on that detail: "a copy engine needs no
# SMs" does not make a copy free to overlap — the API around it decides what it waits for.

# %% [markdown]
# The source's own example overlaps nothing: it calls `wait()` right after posting the requests and
# computes nothing in between. Overlap is something you arrange (issue the transfer early, give the GPU
# independent work, synchronise only where the data is needed), and it pays only as far as the transfer
# and the compute do not compete for SMs, memory bandwidth — or, with copies, for the streams they wait on.

# %% [markdown]
# ### 3a · Exercise 1: keep a transfer in flight while the next piece is computed
# In training, the data to send is not ready all at once: backward produces the gradients layer by layer, and
# data parallelism all-reduces each one. Write `my_pipelined_all_reduce(chunks, produce)`: `produce(i)` writes
# chunk `i` (call it for `i = 0, 1, …` in order); afterwards every chunk must hold its sum over the ranks, as
# `dist.all_reduce` leaves it. Arrange it so that each chunk's all-reduce is **in flight while the next chunk is
# produced**: start it as soon as its chunk exists, without waiting, and wait only where the data is needed —
# once the last chunk is produced. The checker runs your function on `CHECKERS`' three CPU ranks, with a log of
# when each `all_reduce` is issued and each work waited for, and a ledger of what was sent; it judges the order
# as well as the sums.

# %% nbgrader={"grade": false, "grade_id": "pipelined_all_reduce", "locked": false, "schema_version": 3, "solution": true}
def my_pipelined_all_reduce(chunks, produce):
    """Sum every chunk over the ranks, in place; each chunk's all-reduce in flight while the next is produced."""
    ### BEGIN SOLUTION
    from labutils.solutions import lab03 as solution  # the instructor's edition runs the reference answer
    solution.pipelined_all_reduce(chunks, produce)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_pipelined_all_reduce", "locked": true, "points": 2, "schema_version": 3, "solution": false}
check.pipelined_all_reduce(my_pipelined_all_reduce, pool=CHECKERS)

# %% [markdown]
# ### 3b · One GPU: copies beside a matmul, and a missing `wait_stream`
# Overlap needs no second GPU. A GPU has **copy engines**: DMA units that move data between host memory and
# the GPU while the SMs compute. `gpu_tensor.copy_(host_tensor, non_blocking=True)` from **pinned** (page-locked)
# host memory is one such copy, queued on the current stream; from ordinary (pageable) memory CUDA first stages
# the data through a pinned buffer of its own, and the call is then not asynchronous with respect to the host
# (CUDA Runtime API, "API synchronization behavior"). Work on one **stream** runs in order; work on two
# streams may run at the same time. Three tools order work across streams, all on the GPU, none blocking the
# host:
# * an **event** is a point on a stream's timeline (`timing.Clock` marks are events; `elapsed_ms` reads two);
# * `side.wait_stream(main)`: work issued on `side` from now on waits for everything issued on `main` so far;
# * so the pattern for a copy on a side stream is a wait *before* it (`side.wait_stream(main)`: its source has
#   been written) and a wait *after* it (`main.wait_stream(side)`: whoever next reads or overwrites the data
#   on `main` waits for the copy).
#
# `beside` below is that pattern; `one_gpu_overlap` runs a bf16 matmul `k` times on the current stream with a
# 256 MiB copy on a side stream, each direction in turn, and `streams.overlap_cases` times the compute alone,
# the copy alone, the two back to back and the two overlapped (CUDA events on the current stream, medians of
# 10), with `k` chosen so that the compute alone takes about as long as the copy alone. E is section 3's
# overlap efficiency, judged with the same thresholds.

# %%
my_prediction_one_gpu_efficiency = None   # ✍ E for a matmul beside a host -> GPU copy on a side stream, -1 to 1

# %%
def matmul_k(a, b, c):
    """The compute: k bf16 matmuls on the current stream."""
    def run(k):
        for _ in range(k):
            torch.mm(a, b, out=c)
    return run


def beside(compute_k, transfer, side):
    """compute_k(k) on the current stream and transfer() on the stream `side`, at the same time."""
    def run(k):
        main = torch.cuda.current_stream()
        side.wait_stream(main)        # the copy starts after everything issued before it: its source is ready
        with torch.cuda.stream(side):
            transfer()                # queued on the side stream: a copy engine runs it
        compute_k(k)                  # queued on the current stream: the SMs run it
        main.wait_stream(side)        # what the current stream does next waits for the copy too
    return run


def one_gpu_overlap(size_bytes=256 << 20):
    """A matmul beside a host -> GPU copy, then beside a GPU -> host copy, each on a side stream."""
    dev, n = torch.device("cuda"), size_bytes // 4
    host_src, host_dst = torch.ones(n, pin_memory=True), torch.empty(n, pin_memory=True)  # pinned: DMA, async
    gpu_dst, gpu_src = torch.empty(n, device=dev), torch.ones(n, device=dev)
    a, b = (torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) for _ in range(2))
    compute, side = matmul_k(a, b, torch.empty_like(a)), torch.cuda.Stream()
    transfers = {"host -> GPU copy_": lambda: gpu_dst.copy_(host_src, non_blocking=True),
                 "GPU -> host copy_": lambda: host_dst.copy_(gpu_src, non_blocking=True)}
    return streams.overlap_cases({name: (compute, t, beside(compute, t, side)) for name, t in transfers.items()},
                                 size_bytes=size_bytes, compute_name="matmul (bf16 4096x4096)")


def copy_then_overwrite(delay, fixed, numel=16 << 20):
    """Step 1's result is saved to the host by a copy on a side stream; step 2 then overwrites it on the
    current stream. Returns the share of the saved elements that hold step 2's value (0 is right)."""
    main, side = torch.cuda.current_stream(), torch.cuda.Stream()
    x = torch.full((numel,), 1.0, device="cuda")  # step 1's result, written on the current stream
    saved = torch.zeros(numel, pin_memory=True)
    side.wait_stream(main)                        # the copy starts after step 1 wrote x
    with torch.cuda.stream(side):
        delay()                                   # the side stream is still busy with earlier work
        saved.copy_(x, non_blocking=True)         # step 1's data -> host
    x.record_stream(side)                         # x's memory is in use on `side` too (for the allocator)
    if fixed:
        main.wait_stream(side)                    # THE FIX: step 2 waits until the copy has read x
    x.fill_(2.0)                                  # step 2 overwrites x
    torch.cuda.synchronize()
    return float((saved == 2.0).double().mean())


def one_gpu_streams():
    data = one_gpu_overlap()
    data["race"] = streams.race_outcome(copy_then_overwrite, delay_ms=20.0, trials=3)
    return data


# %% tags=["nbval-ignore-output"]
ONE = recorded.live_or_recorded("03_one_gpu_streams", one_gpu_streams, gpus_needed=1)
one_cases = {c["transfer"]: c for c in ONE.data["cases"]}
print(f"{bandwidth.format_size(ONE.data['size_bytes'])} copies beside a matmul on one GPU ({ONE.label})")
display(pd.DataFrame.from_dict({name: {"k": c["k"], "compute (ms)": c["compute_ms"], "copy (ms)": c["comm_ms"],
                                       "back to back (ms)": c["serial_ms"], "overlapped (ms)": c["overlapped_ms"],
                                       "E": c["efficiency"], "reading": overlap.describe_efficiency(c["efficiency"])}
                                for name, c in one_cases.items()}, orient="index").round(3))
fig = plots.bar_plot(list(one_cases), [c["efficiency"] for c in one_cases.values()], ylabel="overlap efficiency E",
                     annotate="{:+.2f}", title=f"matmul beside a copy on a side stream, one GPU ({ONE.label})")
if my_prediction_one_gpu_efficiency is not None:
    fig.axes[0].axhline(float(my_prediction_one_gpu_efficiency), color="r", linestyle="--", label="your prediction")
    fig.axes[0].legend(fontsize=8)
fig

# %% [markdown]
# **The race.** `copy_then_overwrite` is a training loop's pattern in two lines: save step 1's result to the host
# on a side stream (a checkpoint, an offloaded activation), then let step 2 overwrite the buffer on the current
# stream. Without `main.wait_stream(side)` nothing orders the overwrite after the copy: whichever the GPU runs
# first wins. To make the outcome reproducible, `delay` keeps the side stream busy for 20 ms first (a <!-- not measured: a setting of the demo, not a result -->
# `torch.cuda._sleep` kernel, standing in for whatever the side stream was still doing); without the delay the
# same race is a matter of timing, and its outcome may differ from run to run. `x.record_stream(side)` is a
# different guarantee: it keeps `x`'s *memory* from being reused while `side` still uses it — never its
# *contents* from being overwritten. Each way runs three times; the table shows the largest share seen:

# %% tags=["nbval-ignore-output"]
race = ONE.data["race"]
display(pd.DataFrame({"side stream busy first": [f"{race['delay_ms']:g} ms", f"{race['delay_ms']:g} ms", "no", "no"],
                      "main.wait_stream(side) before the overwrite": ["no", "yes", "no", "yes"],
                      "saved elements holding step 2's value": [f"{race[k]:.1%}" for k in
                                                                 ("unsynced_delayed", "fixed_delayed", "unsynced", "fixed")]}))
claims.show(CLAIMS["03_one_gpu_streams"](ONE.data), ONE)

# %% [markdown]
# **Reading it.** A copy engine needs no SMs, and a matmul touches little memory for the work it does, so on one
# GPU a copy between host and device has little to share with a matmul: where the first two verdicts are TRUE,
# the copy is hidden. What the copy still shares is the stream order you give it — the same lesson as `copy_`
# between GPUs above, in its simplest form: a missing `wait_stream` is not slower, it is *wrong*, and only the
# checked result shows it. The last two verdicts test exactly that: the overwrite reaches the copy when nothing
# orders them, and the one `wait_stream` puts it right whether the side stream was busy or not.

# %% [markdown]
# ## 4 · Exercise 2: a ring all-gather from isend/irecv
# Ring all-gather on `n` ranks: rank `r` copies its input into chunk `r` of the output; then in step
# `s = 0 … n-2` it sends chunk `(r - s) mod n` to rank `r + 1` and receives chunk `(r - s - 1) mod n`
# from rank `r - 1`. After `n - 1` steps every chunk has gone round the ring; each rank has sent
# `(n-1)/n` of the output, which is why nccl-tests' all_gather bus bandwidth is
# `busbw = S / t × (n-1)/n` with `S` the gathered size.
#
# Write `my_ring_all_gather(output, input)` with the contract of `dist.all_gather_into_tensor`, using only
# `dist.isend`/`dist.irecv` or `dist.batch_isend_irecv` (the checker switches the collectives off while
# your function runs). Section 1 tells you how to post each step's send and receive.
#
# The checker runs your function on **three** CPU ranks (`CHECKERS`), whatever this machine has: on two,
# "send everything to the other rank" *is* a ring, so a wrong algorithm with the right numbers would pass.
# Besides the result it reads a ledger of what each rank sent (`labutils.instruments.ledger.Ledger`, inside
# the ranks: torch's `CommDebugMode` does not see point-to-point operations) and judges the ring itself:
# only sends and receives, every send to rank `r + 1` and every receive from `r - 1`, one message per step,
# and no more bytes per rank than the ring's `(n-1)/n` of the output.

# %% nbgrader={"grade": false, "grade_id": "ring_all_gather", "locked": false, "schema_version": 3, "solution": true}
def my_ring_all_gather(output, input):
    """Fill output (world_size chunks, contiguous) so that chunk k holds rank k's input."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION
    from labutils.solutions import lab03 as solution  # the instructor's edition runs the reference answer
    solution.ring_all_gather(output, input)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_ring_all_gather", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ring_all_gather_fn = check.ring_all_gather(my_ring_all_gather, pool=CHECKERS)

# %% [markdown]
# Now its bus bandwidth against NCCL's `all_gather_into_tensor` on the same buffers, 1 MiB to 256 MiB gathered,
# and against the same all-gather *without* NCCL: each rank copies its GPU data to host memory, gloo gathers
# it over TCP, and the result is copied back to the GPU. That is what moving GPU data between processes costs
# without a library made for GPUs: the comparison behind the source's tip 4.2, "use an efficient library such
# as NCCL".
#
# **How it is timed** (`timing.benchmark_collective`), and how that differs from nccl-tests. Both warm up, then
# time calls issued back to back and divide by their number. nccl-tests (`src/common.cu`) reads a host clock
# around its 20 calls, after synchronizing the stream, once per size, and by default reports the *average over
# the ranks* (`-a 1`; `-a 3` reports the maximum). Here each sample of 10 calls is bracketed by CUDA events on
# the current stream, after a barrier; the sample is the *slowest rank's* (what `-a 3` reports: a collective
# is done when its last rank is), and the figure is the median of 5 samples. The host path is far slower:
# one call per sample, median of 3.

# %%
my_prediction_ring_busbw = None   # ✍ GB/s bus bandwidth of your ring at 256 MiB on 2×H200

# %% tags=["nbval-ignore-output"]
def run_ring_vs_nccl():
    out = POOL.run(measure.ring_vs_collective, ring_all_gather_fn, RING_SIZES, timeout=120)[0]
    return {**out, "implementation": "torch's collective, standing in for your ring" if labutils.checks.is_standin(ring_all_gather_fn) else "yours"}


RING = recorded.live_or_recorded("03_ring_vs_nccl", run_ring_vs_nccl, gpus_needed=2)
rd = RING.data
table = {"size": [bandwidth.format_size(s) for s in rd["size_bytes"]],
         f"ring ({rd['implementation']}) busbw (GB/s)": rd["ring_busbw_gbps"],
         "NCCL all_gather busbw (GB/s)": rd["collective_busbw_gbps"]}
series = {f"ring, batch_isend_irecv ({rd['implementation']})": rd["ring_busbw_gbps"],
          "NCCL all_gather_into_tensor": rd["collective_busbw_gbps"]}
if rd.get("host_busbw_gbps"):
    table["without NCCL: host + gloo busbw (GB/s)"] = series["host memory + gloo (no NCCL)"] = rd["host_busbw_gbps"]
print(f"every result equal to NCCL's: ring {rd['ring_correct']}, host path {rd.get('host_correct')}")
display(pd.DataFrame(table).set_index("size").round(2))
big = len(rd["size_bytes"]) - 1
plots.bandwidth_plot(rd["size_bytes"], series, peak_gbps=HW.link_peak_gbps if RING.live else None,
                     ylabel="bus bandwidth (GB/s)",
                     prediction=(rd["size_bytes"][big], my_prediction_ring_busbw) if my_prediction_ring_busbw is not None else None,
                     title=f"all-gather three ways, {rd['world_size']} ranks ({RING.label})")

# %% tags=["nbval-ignore-output"]
claims.show(CLAIMS["03_ring_vs_nccl"](rd), RING)

# %% [markdown]
# **Reading it.** Without NCCL every byte crosses host memory twice and a TCP socket once, on the CPU; the
# GPUs' links are never used. That is the gap the source's tip is about, and the third verdict gives its
# size on the machine that measured (a threshold of `2` in the ratio: far above any run-to-run spread, so a
# TRUE means the library matters, not the noise).
#
# The hand-written ring *is* NCCL too — each step is an NCCL send/recv — so ring against collective does
# not test "NCCL or not". It tests one fused collective call against a sequence of steps written in
# Python: the ring pays, per step, the Python and launch work of building and posting a batch of P2P
# operations and waiting for it, plus a local copy, where NCCL's all-gather is one call that pipelines
# every step inside one kernel. Per-step costs dominate small messages. On large ones they vanish next to
# the transfer itself, and what is left is the same data movement over the same NCCL connections: with 2
# ranks the ring is one send/recv step each way, which is what NCCL's ring all-gather moves too. That
# common limit — how fast NCCL's kernels move data over this link — is what the second verdict calls
# "bound by the links"; lab 02 compares it with the link's own rate. The first two verdicts judge each end
# on every size in it: "small" up to 4 MiB gathered, "large" from 64 MiB, limits fixed in the lab's code
# before any measurement. 16 MiB, between them, is left to the table: where the cross-over falls depends on
# the machine, and neither claim says.

# %% [markdown]
# ## 5 · Exercise 3: a ring all-reduce
# All-reduce = reduce-scatter + all-gather (Patarasuk & Yuan, 2009). Split the flat tensor into `n`
# chunks with `tensor.view(-1).tensor_split(n)` (every rank gets the same sizes, even when `n` does not
# divide the size). **Reduce-scatter**, step `s = 0 … n-2`: send chunk `(r - s) mod n` to the right,
# receive chunk `(r - s - 1) mod n` from the left into a scratch buffer and add it to your copy;
# afterwards rank `r` holds the full sum of chunk `(r + 1) mod n`. **All-gather**, step `s`: send chunk
# `(r + 1 - s) mod n`, receive chunk `(r - s) mod n`. Each rank sends `2 (n-1)/n` of the tensor:
# nccl-tests' all_reduce bus factor.
#
# Write `my_ring_all_reduce(tensor)`: the contract of `dist.all_reduce(tensor)` (sum, in place). The
# checker judges it as it judged the all-gather, with the all-reduce's cost: `2 (n-1)` messages and
# `2 (n-1)/n` of the tensor per rank. Sending the whole tensor to every peer and adding gives the same sum
# and fails: it sends `(n-1)` tensors per rank, `n/2` times the ring's bytes, a gap that grows with the ranks.

# %% nbgrader={"grade": false, "grade_id": "ring_all_reduce", "locked": false, "schema_version": 3, "solution": true}
def my_ring_all_reduce(tensor):
    """Sum tensor over all ranks, in place, with point-to-point ops only."""
    rank, n = dist.get_rank(), dist.get_world_size()
    ### BEGIN SOLUTION
    from labutils.solutions import lab03 as solution  # the instructor's edition runs the reference answer
    solution.ring_all_reduce(tensor)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_ring_all_reduce", "locked": true, "points": 3, "schema_version": 3, "solution": false}
ring_all_reduce_fn = check.ring_all_reduce(my_ring_all_reduce, pool=CHECKERS)

# %% [markdown]
# ## 6 · Summary: the source's claims, checked
# Every verdict of this lab, formatted from its measurements (live or recorded, as labelled above):

# %% tags=["nbval-ignore-output"]
claims.table(claims.judge(CLAIMS, SRC_NCCL, EXCHANGE, W, OV, ONE, RING))

# %% [markdown]
# **What to remember**
# * NCCL moves CUDA tensors; gloo moves CPU tensors.
# * Unbatched `isend`+`irecv` pairs to the same peer share one NCCL stream: post them together
#   (`batch_isend_irecv`) or in a matching order, and prefer the collective when one exists. A circular
#   wait on the GPU never returns, and the host does not notice until it needs the data. Two ranks whose
#   first calls to each other are both sends also hit a defect in NCCL's lazy connection set-up: another
#   reason to batch.
# * When a program fails inside a library, shrink it to a standalone script and change one thing per run;
#   the variants that pass tell you where the fault is.
# * `wait()` orders the current stream, not the host: use the data on that stream (or make other streams
#   wait), and never write a send buffer before `wait()`.
# * Overlap has to be arranged and measured: it hides a transfer only as far as the two do not compete for
#   SMs, memory bandwidth, or the streams the transfer's API waits on.
#
# **Next: lab 04**, model and pipeline parallelism, where `send`/`recv` and `isend` carry each
# micro-batch's activations and gradients between the stages of a model split across GPUs.

# %%
if GLOO is not POOL:
    GLOO.close()
CHECKERS.close()
POOL.close()
shutil.rmtree(SCRATCH, ignore_errors=True)
