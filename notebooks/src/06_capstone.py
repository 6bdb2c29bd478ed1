# %% [markdown]
# # 06 · Capstone: benchmark every collective, fit the model, predict the labs
#
# **Objectives**
# 1. Benchmark the seven `torch.distributed` collectives the way nccl-tests does (`python -m labutils bench`),
#    check every result, and read the table: size, count, time, algbw, busbw, #wrong.
# 2. Fit the alpha–beta model per collective and predict — from those fits alone — the communication time of
#    lab 02's tensor-parallel MLP and lab 04's pipeline, then compare with what those labs measured.
# 3. Decide, from your own numbers, which collective to use when.
#
# **GPUs needed for the live path:** 2 (or more). With fewer, the correctness checks run live on gloo ranks and
# the measurements are the ones recorded on 2×H200 by this notebook's own code. **Time:** ~25 min.

# %% [markdown]
# ## Setup
# The first cell describes the machine (its output depends on the hardware).

# %% tags=["nbval-ignore-output"]
import math

import torch
import torch.distributed as dist

import labutils
from labutils import bandwidth, hw, plots, recorded
from labutils.bench import ops, report, sweep
from labutils.bench.config import FORMS, BenchConfig
from labutils.bandwidth import format_size
from labutils.checks import lab06 as check

HW = hw.describe()
MODE = HW.mode
BACKEND = "nccl" if MODE == "multi-gpu" else "gloo"
labutils.default_config()
HW

# %% [markdown]
# ## 1 · An nccl-tests-grade benchmark
#
# [nccl-tests](https://github.com/NVIDIA/nccl-tests) is how NCCL's own developers measure collectives. Its
# method, which `python -m labutils bench` follows:
#
# * buffers for the largest size are allocated once; each size uses a view of them;
# * warm-up calls (communicator set-up, NCCL's proxy threads, caches) at the largest and the smallest size;
# * per size, `iters` calls **back to back** between two timestamps, time / iters — one call alone would mostly
#   measure the launch; we take the median of several such samples and, for each sample, the **slowest rank**
#   (a collective is done when its last rank is done);
# * after timing, inputs filled with **rank- and position-dependent values**, one more call, and every output
#   element compared with the value it must have: `#wrong` counts the elements that are not.
#
# Two bandwidths come out of each time t (`doc/PERFORMANCE.md` of nccl-tests):
#
# $$\text{algbw} = \frac{S}{t}, \qquad \text{busbw} = \text{algbw}\times f(\text{op}, n)$$
#
# S is the size column (for all_gather the gathered output, for reduce_scatter its input, for all_to_all one
# rank's send buffer). The factor f turns algbw into the traffic on the busiest link of a ring, so busbw can be
# compared with the link's peak whatever the op or the number of ranks n: an all_reduce moves 2(n−1)/n·S
# through each rank, an all_gather (n−1)/n·S, a broadcast S.

# %%
print(f"{'collective':<15}" + "".join(f"{f'f(n={n})':>10}" for n in (2, 4, 8)))
for op in bandwidth.OPS:
    print(f"{op:<15}" + "".join(f"{bandwidth.bus_factor(op, n):10.3f}" for n in (2, 4, 8)))

# %% [markdown]
# From a terminal the same benchmark is one command (the README of `benchmarks/` has more):
#
# ```bash
# python -m labutils bench -b 1K -e 1G -f 2 --json bench.json --csv bench.csv --plot busbw.png  # every GPU
# python -m labutils bench --backend gloo -e 4M                     # no GPU: gloo ranks on CPU (labelled)
# torchrun --nproc-per-node 8 -m labutils bench -b 8 -e 1G          # under torchrun, one node or several
# ```
#
# ## 2 · Is every result right?
#
# A benchmark that does not check its results can report a fast *wrong* collective. Here every collective runs
# at four sizes, in place and out of place where `torch.distributed` has both forms, on this machine's ranks
# (NCCL on GPUs, gloo on CPU) — and then a buggy all_reduce that sums a *copy* of the buffer, a classic
# mistake (`dist.all_reduce(x.float())` on a half tensor does the same): it runs, returns, and changes nothing.

# %%
CHECK_CFG = BenchConfig(minbytes=64, maxbytes=4096, stepfactor=4, timed=False, latency=False)


def reduce_a_copy(case):
    """A buggy all_reduce: the sum lands in a temporary, the buffer keeps each rank's own values."""
    dist.all_reduce(case.out.clone(), op=case.op)


def correctness(rank, world_size):
    rows = sweep.sweep(rank, world_size, CHECK_CFG)["rows"]
    buggy = ops.verify_one(rank, world_size, "all_reduce", 1024, run=reduce_a_copy)
    return rows, buggy


rows, buggy = labutils.launch(correctness, backend=BACKEND)[0]
world = labutils.default_config(verbose=False).world_size
for coll in bandwidth.OPS:
    mine = [r for r in rows if r["collective"] == coll]
    print(f"{coll:<15} {' + '.join(FORMS[coll]):<25} {len(mine):2d} results, "
          f"{sum(r['wrong'] for r in mine)} wrong elements")
print(f"\nbuggy all_reduce (sums a copy): every element on every rank is wrong: "
      f"{buggy == world * 1024 // 4} (#wrong = world_size x 256 floats)")

# %% [markdown]
# The check is not a formality: the buggy version would have produced a plausible time and bandwidth.
# (The values are small integers, exact in every datatype, so a sum is compared exactly; a wrong chunk, a
# wrong peer or a stale buffer all show up.)
#
# ## 3 · Measure: the sweep
#
# **Predict** on the reference machine (2×H200, 18 NVLinks of 26.6 GB/s per direction = 478 GB/s per GPU):

# %%
my_prediction_busbw_gbps = None  # ✍ all_reduce busbw at 512 MiB, in GB/s
my_prediction_latency_us = None  # ✍ time of an 8-byte all_reduce, in µs

# %% [markdown]
# A compact sweep — 8 B to 512 MiB in steps of 4, every collective, plus the 8-byte latency line — runs in
# one launch on ≥ 2 GPUs (the table's last line says how long it took); elsewhere the recording made by this
# cell on 2×H200 is shown, labelled.

# %% tags=["nbval-ignore-output"]
SWEEP_CFG = BenchConfig(minbytes=8, maxbytes=512 * 2**20, stepfactor=4, repeat=3)


def measure_sweep():
    result = labutils.launch(sweep.sweep, SWEEP_CFG, timeout=300)[0]
    return {**result, "link_peak_gbps": HW.link_peak_gbps}


SWEEP = recorded.live_or_recorded("06_bench_sweep", measure_sweep, gpus_needed=2)
DOC = report.make_doc(SWEEP.data, fingerprint=SWEEP.fingerprint,
                            link_peak_gbps=SWEEP.data.get("link_peak_gbps"), command="notebook 06",
                            recorded_at=SWEEP.recorded_at)
N = DOC["meta"]["world_size"]
LINK = DOC["link_peak_gbps"]
print("\n".join(report.table_lines(DOC)))

# %% tags=["nbval-ignore-output"]
report.busbw_figure(
    DOC, title=f"busbw vs size — {SWEEP.label}",
    prediction=None if my_prediction_busbw_gbps is None else (512 * 2**20, my_prediction_busbw_gbps))

# %% tags=["nbval-ignore-output"]
S = DOC["summary"]
ar = S["busbw_at_max"]["all_reduce"]
print(f"all_reduce at {format_size(ar['size_bytes'])}: busbw {ar['busbw_gbps']:.0f} GB/s"
      + (f" = {ar['busbw_gbps'] / LINK:.0%} of the {LINK} GB/s link peak" if LINK else "")
      + ("" if my_prediction_busbw_gbps is None else f"; you predicted {my_prediction_busbw_gbps} GB/s"))
print(f"8-byte all_reduce: {S['latency_us']:.1f} µs"
      + ("" if my_prediction_latency_us is None else f"; you predicted {my_prediction_latency_us} µs"))
print(f"peak busbw: {S['peak']['busbw_gbps']:.0f} GB/s ({S['peak']['collective']}, "
      f"{format_size(S['peak']['size_bytes'])}); wrong elements: {S['wrong_total']}   [{SWEEP.label}]")

# %% [markdown]
# **Reading the table**
# * Up to some KiB the time hardly changes with size, whatever the op: that is launch and synchronisation
#   latency, and busbw grows in proportion to S. Bandwidth only shows at large sizes.
# * busbw normalises each op's traffic to what one link carries, so on a ring all_reduce, all_gather and
#   reduce_scatter should reach similar busbw at large sizes — compare the column. broadcast, reduce and
#   send/recv push all S bytes through one direction of a link (factor 1).
# * The peak line compares the best busbw with the physical link (`nvidia-smi nvlink -s`). What stands
#   between them: NVLink packet headers and flow control, NCCL's synchronisation between the steps of its
#   pipelined protocols, and how many channels it runs. `benchmarks/README.md` has the full 1 KiB–1 GiB sweep.
#
# ## 4 · One model per collective: alpha–beta
#
# Each collective's time is fitted with $t(S) = \alpha + S/\beta$ (Hockney; for a ring of n ranks
# α ≈ steps × per-step latency and β = busbw / f — Thakur, Rabenseifner & Gropp 2005). The fit weights
# every point by 1/t, so small messages pin α and large ones pin β.

# %% tags=["nbval-ignore-output"]
FITS = report.fits(DOC)
print(f"{'collective':<15}{'alpha (us)':>11}{'beta (GB/s)':>13}{'bus beta':>10}{'n_1/2':>11}{'max error':>11}")
for coll, fit in FITS.items():
    print(f"{coll:<15}{fit.alpha_us:11.2f}{fit.beta_gbps:13.1f}{fit.beta_gbps * bandwidth.bus_factor(coll, N):10.1f}"
          f"{format_size(fit.half_bw_bytes):>11}{fit.max_rel_err:11.0%}")
print(f"[{SWEEP.label}]")

# %% tags=["nbval-ignore-output"]
SHOW = [c for c in ("all_reduce", "all_gather", "send_recv") if c in FITS]
sizes = sorted({r["size_bytes"] for c in SHOW for r in report.primary_rows(DOC, c)})
series = {c: [{r["size_bytes"]: r["time_us"] * 1e-3 for r in report.primary_rows(DOC, c)}.get(s, math.nan)
              for s in sizes] for c in SHOW}
plots.time_plot(sizes, series, fits={c: FITS[c] for c in SHOW}, title=f"time vs size, alpha–beta fits — {SWEEP.label}")

# %% [markdown]
# Two numbers summarise a collective, but not perfectly: NCCL switches protocol (LL, LL128, Simple) and the
# number of channels with the size, so the real curve is piecewise and the largest errors sit in the middle
# sizes. For a prediction that is good enough — if you stay inside the measured range.
#
# ### Exercise 1 · How big must a message be?
#
# Frameworks bucket small tensors before communicating (PyTorch DDP's default bucket is 25 MiB). Write
# `min_size_for_fraction(fit, fraction)` returning the smallest S (bytes) whose bandwidth S / t(S) reaches
# `fraction` × β under the model (α in µs, β in GB/s). Hint: f = 1/2 gives Hockney's n½ = αβ.

# %%
def min_size_for_fraction(fit, fraction):
    # ✍ your code here: solve S / (alpha + S / beta) = fraction * beta for S (bytes)
    raise NotImplementedError


check.min_size_for_fraction(min_size_for_fraction)

# %% tags=["nbval-ignore-output"]
size_for = check.usable(min_size_for_fraction, "min_size_for_fraction")
for coll in ("all_reduce", "all_gather", "send_recv"):
    if coll in FITS:
        s80 = size_for(FITS[coll], 0.8)
        t = report.time_us_at(DOC, coll, s80)
        meas = "" if t is None else f"; measured there: {s80 / (t * 1e-6) / 1e9 / FITS[coll].beta_gbps:.0%} of beta"
        print(f"{coll:<15} 80% of beta from {format_size(s80)} (DDP's bucket: 25 MiB = "
              f"{25 * 2**20 / s80:.1f}x that){meas}")

# %% [markdown]
# ## 5 · Predict the labs from the fits alone
#
# Lab 02 (tensor-parallel MLP) and lab 04 (pipeline) recorded the communication each of their training steps
# does: for every op, the collective, its size S (as in the table), how many times per step, the time it took
# there (`measured_ms`, one call) and the step time. Knowing only the fits above, how long should that
# communication take?

# %% tags=["nbval-ignore-output"]
SUMMARIES = {}
for lab, what in (("02", "tensor-parallel MLP"), ("04", "pipeline")):
    try:
        SUMMARIES[lab] = recorded.load(f"{lab}_comm_summary")
    except FileNotFoundError as exc:
        print(f"lab {lab} ({what}): no communication summary, so nothing to predict for it.\n  {exc}\n")
        continue
    m = SUMMARIES[lab]
    print(f"lab {lab} ({what}): {len(m.data['ops'])} ops per step, recorded on {m.fingerprint} ({m.recorded_at[:10]})")
    if m.fingerprint.split(" | ")[0] != SWEEP.fingerprint.split(" | ")[0]:
        print(f"  note: the fits come from {SWEEP.fingerprint.split(' | ')[0]}: the comparison mixes machines.")

# %% [markdown]
# ### Exercise 2 · Communication time of a step
#
# Write `predict_step_comm_ms(fits, ops)`: for a list of ops (dicts with `"op"`, `"size_bytes"`,
# `"count_per_step"`), the time in ms that one step spends communicating, from `fits[op].predict_ms(S)` alone.

# %%
def predict_step_comm_ms(fits, ops):
    # ✍ your code here: sum over ops of count_per_step x (alpha + S / beta)
    raise NotImplementedError


check.predict_step_comm_ms(predict_step_comm_ms)

# %% tags=["nbval-ignore-output"]
predict = check.usable(predict_step_comm_ms, "predict_step_comm_ms")
COMPARE = []  # (label, predicted ms per step, measured ms per step)
for lab, m in SUMMARIES.items():
    width = max(len(op["what"]) for op in m.data["ops"]) + 2  # the descriptions are long
    print(f"lab {lab}:")
    print(f"  {'op':<{width}}{'collective':<15}{'size':>10}{'x/step':>7}{'pred us':>10}{'meas us':>10}"
          f"{'pred/meas':>10}{'share of step':>15}")
    pred_total = meas_total = 0.0
    for op in m.data["ops"]:
        coll = bandwidth.canonical_op(op["op"])
        if op["world_size"] != N or coll not in FITS:
            why = f"it ran on {op['world_size']} ranks, the sweep on {N}" if coll in FITS else "no fit for it"
            print(f"  {op['what']:<{width}}{coll:<15} not predicted: {why}")
            continue
        pred = predict(FITS, [{**op, "op": coll}])
        meas = op["measured_ms"] * op["count_per_step"]
        pred_total, meas_total = pred_total + pred, meas_total + meas
        COMPARE.append((f"{lab}: {op['what']}", pred, meas))
        print(f"  {op['what']:<{width}}{coll:<15}{format_size(op['size_bytes']):>10}{op['count_per_step']:>7}"
              f"{pred / op['count_per_step'] * 1e3:10.1f}{op['measured_ms'] * 1e3:10.1f}{pred / meas:10.2f}"
              f"{meas / op['step_ms']:15.0%}")
    if meas_total:
        print(f"        per step: predicted {pred_total:.3f} ms, measured {meas_total:.3f} ms "
              f"(ratio {pred_total / meas_total:.2f})\n")

# %% tags=["nbval-ignore-output"]
def prediction_figure(compare):
    """Predicted vs measured communication per step, one marker per op; on the diagonal the model is right."""
    from matplotlib.figure import Figure
    fig = Figure(figsize=(6.5, 5), layout="constrained")
    ax = fig.add_subplot()
    for lab in sorted({label.split(":")[0] for label, _, _ in compare}):
        pts = [(mm, p) for label, p, mm in compare if label.startswith(lab + ":")]
        ax.plot(*zip(*pts), "o", label=f"lab {lab}")
    lo = min(min(p, mm) for _, p, mm in compare) / 2
    hi = max(max(p, mm) for _, p, mm in compare) * 2
    for k, style in ((1, "k--"), (2, "k:"), (0.5, "k:")):
        ax.plot([lo, hi], [lo * k, hi * k], style, lw=0.8, label="predicted = measured" if k == 1 else
                ("factor 2" if k == 2 else None))
    ax.set(xscale="log", yscale="log", xlabel="measured (ms per step)", ylabel="predicted from the fits (ms per step)",
           title=f"alpha–beta predictions vs the labs — fits: {SWEEP.label}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


prediction_figure(COMPARE) if COMPARE else "no lab summaries to compare with (see the message above)"

# %% [markdown]
# **Why predictions and measurements differ** — read the ratio column:
# * In a real step an op rarely runs alone on idle GPUs: compute kernels share the SMs and memory bandwidth
#   with NCCL's kernels, and a collective issued while the previous kernel still runs waits for it.
# * Sizes between a few KiB and a few MiB sit where NCCL switches protocol; the two-parameter fit is least
#   accurate there (the max-error column above).
# * The labs time what their step does around the op (a copy, a `.contiguous()`, a wait): the benchmark
#   times the bare collective on warm buffers.
# * Lab 04 sends one way, stage to stage; the benchmark's send_recv is nccl-tests' ring, where every rank
#   sends and receives at once. NVLink is full duplex, so the two should cost about the same — the ratio
#   says whether they do.
# A ratio near 1 says the step is communication-as-benchmarked; far below 1 says something else (overlap,
# interference, extra copies) costs time that the α–β model does not see.
#
# ## 6 · What to use when — from your numbers
#
# Several goals can be reached with different collectives. The table times each option from the sweep
# (log-log interpolation between measured sizes) at a small and a large S and names the faster one.

# %% tags=["nbval-ignore-output"]
def option_us(terms, size):
    """Time (us) of a sequence [(collective, times, fraction of S)] at size S, from the sweep."""
    total = 0.0
    for coll, times, frac in terms:
        t = report.time_us_at(DOC, coll, size * frac)
        if t is None:
            return None
        total += times * t
    return total


GOALS = [
    ("every rank needs the sum", {"all_reduce": [("all_reduce", 1, 1)],
                                  "reduce_scatter+all_gather": [("reduce_scatter", 1, 1), ("all_gather", 1, 1)]}),
    ("one rank needs the sum", {"reduce": [("reduce", 1, 1)], "all_reduce": [("all_reduce", 1, 1)]}),
    ("all ranks need rank 0's tensor", {"broadcast": [("broadcast", 1, 1)],
                                        f"{N - 1}x send_recv": [("send_recv", N - 1, 1)]}),
    ("all ranks need every shard", {"all_gather": [("all_gather", 1, 1)],
                                    f"{N}x broadcast of S/{N}": [("broadcast", N, 1 / N)]}),
    ("each rank sends S/n to each", {"all_to_all": [("all_to_all", 1, 1)],
                                     f"{N - 1}x send_recv of S/{N}": [("send_recv", N - 1, 1 / N)]}),
]
SMALL, LARGE = 32 * 2**10, 128 * 2**20
print(f"{'goal':<31}{'options':<42}{format_size(SMALL) + ' (us)':>20}{format_size(LARGE) + ' (us)':>22}   use")
for goal, options in GOALS:
    t = {name: (option_us(terms, SMALL), option_us(terms, LARGE)) for name, terms in options.items()}
    (a, ta), (b, tb) = t.items()
    wins = []
    for k in (0, 1):
        if ta[k] is not None and tb[k] is not None:
            wins.append(f"{a if ta[k] <= tb[k] else b} ({max(ta[k], tb[k]) / min(ta[k], tb[k]):.1f}x)")
        else:
            wins.append("n/a")
    fmt = lambda v: "n/a" if v is None else f"{v:.1f}"
    print(f"{goal:<31}{a + ' | ' + b:<42}{fmt(ta[0]) + ' | ' + fmt(tb[0]):>20}{fmt(ta[1]) + ' | ' + fmt(tb[1]):>22}"
          f"   {wins[0]} at {format_size(SMALL)}, {wins[1]} at {format_size(LARGE)}")
if "all_reduce" in FITS:
    print(f"{'many small tensors':<31}bucket them: all_reduce reaches 80% of beta from "
          f"{format_size(size_for(FITS['all_reduce'], 0.8))}; below n_1/2 = "
          f"{format_size(FITS['all_reduce'].half_bw_bytes)} latency dominates")
print(f"[{SWEEP.label}]")

# %% [markdown]
# ## Summary
#
# The course's claims, checked against this notebook's numbers:

# %% tags=["nbval-ignore-output"]
claims = [("every collective returns the right data", f"{S['wrong_total']} wrong elements in {S['checked']} checked results")]
if LINK:
    claims.append(("busbw approaches the physical link peak",
                   f"peak {S['peak']['busbw_gbps']:.0f} GB/s = {S['peak_fraction_of_link']:.0%} of {LINK} GB/s"))
if FITS:
    worst = max(FITS.items(), key=lambda kv: kv[1].max_rel_err)
    claims.append(("a collective costs alpha + S/beta", f"fits within {worst[1].max_rel_err:.0%} "
                   f"(worst: {worst[0]}) over {format_size(DOC['meta']['config']['minbytes'])}–"
                   f"{format_size(DOC['meta']['config']['maxbytes'])}"))
for lab in SUMMARIES:
    ratios = sorted(p / mm for label, p, mm in COMPARE if label.startswith(lab + ":"))
    if ratios:
        claims.append((f"the fits predict lab {lab}'s communication", f"predicted/measured: median "
                       f"{ratios[len(ratios) // 2]:.2f}, range {ratios[0]:.2f}–{ratios[-1]:.2f} over {len(ratios)} ops"))
for claim, number in claims:
    print(f"{claim:<55} {number}")
print(f"[{SWEEP.label}]")

# %% [markdown]
# * `python -m labutils bench` measures every `torch.distributed` collective the nccl-tests way (warm-up,
#   back-to-back calls, slowest rank, every result checked) and writes the table, CSV/JSON and a busbw plot;
#   it runs standalone, under torchrun (one or more nodes) and on CPU/gloo.
# * busbw makes collectives and world sizes comparable with the link peak; algbw tells how long *your* S takes.
# * Two numbers per collective (α, β) predict a step's communication; where the prediction misses, the step
#   does something the benchmark does not — overlap, interference, extra copies — and that is the next thing
#   to measure.
#
# **Next:** lab 07 keeps ranks alive between cells (`RankPool`, `%%ranks`) so that experiments like these cost
# no start-up.
