"""Lab 08's workloads: a small CNN for the source's images, and a stack of transformer blocks.

    from labutils.labs.lab08_data_parallel import model
    net = model.ConvNet()                                   # 3x16x16 images -> 10 classes (parts 1-3)
    images, labels = model.image_batch(8, seed=0)           # the same batch wherever it is drawn
    tf = model.Transformer(model.BENCH)                     # ~300 M parameters (parts 2-4 on GPUs)
    x, y = model.token_batch(model.BENCH, rows=16, seed=0)  # (rows, seq, d_model) inputs and targets

The CNN has a ResNet's shape in miniature (convolutions, normalisation, pooling, a classifier) but
GroupNorm instead of BatchNorm: BatchNorm's statistics are taken over the images of one rank, so a
data-parallel ResNet equals the one-device model only with ``SyncBatchNorm``. GroupNorm works per
image, which makes "data parallel == one device" an exact statement.

``BENCH`` is sized for 2xH200: matmuls large enough to be compute-bound under bf16 autocast
(16 K tokens per rank and step), 24 blocks so that gradients arrive over the whole backward and
DDP's buckets can overlap it, and a gradient all-reduce that is a small fraction of the step.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# Correctness on any machine (gloo ranks, float64): seconds on a 2-core CPU.
SMALL_TF = {"d_model": 32, "n_heads": 4, "n_layers": 3, "seq": 8, "batch_per_rank": 2}

# Measurements on 2xH200 (see the module docstring). ~302 M parameters, 1.2 GB of fp32 gradients.
# The DDP sweep keeps the configurations that each teach something, at ~4 s each on 2xH200:
# bucket_caps_mb: about one weight a bucket (1: the most overlap, the most launches), DDP's default (25),
# and above the gradients' size (2048: one bucket, which cannot start before backward ends);
# ctas: the best cap again with NCCL's collectives on 8 CTAs (its own choice is the baseline): fewer SMs
# for NCCL, so each all-reduce runs longer beside backward.
# paired_repeat x paired_iters: samples of step and no_sync in turn; one sample's difference is noisy
# (a recording keeps them all: exposed_samples_ms), the median of 8 is what the verdicts read.
# trace_steps: steps (and as many no_sync steps) under the CUDA-only profiler per configuration.
# warmup / repeat: the plain model's untimed steps; FSDP's samples.
BENCH = {"d_model": 1024, "n_heads": 16, "n_layers": 24, "seq": 1024, "batch_per_rank": 16,
         "warmup": 2, "repeat": 3, "bucket_caps_mb": [1, 25, 2048], "ctas": [8], "paired_repeat": 8,
         "paired_iters": 2, "trace_steps": 2, "memory_rows": 1, "memory_seq": 64, "prefetch": 2}


class ConvNet(nn.Module):
    """conv-GroupNorm-ReLU twice, global average pooling, a linear classifier (1,610 parameters)."""

    def __init__(self, classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.ReLU(),
            nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.GroupNorm(4, 16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.classifier = nn.Linear(16, classes)

    def forward(self, images):
        return self.classifier(self.features(images))


def image_batch(n: int, *, seed: int = 0, device="cpu", dtype=torch.float64):
    """``n`` random 3x16x16 images and labels in [0, 10), the same for the same seed on any rank."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(n, 3, 16, 16, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 10, (n,), generator=g)
    return images.to(device=device, dtype=dtype), labels.to(device)


class Block(nn.Module):
    """Pre-LayerNorm transformer block: causal self-attention, then a 4x MLP, each with a residual.

    12 d^2 + 13 d parameters; every tensor's size is a multiple of d (so it splits evenly in 2, 4, 8).
    """

    def __init__(self, d_model: int, n_heads: int):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}.")
        self.n_heads = n_heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)      # flash attention on H200 (bf16)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class Transformer(nn.Module):
    """``n_layers`` blocks and a final LayerNorm on (rows, seq, d_model) inputs (no embedding: the
    inputs are random vectors and the loss an MSE, so nothing but the blocks is measured)."""

    def __init__(self, cfg: dict):
        super().__init__()
        self.blocks = nn.ModuleList(Block(cfg["d_model"], cfg["n_heads"]) for _ in range(cfg["n_layers"]))
        self.norm = nn.LayerNorm(cfg["d_model"])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.norm(x)


def n_params(cfg: dict) -> int:
    """Parameters of ``Transformer(cfg)``, from the shapes (no model built)."""
    d = cfg["d_model"]
    return cfg["n_layers"] * (12 * d * d + 13 * d) + 2 * d


def token_batch(cfg: dict, rows: int, *, seq: int | None = None, seed: int = 0, device="cpu",
                dtype=torch.float32):
    """(inputs, targets), each ``rows x seq x d_model``, from a seeded generator on ``device``."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (rows, seq or cfg["seq"], cfg["d_model"])
    return tuple(torch.randn(shape, generator=g, device=device, dtype=dtype) for _ in range(2))


def build_transformer(cfg: dict, *, device="cpu", dtype=torch.float32, seed: int = 0) -> Transformer:
    """``Transformer(cfg)`` initialised from ``seed`` directly on ``device`` (fast on a GPU)."""
    torch.manual_seed(seed)
    with torch.device(device):
        return Transformer(cfg).to(dtype)


def build_convnet(*, device="cpu", dtype=torch.float64, seed: int = 0) -> ConvNet:
    """``ConvNet()`` initialised from ``seed`` on ``device``."""
    torch.manual_seed(seed)
    return ConvNet().to(device=device, dtype=dtype)
