"""Lab 02 on one GPU: the MLP that tensor parallelism splits, whole on one device -- its step times and the
TFLOP/s it sustains, the rate the explorer's cost model starts from. Run it::

    from labutils.labs.lab02_tensor_parallel import one_gpu
    data = one_gpu.mlp_baseline([1024, 16384], tokens=4096)    # cuda:0 (or the CPU); JSON-able
    data["rows"][-1]["train_tflops"]

Per hidden size h: ``nn.Sequential(Linear(h, 4h), GELU, Linear(4h, h))`` on ``tokens`` rows in bf16, forward
(under ``no_grad``) and forward + backward, each sample a few back-to-back calls between two CUDA events
(``timing.benchmark``), the median of the samples; the rate is ``cost_model.mlp_flops`` over that time.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ... import timing
from .cost_model import mlp_flops
from .verify import DTYPES


def calls_per_sample(step, target_ms: float, device) -> int:
    """Calls per timed sample so that one sample lasts about ``target_ms`` (1 to 50)."""
    est = timing.benchmark(step, warmup=2, repeat=3, device=device).median_ms
    return min(50, max(1, math.ceil(target_ms / max(est, 1e-3))))


def mlp_baseline(hiddens, *, tokens: int = 4096, dtype: str = "bfloat16", ffn_mult: int = 4,
                 target_ms: float = 10.0, repeat: int = 5, device=None) -> dict:
    """The one-device MLP at every hidden size in ``hiddens``.

    Returns:
        ``{"device", "gpu", "dtype", "tokens", "rows": [{"hidden", "ffn_hidden", "fwd_ms", "train_ms",
        "fwd_tflops", "train_tflops"}]}``.
    """
    dev = torch.device(device if device is not None else ("cuda:0" if torch.cuda.is_available() else "cpu"))
    dt = DTYPES[dtype]
    rows = []
    for h in hiddens:
        f = ffn_mult * h
        mlp = nn.Sequential(nn.Linear(h, f, device=dev, dtype=dt), nn.GELU(), nn.Linear(f, h, device=dev, dtype=dt))
        x = torch.randn(tokens, h, device=dev, dtype=dt, requires_grad=True)
        dz = torch.randn(tokens, h, device=dev, dtype=dt)

        def forward():
            with torch.no_grad():
                mlp(x)

        def train():
            mlp.zero_grad(set_to_none=True)
            x.grad = None
            mlp(x).backward(dz)
        row = {"hidden": h, "ffn_hidden": f}
        for name, step, is_train in (("fwd", forward, False), ("train", train, True)):
            inner = calls_per_sample(step, target_ms, dev)
            ms = timing.benchmark(step, warmup=1, repeat=repeat, inner=inner, device=dev).median_ms
            row[f"{name}_ms"] = ms
            row[f"{name}_tflops"] = mlp_flops(tokens, h, f, train=is_train) / (ms * 1e-3) / 1e12
        rows.append(row)
        del mlp, x, dz
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"device": str(dev), "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
            "dtype": dtype, "tokens": tokens, "rows": rows}
