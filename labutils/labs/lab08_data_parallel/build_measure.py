"""Recording ``08_build_ddp``: the learner's three gradient reductions (naive, overlapped, bucketed) timed on
>= 2 GPUs against DDP under ``no_sync()`` (no communication: the compute floor) and DDP with the same
bucket cap, on a workload whose gradient all-reduce is a large part of the step.

    data = build_measure.build_ddp(pool, naive=my_average_gradients, overlapped=MyOverlappedGradients,
                                   bucketed=MyBucketedGradients)

The workload (``WIDE``): a stack of ``n_layers`` Linear(d, d) + GELU layers, fp32 weights, bf16 autocast,
SGD, ``rows`` rows per GPU and step. Sized so that on 2xH200 (NVLink) the gradients' all-reduce is about a
third of a step without overlap: 32 layers of 2048 -> 134 M parameters, 537 MB of fp32 gradients, about
1.7 ms at the ~320 GB/s bus bandwidth that ``08_ddp`` measured for a 1.2 GB all-reduce; the compute, 6 x
134 M x 1024 flops, about 2.8 ms at the ~300 Tflop/s ``08_ddp``'s step reached. The measurement reports the
fraction itself (``comm_fraction``: the all-reduces alone / (no_sync step + the all-reduces alone)); the
estimate above only chose the size.

Each design trains its own copy of the model (hooks cannot be shared). Timing: ``timing.benchmark_loops``
-- the configurations take turns sample by sample, CUDA events, untimed warm-up steps, each sample the
slowest rank's; *exposed* is the median over samples of (step - no_sync step), sample by sample. The
all-reduces alone: the very all-reduces the bucketed design issues (their sizes read by the ledger), back
to back, without the model, on the same communicator (``timing.benchmark_collective``).
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.profiler import record_function

from labutils import timing
from labutils.config import rank_device
from labutils.instruments.ledger import Ledger

from . import steps
from .build import DESIGNS, AfterBackward

WIDE = {"d_model": 2048, "n_layers": 32, "rows": 1024, "bucket_cap_mb": 25, "warmup": 3, "iters": 2,
        "repeat": 15}
ROWS = ("no_sync", "naive", "overlapped", "bucketed", "DDP")


def wide_mlp(cfg: dict, device=None) -> nn.Sequential:
    """``n_layers`` x (Linear(d, d), GELU): large weights, little compute per byte of gradient."""
    torch.manual_seed(0)
    d = cfg["d_model"]
    layers: list[nn.Module] = []
    for _ in range(cfg["n_layers"]):
        layers += [nn.Linear(d, d, device=device), nn.GELU()]  # initialised on the GPU: seconds less per copy
    return nn.Sequential(*layers)


def n_params(cfg: dict) -> int:
    d = cfg["d_model"]
    return cfg["n_layers"] * (d * d + d)


def hooked_step(module, reduction, optimizer, x, y):
    """One step of a hand-written design: forward (bf16 autocast on GPUs), backward (the hooks fire
    here), ``reduction.finish()``, SGD."""
    dev = x.device.type

    def step():
        optimizer.zero_grad(set_to_none=True)
        with record_function("forward"), torch.autocast(dev, dtype=torch.bfloat16, enabled=dev == "cuda"):
            out = module(x)
        loss = F.mse_loss(out.float(), y)
        with record_function("backward"):
            loss.backward()
        with record_function("finish"):
            reduction.finish()
        with record_function("optimizer"):
            optimizer.step()
    return step


def _sgd(params):
    return torch.optim.SGD(params, lr=1e-4, foreach=True)


def build_ddp_rank(rank, world_size, cfg, naive, overlapped, bucketed) -> dict:
    """Rank side of ``build_ddp``."""
    device = rank_device()
    steps.prepare(device)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(cfg["rows"], cfg["d_model"], generator=g).to(device)
    y = torch.randn(cfg["rows"], cfg["d_model"], generator=g).to(device)
    cap_bytes = int(cfg["bucket_cap_mb"] * 2**20)
    ddp = steps.wrap_ddp(wide_mlp(cfg, device), device, bucket_cap_mb=cfg["bucket_cap_mb"],
                         gradient_as_bucket_view=True)
    ddp_opt = _sgd(ddp.parameters())
    loops = {"no_sync": steps.train_step(ddp, ddp_opt, x, y, sync=False)}
    makers = {"naive": lambda m: AfterBackward(naive, m), "overlapped": overlapped,
              "bucketed": lambda m: bucketed(m, cap_bytes)}
    for name in DESIGNS:
        m = wide_mlp(cfg, device)
        loops[name] = hooked_step(m, makers[name](m), _sgd(m.parameters()), x, y)
    loops["DDP"] = steps.train_step(ddp, ddp_opt, x, y)
    calls = {}
    for name, step in loops.items():  # one step each under the ledger (after DDP's first, bucket-building one)
        step()
        with Ledger() as book:
            step()
        sizes = [r.size_bytes for r in book.records if r.op == "all_reduce"]
        calls[name] = {"all_reduces": len(sizes), "size_bytes": sum(sizes), "sizes": sizes}
    t = timing.benchmark_loops({k: timing.repeated(v) for k, v in loops.items()}, warmup=cfg["warmup"],
                               iters=cfg["iters"], repeat=cfg["repeat"])
    bufs = [torch.empty(s // 4, device=device) for s in calls["bucketed"]["sizes"]]
    alone = timing.benchmark_collective(lambda: [dist.all_reduce(b) for b in bufs], warmup=3, iters=5,
                                        repeat=5)
    floor = t["no_sync"].samples_ms
    rows = []
    for name in ROWS:
        diffs = [a - b for a, b in zip(t[name].samples_ms, floor)]
        rows.append({"name": name, "step_ms": t[name].median_ms, "exposed_ms": statistics.median(diffs),
                     "exposed_samples_ms": diffs, **calls[name]})
    return {"rows": rows, "comm_ms": alone.median_ms}


def build_ddp(pool, naive, overlapped, bucketed, cfg: dict | None = None) -> dict:
    """Recording ``08_build_ddp`` (``build_ddp_rank`` on every rank of ``pool``): per row, the median step,
    the median exposed time (step - no_sync, paired), the all-reduces one step issued; the all-reduces of
    the bucketed design alone; ``comm_fraction``; which designs were the checkers' stand-ins.

    Raises:
        ValueError: a design is missing (None).
    """
    impls = {"naive": naive, "overlapped": overlapped, "bucketed": bucketed}
    missing = [k for k, v in impls.items() if v is None]
    if missing:
        raise ValueError(f"build_ddp measures the code it is given; {missing} is None. HINT: pass the notebook's "
                         "my_average_gradients, MyOverlappedGradients and MyBucketedGradients (or the stand-ins "
                         "their checkers returned).")
    cfg = cfg or WIDE
    results = pool.run(build_ddp_rank, cfg, naive, overlapped, bucketed, timeout=600, output="quiet")
    data = dict(results[0])
    rows = {r["name"]: r for r in data["rows"]}
    data.update(config=dict(cfg), world_size=pool.world_size, n_params=n_params(cfg),
                gradient_bytes=4 * n_params(cfg),
                comm_fraction=data["comm_ms"] / (rows["no_sync"]["step_ms"] + data["comm_ms"]),
                standins={k: bool(getattr(v, "labutils_standin", None)) for k, v in impls.items()})
    if torch.cuda.is_available():
        data["gpu"] = torch.cuda.get_device_name(0)
    return data
