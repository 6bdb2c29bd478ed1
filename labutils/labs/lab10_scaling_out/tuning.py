"""NCCL's choice of algorithm and protocol, read from its ``NCCL_DEBUG=INFO`` log (pure: text in, data out).

With ``NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING`` rank 0 of a communicator prints one line per collective
as NCCL 2.28 enqueues it (``src/enqueue.cc``, ``INFO(NCCL_TUNING, "%s: %ld Bytes -> Algo %s proto %s
channel{Lo..Hi}={%d..%d}", ...)``, the names from ``ncclAlgoToString`` / ``ncclProtoToString`` in
``src/collectives.cc``)::

    vm:123:123 [0] NCCL INFO AllReduce: 4096 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}

That line is what NCCL ran; a kernel's name is not (one kernel serves several protocols). Older NCCL
(2.18-2.21) printed numbers instead, ``4096 Bytes -> Algo 1 proto 0 time 6.5``; both forms are read,
the numbers mapped with NCCL's own order (``NCCL_ALGO_TREE 0, RING 1, ...``; ``NCCL_PROTO_LL 0, LL128 1,
SIMPLE 2``).
"""
from __future__ import annotations

import collections
import dataclasses
import re

ALGOS = ("TREE", "RING", "COLLNET_DIRECT", "COLLNET_CHAIN", "NVLS", "NVLS_TREE", "PAT")   # NCCL's numbering
PROTOS = ("LL", "LL128", "SIMPLE")

_NAMED = re.compile(r"NCCL INFO (\w+): (\d+) Bytes -> Algo (\w+) proto (\w+) channel\{Lo\.\.Hi\}=\{(\d+)\.\.(\d+)\}")
_NUMBERED = re.compile(r"NCCL INFO (?:(\w+): )?(\d+) Bytes -> Algo (\d+) proto (\d+) time ([\d.]+)")


@dataclasses.dataclass(frozen=True)
class Choice:
    """What NCCL ran for one collective: ``func`` (``AllReduce``), its size in bytes, algorithm, protocol
    and the channels it spread over (``channels`` = Hi - Lo + 1; 0 where the log does not say)."""
    func: str
    size_bytes: int
    algo: str
    proto: str
    channels: int


def parse_tuning(text: str) -> list[Choice]:
    """Every tuning line of ``text`` (a log, with or without ``[rank r]`` prefixes), in order."""
    out = []
    for line in text.splitlines():
        if m := _NAMED.search(line):
            func, size, algo, proto, lo, hi = m.groups()
            out.append(Choice(func, int(size), algo.upper(), proto.upper(), int(hi) - int(lo) + 1))
        elif m := _NUMBERED.search(line):
            func, size, algo, proto, _ = m.groups()
            a, p = int(algo), int(proto)
            out.append(Choice(func or "?", int(size), ALGOS[a] if a < len(ALGOS) else f"algo {a}",
                              PROTOS[p] if p < len(PROTOS) else f"proto {p}", 0))
    return out


def choices_by_size(choices: list[Choice], func: str = "AllReduce") -> dict[int, str]:
    """``{size_bytes: "RING/LL"}`` for ``func``: the most frequent choice at each size (NCCL picks the same
    for every call of one size on one communicator; a warm-up at another size adds its own lines)."""
    seen: dict = collections.defaultdict(collections.Counter)
    for c in choices:
        if c.func == func:
            seen[c.size_bytes][f"{c.algo}/{c.proto}"] += 1
    return {size: counts.most_common(1)[0][0] for size, counts in sorted(seen.items())}


def switch_points(by_size: dict[int, str]) -> list[tuple[int, str, str]]:
    """``[(size, before, after), ...]``: the sizes at which the choice changes, in increasing size."""
    items = sorted(by_size.items())
    return [(s, prev, cur) for (_, prev), (s, cur) in zip(items, items[1:]) if cur != prev]


def forced_env(algo: str | None, proto: str | None) -> dict:
    """The environment that forces NCCL's choice (``NCCL_ALGO`` / ``NCCL_PROTO``; None leaves it to NCCL).

    Raises:
        ValueError: an algorithm or protocol NCCL does not know.
    """
    env = {}
    if algo is not None:
        if algo.upper() not in ALGOS:
            raise ValueError(f"NCCL has no algorithm {algo!r}. HINT: one of {', '.join(ALGOS)} (any case).")
        env["NCCL_ALGO"] = algo
    if proto is not None:
        if proto.upper() not in PROTOS:
            raise ValueError(f"NCCL has no protocol {proto!r}. HINT: one of {', '.join(PROTOS)} (any case).")
        env["NCCL_PROTO"] = proto
    return env
