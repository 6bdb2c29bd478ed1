# %% [markdown]
# # 00 · Setup: your machine, your first ranks, what joins the GPUs, your first bandwidth curve
#
# **Objectives**
# 1. Know which of the course's three hardware modes your machine is in.
# 2. Launch ranks from a notebook cell with `labutils.launch`, get their results back, and read their errors and hangs.
# 3. Know what joins two GPUs (NVLink, NVSwitch, PCIe) and what each quoted peak means; measure copy bandwidth
#    (host↔GPU, on a GPU, GPU→GPU) over message sizes, fit the alpha–beta model and judge the copies against the peaks.
#
# **GPUs needed for the live path:** 2 (GPU→GPU); 1 GPU runs the host↔GPU part live; CPU-only runs everything
# else and shows the GPU numbers recorded on 2×H200.
# **Time:** 30 min of study (one exercise, two predictions); about 20 s to run on 2×H200, about 8 s on a 2-core CPU.

# %% [markdown]
# ## Setup
# The first cell describes the machine. Its output depends on the hardware, so the course's tests ignore it;
# the last line, the *fingerprint*, is stamped on every recorded result.

# %% tags=["nbval-ignore-output"]
import math
import time

import pandas as pd
import torch
import torch.distributed as dist

import labutils
from labutils import bandwidth, claims, hw, plots, procs, recorded
from labutils.labs.lab00_setup import claims as lab_claims
from labutils.labs.lab00_setup import measure
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
# context and the NCCL communicator), then tear it all down. Lab 07's persistent `RankPool` / `%%ranks` pays
# this once and then runs each cell on the same ranks, with nothing to start.

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
# The common reading of `NV18`, "the two GPUs are wired to each other by 18 NVLinks", is judged from what NVML
# says the links end at. The rule counts GPU 0's links that end at a GPU: the reading is TRUE only if all of
# them do (no line appears where NVML is not available):

# %% tags=["nbval-ignore-output"]
claims.show(lab_claims.topology_verdicts({"topology": TOPO}), TOPO_SOURCE)

# %% [markdown]
# Where the links end at NVSwitch chips (the verdict's figure says where they end), every byte for GPU 1
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
# * *both directions*: if NVLink is full duplex and symmetric, the two directions agree within run-to-run noise
#   (10%);
# * *the prediction*: the fit should predict a size inside the range it was fitted on within 10%.
#
# Each line ends with its source. On one GPU the host -> GPU sweep is live and the GPU -> GPU one recorded: the
# first verdict divides one by the other, so its source is `MIXED` and names where each of its two numbers came from.

# %% tags=["nbval-ignore-output"]
claims.show(lab_claims.copy_verdicts(local.data, peer.data, sources=(local, peer)))

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
# ## 5 · Exercise: predict a copy from the model
#
# Write `predicted_time_ms(size_bytes, alpha_us, beta_gbps)` returning t(S) = α + S/β in **milliseconds**
# (α in µs, β in GB/s = 1e9 B/s). The checker compares it with the model on a handful of cases.

# %% nbgrader={"grade": false, "grade_id": "predicted_time_ms", "locked": false, "schema_version": 3, "solution": true}
def predicted_time_ms(size_bytes, alpha_us, beta_gbps):
    # ✍ your code here: t = alpha + S / beta, in ms
    ### BEGIN SOLUTION
    from labutils.solutions import lab00 as solution  # the instructor's edition: the reference answer
    return solution.predicted_time_ms(size_bytes, alpha_us, beta_gbps)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "check_predicted_time_ms", "locked": true, "points": 2, "schema_version": 3, "solution": false}
check.predicted_time_ms(predicted_time_ms)

# %% [markdown]
# Now use it: the fit predicts a 256 MiB GPU0→GPU1 copy (the last verdict above judges the same prediction);
# the measurement (live or recorded) is next to it.

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
# * `hw.describe()` tells the mode (multi-gpu / single-gpu / cpu), the links (`NV18`: a bonded set of 18 NVLinks on
#   the path; NVML says whether they end at the other GPU or at NVSwitch), the two NVLink peaks (line rate, data
#   rate) and a fingerprint that labels every recorded number.
# * `labutils.launch` runs a notebook function on fresh ranks; failures come back as `RankError` (which rank,
#   its traceback) and hangs as `RankTimeout`, with every process cleaned up.
# * A copy costs α + S/β: latency dominates below n½, bandwidth above; α is mostly the host's cost of one call,
#   which large copies hide behind the transfer. Every verdict of this lab, with the numbers behind it:

# %% tags=["nbval-ignore-output"]
claims.table(lab_claims.all_verdicts(local.data, peer.data, sources=(local, peer)))

# %% [markdown]
# **Next:** lab 01 takes the first source's `torch.cuda.comm` tutorial, runs its code as written, and measures
# each of its four performance tips.
