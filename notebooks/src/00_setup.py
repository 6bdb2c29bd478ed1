# %% [markdown]
# # 00 · Setup: your machine, your first ranks, your first bandwidth curve
#
# **Objectives**
# 1. Know which of the course's three hardware modes your machine is in, and how its GPUs are linked.
# 2. Launch ranks from a notebook cell with `labutils.launch`, get their results back, and read their errors and hangs.
# 3. Measure copy bandwidth (host↔GPU, on a GPU, GPU→GPU) over message sizes, fit the alpha–beta model and compare it with the link's physical peak.
#
# **GPUs needed for the live path:** 2 (GPU→GPU); 1 GPU runs the host↔GPU part live; CPU-only runs everything
# else and shows the GPU numbers recorded on 2×H200. **Time:** ~20 min.

# %% [markdown]
# ## Setup
# The first cell describes the machine. Its output depends on the hardware, so the course's tests ignore it;
# the last line, the *fingerprint*, is stamped on every recorded result.

# %% tags=["nbval-ignore-output"]
import time

import torch
import torch.distributed as dist

import labutils
from labutils import bandwidth, hw, plots, procs, recorded
from labutils.labs.lab00_setup import measure
from labutils.checks import lab00 as check

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
# ## 2 · Topology: how are the GPUs linked?
#
# `nvidia-smi topo -m` prints a matrix: `NV18` means the two GPUs are joined by a bonded set of 18 NVLinks;
# `PIX`/`PXB`/`PHB`/`NODE`/`SYS` mean the path goes through PCIe switches, the host bridge or even between
# CPU sockets — one to two orders of magnitude slower. `nvidia-smi nvlink -s` gives each link's speed; their
# sum is the per-direction peak of one GPU's NVLink (H100/H200: 18 × 26.6 GB/s ≈ 478 GB/s, the "900 GB/s"
# of the datasheet counts both directions).

# %% tags=["nbval-ignore-output"]
if HW.links:
    for (i, j), code in sorted(HW.links.items()):
        if i < j:
            print(f"GPU{i} <-> GPU{j}: {code}   peer access: {HW.peer_access.get((i, j))}")
    print(f"NVLink peak per GPU and direction: {HW.link_peak_gbps} GB/s")
else:
    print("No GPU pair on this machine: no links to show. "
          "The reference machine (2×H200) reports GPU0 <-> GPU1: NV18, 18 links × 26.562 GB/s.")

# %% [markdown]
# ## 3 · Your first ranks
#
# `labutils.launch(fn, *args)` runs `fn(rank, world_size, *args)` in `world_size` fresh processes with
# `torch.distributed` initialised (NCCL with one GPU per rank when there are enough GPUs, else gloo on CPU),
# and returns what each rank returned, in rank order. The function can be defined right here in a cell.
#
# **Predict:** each rank contributes `rank + 1` to an `all_reduce` (sum). With 2 ranks, what does every rank hold afterwards?

# %%
my_prediction_sum = None  # ✍ your number

# %%
def hello(rank, world_size):
    device = torch.device("cuda", rank) if dist.get_backend() == "nccl" else torch.device("cpu")
    t = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(t)                      # every rank ends with the same sum
    print(f"all_reduce gives {t.item():g}")
    return t                                # CUDA tensors come back as CPU tensors


results = labutils.launch(hello, world_size=2, backend=BACKEND)
expected = sum(r + 1 for r in range(2))
print("results:", [r.item() for r in results], "| every rank holds", expected, ":",
      all(r.item() == expected for r in results))
check.prediction_sum(my_prediction_sum, world_size=2)

# %% [markdown]
# Which device did each rank use? (Output depends on the machine.)

# %% tags=["nbval-ignore-output"]
def where_am_i(rank, world_size):
    dev = f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})" if dist.get_backend() == "nccl" else "cpu"
    print(f"hello from rank {rank} of {world_size} on device {dev}, backend {dist.get_backend()}")


_ = labutils.launch(where_am_i, backend=BACKEND)

# %% [markdown]
# ### When a rank fails
# An exception in any rank raises `labutils.RankError` in the notebook, naming the rank and carrying its
# traceback; the other ranks are stopped at once (seconds, not the timeout).

# %% tags=["raises-exception"]
def fails_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 has a bug")
    dist.barrier()            # rank 0 would wait here forever: labutils stops it


labutils.launch(fails_on_rank_1, world_size=2, backend=BACKEND)

# %% [markdown]
# ### When ranks hang
# A collective that not every rank calls never returns. `timeout=` bounds the wait: the ranks are killed and
# `labutils.RankTimeout` names those that had not finished. (Lab 05 is all about reading such failures.)

# %% tags=["raises-exception"]
def never_arrives(rank, world_size):
    if rank == 0:
        dist.barrier()        # waits for rank 1 ...
    else:
        time.sleep(3600)      # ... which never arrives


labutils.launch(never_arrives, world_size=2, backend=BACKEND, timeout=20)

# %% [markdown]
# Nothing is left behind: the ranks are gone (this check is the same on every machine).

# %%
print("rank processes still alive:", len(procs.leftover_ranks()))

# %% [markdown]
# ### What a launch costs
# Every launch starts fresh interpreters, imports torch and creates the process group (and, on GPUs, the NCCL
# communicator). Compare the launch's wall time with starting the same number of bare `python -c "import torch"`
# processes. Lab 07 shows the persistent `RankPool` / `%%ranks`, which pays this once.

# %% tags=["nbval-ignore-output"]
def noop(rank, world_size):
    return rank


launch_s = []
for _ in range(3):
    t0 = time.perf_counter()
    labutils.launch(noop, backend=BACKEND)
    launch_s.append(time.perf_counter() - t0)
bare = measure.process_start_s(labutils.default_config(verbose=False).world_size)
print(f"one-shot launch ({BACKEND}): median {sorted(launch_s)[1]:.2f} s over 3 "
      f"(samples {', '.join(f'{s:.2f}' for s in launch_s)}); "
      f"bare process start + import torch: {bare['bare_start_s']:.2f} s")

# %% [markdown]
# ## 4 · Copy bandwidth and the alpha–beta model
#
# Moving S bytes costs a fixed latency α (launch, synchronisation, protocol set-up) plus S/β at the link's
# bandwidth β (Hockney's model):
#
# $$t(S) = \alpha + \frac{S}{\beta}, \qquad \text{bandwidth}(S) = \frac{S}{t(S)} \xrightarrow{S\to\infty} \beta .$$
#
# Small messages are latency-bound, large ones bandwidth-bound; the crossover $n_{1/2} = \alpha\beta$ is the size
# that reaches half of β. We sweep 4 KiB … 1 GiB for copies host→GPU (pinned and pageable memory), GPU→host,
# within one GPU, and GPU0→GPU1, and fit α and β by weighted least squares (`bandwidth.fit_alpha_beta`).
#
# **Predict** the GPU0→GPU1 bandwidth of a 1 GiB copy on the reference machine (2×H200, NV18 = 18 NVLinks of
# 26.6 GB/s per direction), in GB/s:

# %%
my_prediction_gbps = None  # ✍ your number, GB/s, for a 1 GiB copy cuda:0 -> cuda:1

# %% tags=["nbval-ignore-output"]
SIZES = [2**k for k in range(12, 31, 2)]        # 4 KiB ... 1 GiB
local = recorded.live_or_recorded("00_copy_local", lambda: measure.measure_local(SIZES), gpus_needed=1)
peer = recorded.live_or_recorded("00_copy_bandwidth", lambda: measure.measure_peer(SIZES), gpus_needed=2)

# %% tags=["nbval-ignore-output"]
series = {**{k: v for k, v in local.data["gbps"].items()}, **{k: v for k, v in peer.data["gbps"].items()}}
fit_p2p = bandwidth.AlphaBeta(**peer.data["fits"]["cuda:0 -> cuda:1"])
fit_h2d = bandwidth.AlphaBeta(**local.data["fits"]["H2D pinned"])
peak = HW.link_peak_gbps if peer.live else 18 * 26.562
plots.bandwidth_plot(
    local.data["size_bytes"], series, fits={"cuda:0 -> cuda:1": fit_p2p, "H2D pinned": fit_h2d},
    peak_gbps=peak, peak_label="NVLink peak (18 links)",
    prediction=None if my_prediction_gbps is None else (2**30, my_prediction_gbps),
    title=f"copy bandwidth — {local.label} / {peer.label}", logy=True)

# %% tags=["nbval-ignore-output"]
def row(label, m, kind):
    f = m.data["fits"][kind]
    return (f"{label:<18} alpha = {f['alpha_us']:7.2f} us   beta = {f['beta_gbps']:7.1f} GB/s   "
            f"1 GiB: {m.data['gbps'][kind][-1]:7.1f} GB/s   fit error <= {f['max_rel_err']:.0%}   [{m.label}]")


for kind in measure.LOCAL_KINDS:
    print(row(kind, local, kind))
for kind in measure.PEER_KINDS:
    print(row(kind, peer, kind))
g = peer.data["gbps"]["cuda:0 -> cuda:1"][-1]
print(f"\nGPU0 -> GPU1 at 1 GiB reaches {g:.0f} GB/s = {g / peak:.0%} of the {peak:.0f} GB/s NVLink peak; "
      f"n_1/2 = {bandwidth.format_size(fit_p2p.half_bw_bytes)}.")
if HW.pcie_peak_gbps:
    print(f"Host link: PCIe ceiling {HW.pcie_peak_gbps} GB/s per direction; H2D pinned at 1 GiB: "
          f"{local.data['gbps']['H2D pinned'][-1]:.0f} GB/s.")

# %% [markdown]
# **What the curve says**
# * Below a few hundred KiB every copy is latency-bound: the time hardly changes with size, so bandwidth
#   grows linearly with S. Sending many small messages wastes the link — lab 01 tests this claim of the source.
# * Above a few MiB the curves flatten at β. GPU→GPU over NVLink is several times faster than host↔GPU over
#   PCIe, and below the NVLink peak: copy engines and protocol overheads never reach the raw signalling rate.
# * Pageable host memory is slower than pinned: the driver first copies it into a pinned bounce buffer.
# * A copy within one GPU reads and writes every byte: its memory traffic is twice the bandwidth shown.
#
# ## 5 · Exercise: predict a copy from the model
#
# Write `predicted_time_ms(size_bytes, alpha_us, beta_gbps)` returning t(S) = α + S/β in **milliseconds**
# (α in µs, β in GB/s = 1e9 B/s). The checker compares it with the model on a handful of cases.

# %%
def predicted_time_ms(size_bytes, alpha_us, beta_gbps):
    # ✍ your code here: t = alpha + S / beta, in ms
    raise NotImplementedError


check.predicted_time_ms(predicted_time_ms)

# %% [markdown]
# Now use it: the fit predicts a 256 MiB GPU0→GPU1 copy; the measurement (live or recorded) is next to it.

# %% tags=["nbval-ignore-output"]
fn = check.usable(predicted_time_ms)
size = 256 * 2**20
pred_ms = fn(size, fit_p2p.alpha_us, fit_p2p.beta_gbps)
i = peer.data["size_bytes"].index(size)
meas_ms = peer.data["time_ms"]["cuda:0 -> cuda:1"][i]
print(f"256 MiB cuda:0 -> cuda:1: predicted {pred_ms:.3f} ms, measured {meas_ms:.3f} ms "
      f"({(pred_ms - meas_ms) / meas_ms:+.1%}) [{peer.label}]")

# %% [markdown]
# ## Summary
#
# * `hw.describe()` tells the mode (multi-gpu / single-gpu / cpu), the links (`NV18` = 18 NVLinks) and a
#   fingerprint that labels every recorded number.
# * `labutils.launch` runs a notebook function on fresh ranks; failures come back as `RankError` (which rank,
#   its traceback) and hangs as `RankTimeout`, with every process cleaned up.
# * A copy costs α + S/β: latency dominates below n½, bandwidth above. GPU→GPU over NVLink is far faster than
#   host↔GPU over PCIe, and still below the raw link peak.
#
# **Next:** lab 01 takes the first source's `torch.cuda.comm` tutorial, runs its code as written, and measures
# each of its four performance tips.
