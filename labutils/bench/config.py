"""The pure part of the benchmark: what to sweep, the buffers' sizes, the correctness check's data.

No process group and no GPU code (torch is imported only inside the two helpers that take
tensors): ``BenchConfig`` holds the options (nccl-tests' names in its comments) and validates
them; ``layout`` gives one point's element counts as nccl-tests' ``*GetCollByteCount`` does;
``pattern_tile`` / ``fill_pattern`` / ``reduce_tiles`` make the rank- and position-dependent input
pattern of the correctness check and the values its result must have; ``count_wrong`` compares::

    from labutils.bench.config import BenchConfig, layout, planned_points
    cfg = BenchConfig(maxbytes=2**20, datatype="bf16")            # datatype -> "bfloat16"
    layout("all_gather", 2**20, cfg.itemsize, 8)["count"]         # per-rank count: 65536
    planned_points(cfg, 8)                                        # rows the sweep will print

``labutils.bench.ops`` (buffers, op callables, the check) and ``labutils.bench.sweep`` (the
rank side of a run) use it.
"""
from __future__ import annotations

import dataclasses
import math

from .. import bandwidth

PLACEMENTS = ("out-of-place", "in-place")
FORMS = {"all_reduce": ("in-place",), "all_gather": PLACEMENTS, "reduce_scatter": PLACEMENTS,
         "all_to_all": ("out-of-place",), "broadcast": ("in-place",), "reduce": ("in-place",),
         "send_recv": ("out-of-place",), "send_one_way": ("out-of-place",)}
REDUCING = ("all_reduce", "reduce_scatter", "reduce")
ROOTED = ("broadcast", "reduce")
# nccl-tests type name -> (torch dtype name, bytes per element)
DTYPES = {"int8": ("int8", 1), "uint8": ("uint8", 1), "int32": ("int32", 4), "int64": ("int64", 8),
          "half": ("float16", 2), "float": ("float32", 4), "double": ("float64", 8),
          "bfloat16": ("bfloat16", 2)}
_DTYPE_ALIASES = {"float16": "half", "fp16": "half", "float32": "float", "fp32": "float",
                  "float64": "double", "fp64": "double", "bf16": "bfloat16", "int": "int32",
                  "char": "int8"}
REDOPS = ("sum", "prod", "max", "min", "avg")
# What one timed send/recv call is (the header prints it). benchmarks/p2p_forms.py times every
# correct form of each; these are the ones that cost least there.
P2P_FORMS = {
    "send_recv": "nccl-tests' ring: rank r sends S to r+1 and receives S from r-1 at once, both in one "
                 "batch_isend_irecv (one NCCL group per call)",
    "send_one_way": "rank 2k sends S to 2k+1 (isend + wait), rank 2k+1 receives it (irecv + wait), a last "
                    "odd rank idles: one direction, one operation per rank and call",
}
_RTOL = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-6, "float64": 1e-12}  # only avg rounds


def canonical_dtype(name: str) -> str:
    """nccl-tests' name for a datatype (``fp32`` -> ``float``); ValueError with a HINT if unknown."""
    key = str(name).lower()
    key = _DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise ValueError(f"unknown datatype {name!r}. HINT: one of {', '.join(DTYPES)} "
                         "(uint32/uint64 are not supported by torch.distributed's backends).")
    return key


AUTO_ITERS = "100 per sample up to 1 MiB, 20 up to 64 MiB, then fewer as the size doubles, at least 5"


def auto_iters(size_bytes: int) -> int:
    """Back-to-back calls per sample (``AUTO_ITERS``). Each sample starts after a barrier, and its first
    call pays for the ranks' start (tens of us): 100 calls make that a small share of a small message's
    time; 20 (nccl-tests' default) suffice where one call takes longer; fewer above 64 MiB."""
    if size_bytes <= 2**20:
        return 100
    return max(5, min(20, round(20 * 2**26 / max(size_bytes, 1))))


def one_way_peer(rank: int, world_size: int) -> tuple[str | None, int | None]:
    """send_one_way's pairs: rank 2k sends to 2k+1, which receives; a last rank without a partner
    (odd world size) idles. Returns ``("send", peer)``, ``("recv", peer)`` or ``(None, None)``."""
    if rank % 2 == 0:
        return ("send", rank + 1) if rank + 1 < world_size else (None, None)
    return "recv", rank - 1


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """What to sweep (nccl-tests' option in brackets). ``iters=None`` means ``auto_iters``.

    Raises:
        ValueError: a value out of range, with a HINT (the CLI turns it into a usage error).
    """
    minbytes: int = 8                     # -b
    maxbytes: int = 128 * 2**20           # -e
    stepfactor: int = 2                   # -f
    datatype: str = "float"               # -d
    redop: str = "sum"                    # -o
    root: int = 0                         # -r
    iters: int | None = None              # -n
    warmup_iters: int = 5                 # -w
    repeat: int = 5                       # (ours) samples per point; nccl-tests takes one
    check: int = 1                        # -c: check iterations, 0 = off
    collectives: tuple = bandwidth.OPS
    timed: bool = True                    # False: correctness only (no timing)
    latency: bool = True                  # also time all_reduce at 8 B as its own line
    cuda_graph: int = 0                   # -G: capture `iters` calls in a CUDA graph, replay it this
                                          # many times per sample (0: eager calls); NCCL only
    bare: bool = True                     # (ours) time a bare loop of the same torch call beside the
                                          # benchmark's at each collective's smallest size

    def __post_init__(self):
        object.__setattr__(self, "datatype", canonical_dtype(self.datatype))
        object.__setattr__(self, "collectives", tuple(bandwidth.canonical_op(c) for c in self.collectives))
        for name, low in (("minbytes", 1), ("maxbytes", 1), ("stepfactor", 2), ("root", 0), ("iters", 1),
                          ("warmup_iters", 0), ("repeat", 1), ("check", 0), ("cuda_graph", 0)):
            v = getattr(self, name)
            if (v is not None or name != "iters") and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise ValueError(f"{name} must be an integer >= {low}, got {v!r}.")
        if self.minbytes > self.maxbytes:
            raise ValueError(f"minbytes {self.minbytes} > maxbytes {self.maxbytes}. "
                             "HINT: -b is the smallest size, -e the largest.")
        if self.redop not in REDOPS:
            raise ValueError(f"unknown reduction {self.redop!r}. HINT: one of {', '.join(REDOPS)}.")
        if self.redop == "avg" and not DTYPES[self.datatype][0].startswith(("float", "bfloat")):
            raise ValueError(f"avg of {self.datatype} is not defined here. "
                             "HINT: use a floating-point datatype (-d float) or -o sum.")
        if not self.collectives or len(set(self.collectives)) != len(self.collectives):
            raise ValueError(f"collectives must be distinct and not empty, got {self.collectives}.")

    @property
    def itemsize(self) -> int:
        return DTYPES[self.datatype][1]

    def sizes(self) -> list[int]:
        """Nominal sizes S (bytes): minbytes x stepfactor^k <= maxbytes."""
        return bandwidth.size_sweep(self.minbytes, self.maxbytes, self.stepfactor)

    def iters_for(self, size_bytes: int) -> int:
        return self.iters if self.iters is not None else auto_iters(size_bytes)

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "collectives": list(self.collectives)}


@dataclasses.dataclass(frozen=True)
class Outputs:
    """What a run prints and writes besides the table: files (paths or None), the Markdown note, and a
    progress bar (shown only on a terminal: tqdm's ``disable=None``)."""
    json: str | None = None
    csv: str | None = None
    plot: str | None = None
    note: bool = False
    progress: bool = True


def layout(collective: str, size_bytes: int, itemsize: int, world_size: int) -> dict:
    """Counts for one point, as nccl-tests' ``*GetCollByteCount`` (size rounded down to whole elements).

    Returns:
        dict with ``count`` (the table's count column: per-rank count for all_gather /
        reduce_scatter, per-peer count for all_to_all), ``size_bytes`` (the table's size S,
        see ``labutils.bandwidth``), ``in_numel`` and ``out_numel`` (elements per rank).
    """
    count = size_bytes // itemsize
    n = world_size
    if collective in ("all_gather", "reduce_scatter", "all_to_all"):
        c = count // n
        ins = {"all_gather": c, "reduce_scatter": n * c, "all_to_all": n * c}[collective]
        outs = {"all_gather": n * c, "reduce_scatter": c, "all_to_all": n * c}[collective]
        return {"count": c, "size_bytes": n * c * itemsize, "in_numel": ins, "out_numel": outs}
    return {"count": count, "size_bytes": count * itemsize, "in_numel": count, "out_numel": count}


def planned_points(config: BenchConfig, world_size: int) -> int:
    """Number of (collective, size) rows the sweep prints (sizes below one element are skipped)."""
    return sum(1 for c in config.collectives for s in config.sizes()
               if layout(c, s, config.itemsize, world_size)["count"] > 0)


def pattern_tile(rank: int, seed: int, collective: str, redop: str) -> list:
    """One period of the input pattern of ``rank``: small integers, exact in every datatype.

    Sums use 1..5 (exact in bf16 up to 51 ranks), products 1..2, the rest 0..60; the value at
    position k is ``(7k + 13 rank + seed) mod m + base``, so a misplaced or foreign chunk shows.
    """
    m, base = {"sum": (5, 1), "avg": (5, 1), "prod": (2, 1)}.get(redop, (61, 0)) \
        if collective in REDUCING else (61, 0)
    return [(7 * k + 13 * rank + seed) % m + base for k in range(m)]


_REDUCE = {"sum": sum, "avg": lambda v: sum(v) / len(v), "prod": math.prod, "max": max, "min": min}


def reduce_tiles(tiles: list, redop: str) -> list:
    return [_REDUCE[redop](vals) for vals in zip(*tiles)]


def fill_pattern(dst, tile: list, offset: int) -> None:
    """``dst[i] = tile[(offset + i) mod len(tile)]``, cast to dst's dtype (ints wrap, as NCCL's)."""
    import torch
    if dst.numel() == 0:
        return
    m = len(tile)
    src = torch.tensor(tile, dtype=torch.float64 if any(isinstance(v, float) for v in tile)
                       else torch.int64, device=dst.device).to(dst.dtype)
    start = offset % m
    reps = (start + dst.numel() + m - 1) // m
    dst.copy_(src.repeat(reps)[start:start + dst.numel()])


def count_wrong(got, expected) -> int:
    """Elements of ``got`` that differ from ``expected`` (exact for integers; floats within the
    rounding of one division, which only avg needs; NaN counts as wrong)."""
    import torch
    if got.shape != expected.shape:
        raise ValueError(f"result has shape {tuple(got.shape)}, expected {tuple(expected.shape)}.")
    if got.dtype.is_floating_point:
        rtol = _RTOL.get(str(got.dtype).replace("torch.", ""), 1e-6)
        bad = ~torch.isclose(got, expected, rtol=rtol, atol=0.0)
    else:
        bad = got != expected
    return int(bad.sum().item())


def bytes_per_rank(cfg: BenchConfig, n: int) -> int:
    """Peak bytes one rank allocates: the three buffers of the largest collective plus the
    temporaries of a fill/compare (about two more output-sized arrays)."""
    lays = [layout(c, cfg.maxbytes, cfg.itemsize, n) for c in cfg.collectives]
    return max((lay["in_numel"] + 4 * lay["out_numel"]) * cfg.itemsize for lay in lays)

