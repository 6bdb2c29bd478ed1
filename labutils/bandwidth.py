"""Bandwidth arithmetic for collectives, exactly as nccl-tests defines it, and the alpha-beta model.

Source: NVIDIA nccl-tests, ``doc/PERFORMANCE.md`` and the ``*GetBw`` functions in ``src/*.cu``.

* **algbw** = S / t, with S in bytes, t in seconds, reported in GB/s = 1e9 bytes/s.
  S is the size nccl-tests prints in its ``size`` column:

  ==============  ===========================================  ==================
  op              S                                            busbw factor
  ==============  ===========================================  ==================
  all_reduce      the buffer (same on every rank)              2 (n-1) / n
  all_gather      the *gathered* output = n x per-rank input   (n-1) / n
  reduce_scatter  the *input* = n x per-rank output            (n-1) / n
  all_to_all      the per-rank send buffer (n chunks)          (n-1) / n
  broadcast       the buffer                                   1
  reduce          the buffer                                   1
  send_recv       the bytes one rank sends                     1
  send_one_way    the bytes one rank sends                     1
  ==============  ===========================================  ==================

  send_recv is nccl-tests' ring (every rank sends to the next and receives from the previous at
  once: on 2 ranks both directions of the link at the same time); send_one_way moves the message
  in one direction only (rank 2k -> 2k+1), as a pipeline stage sends to the next.

* **busbw** = algbw x factor: the bandwidth one link must sustain with a ring algorithm, so it
  can be compared with the hardware peak whatever the number of ranks.
* **alpha-beta** (Hockney) model: ``t(S) = alpha + S / beta``; alpha = latency (us), beta =
  asymptotic bandwidth (GB/s). Ring collectives: ``t = k (n-1) alpha + factor * S / beta``
  with k = 2 for all_reduce and 1 for all_gather / reduce_scatter (Thakur, Rabenseifner & Gropp,
  "Optimization of Collective Communication Operations in MPICH", IJHPCA 2005).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

_FACTORS = {
    "all_reduce": lambda n: 2.0 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "send_recv": lambda n: 1.0,
    "send_one_way": lambda n: 1.0,
}
OPS = tuple(_FACTORS)
_ALIASES = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
            "alltoall": "all_to_all", "sendrecv": "send_recv", "all_gather_into_tensor": "all_gather",
            "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all",
            "p2p": "send_recv", "send": "send_recv", "oneway": "send_one_way",
            "sendoneway": "send_one_way"}


def canonical_op(op: str) -> str:
    """Normalise an op name (``"allreduce"``, ``"all_gather_into_tensor"`` ...) to the table's.

    Raises:
        ValueError: unknown op.
    """
    key = str(op).lower().replace("-", "_")
    key = _ALIASES.get(key.replace("_", ""), _ALIASES.get(key, key))
    if key not in _FACTORS:
        raise ValueError(f"unknown collective {op!r}. HINT: one of {', '.join(OPS)}.")
    return key


def bus_factor(op: str, world_size: int) -> float:
    """nccl-tests' busbw / algbw factor for ``op`` on ``world_size`` ranks (see module table)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be an int >= 1, got {world_size!r}.")
    return _FACTORS[canonical_op(op)](world_size)


def algbw_gbps(size_bytes: float, time_ms: float) -> float:
    """Algorithm bandwidth S / t in GB/s (1e9 B/s). ``size_bytes`` as in the module table.

    Raises:
        ValueError: size < 0 or time <= 0.
    """
    if size_bytes < 0 or not time_ms > 0:
        raise ValueError(f"need size_bytes >= 0 and time_ms > 0, got {size_bytes!r}, {time_ms!r}.")
    return size_bytes / (time_ms * 1e-3) / 1e9


def busbw_gbps(op: str, size_bytes: float, time_ms: float, world_size: int) -> float:
    """Bus bandwidth = algbw x ``bus_factor(op, world_size)``, in GB/s."""
    return algbw_gbps(size_bytes, time_ms) * bus_factor(op, world_size)


@dataclasses.dataclass(frozen=True)
class AlphaBeta:
    """Fitted ``t(S) = alpha + S / beta``.

    Attributes:
        alpha_us: latency, microseconds (time of an empty message).
        beta_gbps: asymptotic bandwidth, GB/s.
        max_rel_err: largest |fit - measured| / measured over the fitted points.
    """
    alpha_us: float
    beta_gbps: float
    max_rel_err: float

    def predict_ms(self, size_bytes: float) -> float:
        """Predicted time (ms) for a message of ``size_bytes``."""
        return self.alpha_us * 1e-3 + size_bytes / (self.beta_gbps * 1e9) * 1e3

    def predict_gbps(self, size_bytes: float) -> float:
        """Predicted algorithm bandwidth (GB/s) at ``size_bytes``."""
        return algbw_gbps(size_bytes, self.predict_ms(size_bytes)) if size_bytes > 0 else 0.0

    @property
    def half_bw_bytes(self) -> float:
        """n_1/2: the size at which half of beta is reached (= alpha x beta)."""
        return self.alpha_us * 1e-6 * self.beta_gbps * 1e9

    def __str__(self) -> str:
        return f"alpha = {self.alpha_us:.2f} us, beta = {self.beta_gbps:.1f} GB/s"


def fit_alpha_beta(size_bytes: Sequence[float], time_ms: Sequence[float]) -> AlphaBeta:
    """Least-squares fit of ``t = alpha + S / beta`` with relative weights (1 / t).

    Sizes of a sweep span many decades; an unweighted fit would see only the largest messages.
    Weighting each residual by 1/t minimises the *relative* error, so small messages pin alpha
    and large ones pin beta.

    Raises:
        ValueError: fewer than 2 points, mismatched lengths, non-positive times, or data that
            give a non-positive slope (bandwidth not measurable from these sizes).
    """
    if len(size_bytes) != len(time_ms):
        raise ValueError(f"size_bytes and time_ms differ in length ({len(size_bytes)} vs {len(time_ms)}).")
    pts = [(float(s), float(t)) for s, t in zip(size_bytes, time_ms)]
    if len(pts) < 2 or len({s for s, _ in pts}) < 2:
        raise ValueError("fit_alpha_beta needs at least 2 distinct sizes. HINT: sweep sizes.")
    if any(t <= 0 or not math.isfinite(t) for _, t in pts):
        raise ValueError("times must be positive and finite.")
    # Weighted normal equations for t = a + b S with weight w = 1/t^2 on squared residuals.
    sw = sx = sy = sxx = sxy = 0.0
    for s, t in pts:
        w = 1.0 / (t * t)
        sw += w; sx += w * s; sy += w * t; sxx += w * s * s; sxy += w * s * t
    det = sw * sxx - sx * sx
    b = (sw * sxy - sx * sy) / det  # ms per byte
    a = (sy - b * sx) / sw  # ms
    if b <= 0:
        raise ValueError("the times do not grow with size, so no bandwidth can be fitted. "
                         "HINT: include larger messages (>= 1 MiB) in the sweep.")
    a = max(a, 0.0)
    fit = AlphaBeta(alpha_us=a * 1e3, beta_gbps=1.0 / (b * 1e-3) / 1e9, max_rel_err=0.0)
    err = max(abs(fit.predict_ms(s) - t) / t for s, t in pts)
    return dataclasses.replace(fit, max_rel_err=err)


def ring_time_ms(op: str, size_bytes: float, world_size: int, alpha_us: float, beta_gbps: float) -> float:
    """Alpha-beta prediction for a ring collective on ``world_size`` ranks (ms).

    ``t = steps * alpha + bus_factor * S / beta`` with steps = 2 (n-1) for all_reduce,
    (n-1) for all_gather / reduce_scatter / all_to_all, 1 for broadcast / reduce / send_recv
    (pipelined). For n = 1 nothing moves: 0.
    """
    op = canonical_op(op)
    n = world_size
    if n == 1:
        return 0.0
    steps = {"all_reduce": 2 * (n - 1), "all_gather": n - 1, "reduce_scatter": n - 1,
             "all_to_all": n - 1}.get(op, 1)
    return steps * alpha_us * 1e-3 + bus_factor(op, n) * size_bytes / (beta_gbps * 1e9) * 1e3


def size_sweep(min_bytes: int, max_bytes: int, factor: int = 2) -> list[int]:
    """Message sizes min, min*factor, ... <= max (bytes), like nccl-tests' ``-b -e -f``.

    Raises:
        ValueError: min < 1, max < min or factor < 2.
    """
    if min_bytes < 1 or max_bytes < min_bytes or factor < 2:
        raise ValueError(f"need 1 <= min_bytes <= max_bytes and factor >= 2, got "
                         f"{min_bytes}, {max_bytes}, {factor}.")
    out, s = [], int(min_bytes)
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def format_size(size_bytes: float) -> str:
    """``1024 -> '1 KiB'``, ``3 * 2**20 -> '3 MiB'`` (binary units, as nccl-tests' -b/-e take)."""
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size_bytes >= div:
            v = size_bytes / div
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{int(size_bytes)} B"
