"""How the cost of an all-reduce grows with the number of ranks: alpha-beta models (pure arithmetic).

Each algorithm is a sequence of *rounds*; in a round every rank sends at most one message to each peer
and the round ends when its slowest message has arrived. With a fixed cost ``alpha`` per round and a
bandwidth ``beta`` per link (Hockney's model, as in ``labutils.bandwidth``):

=========  ========================  ===============================  =================================
algorithm  rounds                    bytes the busiest rank sends     time
=========  ========================  ===============================  =================================
ring       2 (n - 1)                 2 (n - 1) / n * S                2 (n-1) alpha + 2 (n-1)/n * S/beta
tree       2 ceil(log2 n)            ceil(log2 n) * S (the root)      2 ceil(log2 n) (alpha + S / beta)
direct     1                         (n - 1) * S                      alpha + (n - 1) S / beta
=========  ========================  ===============================  =================================

``tree`` is a binomial tree: reduce to rank 0, then broadcast from it; ``direct`` sends the whole
tensor to every peer at once and each rank adds what it received (the direct times assume the sends
of one rank share its one link). Sources: Thakur, Rabenseifner & Gropp, "Optimization of Collective
Communication Operations in MPICH" (IJHPCA 2005); Patarasuk & Yuan, "Bandwidth optimal all-reduce
algorithms for clusters of workstations" (JPDC 2009).
"""
from __future__ import annotations

import math

ALGORITHMS = ("ring", "tree", "direct")


def _check_n(n: int) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of ranks must be an int >= 1, got {n!r}. HINT: 2, 4, 8 ...")


def _check_algorithm(algorithm: str) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown all-reduce algorithm {algorithm!r}. HINT: one of {', '.join(ALGORITHMS)}.")


def rounds(algorithm: str, n: int) -> int:
    """Rounds of messages (each costs one alpha) of ``algorithm`` on ``n`` ranks."""
    _check_algorithm(algorithm)
    _check_n(n)
    if n == 1:
        return 0
    return {"ring": 2 * (n - 1), "tree": 2 * math.ceil(math.log2(n)), "direct": 1}[algorithm]


def tree_sends(rank: int, n: int) -> int:
    """Messages of the whole tensor that ``rank`` sends in a binomial reduce to 0 then broadcast."""
    _check_n(n)
    sends = 0 if rank == 0 else 1                              # reduce: every rank but the root sends once
    mask = 1
    while mask < n:                                            # broadcast: rank r sends to r + mask for each
        if rank % (2 * mask) == 0 and rank + mask < n:         # mask it is a multiple of 2 * mask
            sends += 1
        mask *= 2
    return sends


def sent_bytes(algorithm: str, rank: int, n: int, size_bytes: float) -> float:
    """Bytes ``rank`` sends in one all-reduce of ``size_bytes`` (ring: chunks of ``tensor_split(n)``
    rounded as even shares)."""
    _check_algorithm(algorithm)
    _check_n(n)
    if n == 1:
        return 0.0
    if algorithm == "ring":
        return 2 * (n - 1) / n * size_bytes
    if algorithm == "tree":
        return tree_sends(rank, n) * size_bytes
    return (n - 1) * size_bytes


def busiest_bytes(algorithm: str, n: int, size_bytes: float) -> float:
    """The most bytes any rank sends: what sets the bandwidth term."""
    return max(sent_bytes(algorithm, r, n, size_bytes) for r in range(n))


def time_ms(algorithm: str, size_bytes: float, n: int, alpha_us: float, beta_gbps: float) -> float:
    """Predicted time of one all-reduce: ``rounds * alpha + bytes on the critical path / beta``.

    Ring and direct: the busiest rank's bytes; tree: every round carries the whole tensor, so its
    bandwidth term is ``rounds * S / beta`` (a rank forwards only after it has received).
    """
    if n == 1:
        return 0.0
    k = rounds(algorithm, n)
    wire = k * size_bytes if algorithm == "tree" else busiest_bytes(algorithm, n, size_bytes)
    return k * alpha_us * 1e-3 + wire / (beta_gbps * 1e9) * 1e3


def crossover_bytes(a: str, b: str, n: int, alpha_us: float, beta_gbps: float) -> float | None:
    """The size above which ``a`` is faster than ``b`` on ``n`` ranks (both times are lines in S): 0 when it
    is faster at every size, None when it is never faster for large messages."""
    ka, kb = rounds(a, n), rounds(b, n)
    da, db = (time_ms(alg, 1.0, n, 0.0, beta_gbps) for alg in (a, b))   # ms per byte
    if da >= db:
        return None
    return max((ka - kb) * alpha_us * 1e-3 / (db - da), 0.0)


# ---------------------------------------------------------------------------------------- hierarchy
def hierarchical_bytes(size_bytes: float, local: int, nodes: int) -> dict:
    """Bytes one rank sends in a hierarchical all-reduce on ``nodes`` x ``local`` ranks: a ring
    reduce-scatter inside the node, a ring all-reduce of the rank's 1/local share across the nodes,
    a ring all-gather inside the node. ``{"intra": ..., "inter": ...}``."""
    _check_n(local)
    _check_n(nodes)
    intra = 2 * (local - 1) / local * size_bytes
    inter = 2 * (nodes - 1) / nodes * size_bytes / local
    return {"intra": intra, "inter": inter}


def hierarchical_time_ms(size_bytes: float, local: int, nodes: int, intra: tuple, inter: tuple) -> float:
    """Predicted time of the hierarchical all-reduce: ``intra``/``inter`` are ``(alpha_us, beta_gbps)`` per
    round of the ring inside a node and across nodes."""
    (a_in, b_in), (a_out, b_out) = intra, inter
    b = hierarchical_bytes(size_bytes, local, nodes)
    t_in = 2 * (local - 1) * a_in * 1e-3 + b["intra"] / (b_in * 1e9) * 1e3 if local > 1 else 0.0
    t_out = 2 * (nodes - 1) * a_out * 1e-3 + b["inter"] / (b_out * 1e9) * 1e3 if nodes > 1 else 0.0
    return t_in + t_out


def ring_busbw_gbps(size_bytes: float, n: int, alpha_us: float, beta_gbps: float) -> float:
    """nccl-tests' busbw of a ring all-reduce predicted by the model: S / t * 2 (n-1) / n."""
    t = time_ms("ring", size_bytes, n, alpha_us, beta_gbps)
    return size_bytes / (t * 1e-3) / 1e9 * 2 * (n - 1) / n


def per_round_alpha_us(fit_alpha_us: float, n: int) -> float:
    """The alpha of one round, from an alpha-beta fit of a ring all-reduce on ``n`` ranks (``2 (n-1)`` rounds)."""
    return fit_alpha_us / (2 * (n - 1))


# ---------------------------------------------------------------------------------------- roofline
def tp_mlp_times_ms(tokens: int, hidden: int, n: int, flops_per_s: float, beta_gbps: float,
                    itemsize: int = 2, ffn_mult: int = 4) -> dict:
    """Forward pass of Megatron's MLP (``hidden`` -> ``ffn_mult * hidden`` -> ``hidden``) on ``n`` ranks:
    the matmuls' time at ``flops_per_s`` and the one ring all-reduce of the output at ``beta_gbps``
    (bandwidth term only). ``{"compute_ms", "comm_ms"}``."""
    flops = 2 * 2 * tokens * hidden * ffn_mult * hidden / n
    comm_bytes = 2 * (n - 1) / n * tokens * hidden * itemsize
    return {"compute_ms": flops / flops_per_s * 1e3, "comm_ms": comm_bytes / (beta_gbps * 1e9) * 1e3}


def roofline_hidden(n: int, flops_per_s: float, beta_gbps: float, itemsize: int = 2, ffn_mult: int = 4) -> float:
    """The hidden size below which the tensor-parallel MLP waits longer for its all-reduce than it computes:
    compute / comm = 2 ffn_mult h beta / (F (n - 1) e), equal to 1 at
    ``h* = F (n - 1) e / (2 ffn_mult beta)`` -- independent of the number of tokens (JAX scaling book,
    "Sharded matmuls": the arithmetic intensity of the matmul against that of the link)."""
    _check_n(n)
    if n == 1:
        return 0.0
    return flops_per_s * (n - 1) * itemsize / (2 * ffn_mult * beta_gbps * 1e9)
