"""GPU slices of a shared node: which GPUs a learner's server may get (pure, except ``read_topology``).
Who holds which slice is ``book.SliceBook``'s.

    topo = read_topology()                    # NVML; or fake_topology("8") on a machine without GPUs
    plan = plan_slices(topo, slice_size=2)    # [(0, 1), (2, 3), ...]: disjoint, best-linked first
    env = slice_env(plan[0])                  # {"CUDA_VISIBLE_DEVICES": "0,1", "CUDA_DEVICE_ORDER": ...}

Links are named as ``nvidia-smi topo -m`` names them, best first: ``NV<k>`` (k NVLinks between the
two GPUs; ``NV`` when both hang off an NVSwitch, where every pair is alike), then the PCIe path
``PIX`` < ``PXB`` < ``PHB`` < ``NODE`` < ``SYS`` (through a NUMA interconnect). Where all pairs are
alike the slices are consecutive GPUs; where links differ, the slices are the partition whose
worst link is best (then the fewest bad slices), found exactly for up to 16 GPUs.

``CUDA_VISIBLE_DEVICES`` holds NVML indices, with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` so that CUDA
numbers the GPUs as NVML does (CUDA's default order is fastest first). It is a convention the
learner's code follows, not a boundary: see classroom/README.md for the device cgroup that is one.

A fake topology (``fake_topology("4:0-1=NV4,2-3=NV4,*=SYS")``, or ``LABUTILS_FAKE_GPUS`` in the
environment) lets the assignment be tested, and a class planned, on a machine without GPUs.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field

FAKE_ENV = "LABUTILS_FAKE_GPUS"
PCIE_ORDER = ("PIX", "PXB", "PHB", "NODE", "SYS")  # nearer first, as in nvidia-smi topo -m
MAX_EXACT_GPUS = 16


class SliceError(ValueError):
    """The slices cannot be made or given as asked; the message says why and what to do."""


@dataclass
class Topology:
    """GPUs of a node and the link between each pair.

    Attributes:
        count: number of GPUs (NVML indices 0..count-1).
        links: ``{(i, j): "NV18" | "NV" | "PIX" | ... | "SYS"}`` for i < j.
        minors: ``/dev/nvidiaN`` number of each GPU (the device file a cgroup allows).
        memory_gib: total memory of each GPU (0 where unknown or fake).
        fake: True when made by ``fake_topology`` (nothing real behind it).
        names: product names ("" where fake).
    """
    count: int
    links: dict = field(default_factory=dict)
    minors: list = field(default_factory=list)
    memory_gib: list = field(default_factory=list)
    fake: bool = False
    names: list = field(default_factory=list)

    def link(self, i: int, j: int) -> str:
        return "X" if i == j else self.links.get((min(i, j), max(i, j)), "SYS")


def link_cost(label: str) -> float:
    """Lower is better: NVLinks (more links cheaper) < PIX < PXB < PHB < NODE < SYS."""
    m = re.fullmatch(r"NV(\d*)", label)
    if m:
        return 1.0 - min(int(m.group(1) or 18), 99) / 100.0
    if label in PCIE_ORDER:
        return 2.0 + PCIE_ORDER.index(label)
    return 2.0 + len(PCIE_ORDER)  # unknown: as far as it gets


def fake_topology(spec: str) -> Topology:
    """A topology from text: ``"8"`` (8 GPUs, all pairs ``NV``, like an NVSwitch node) or
    ``"N:i-j=LINK,...,*=LINK"`` (listed pairs, ``*`` for all others, default ``SYS``)."""
    head, _, rest = str(spec).strip().partition(":")
    if not head.isdigit() or int(head) < 1:
        raise SliceError(f"fake GPU spec {spec!r}: it must start with a GPU count >= 1. "
                         f"HINT: '8', or '4:0-1=NV4,2-3=NV4,*=SYS'.")
    n = int(head)
    default, links = ("NV" if not rest else "SYS"), {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        pair, eq, label = item.partition("=")
        if not eq or link_cost(label) > link_cost("SYS") or not label:
            raise SliceError(f"fake GPU spec {spec!r}: {item!r} is not PAIR=LINK with LINK one of "
                             f"NV<k>, {', '.join(PCIE_ORDER)}. HINT: '0-1=NV4' or '*=SYS'.")
        if pair == "*":
            default = label
            continue
        m = re.fullmatch(r"(\d+)-(\d+)", pair)
        if not m or int(m.group(1)) == int(m.group(2)) or max(map(int, m.groups())) >= n:
            raise SliceError(f"fake GPU spec {spec!r}: {pair!r} is not a pair of two GPUs below {n}. "
                             f"HINT: pairs are written i-j, e.g. 0-1.")
        i, j = sorted(map(int, m.groups()))
        links[(i, j)] = label
    full = {(i, j): links.get((i, j), default) for i in range(n) for j in range(i + 1, n)}
    return Topology(n, full, list(range(n)), [0.0] * n, fake=True, names=[""] * n)


def read_topology(fake: str | None = None) -> Topology:
    """The node's GPUs and links through NVML (``fake``, else ``$LABUTILS_FAKE_GPUS``, if given).

    No driver or no GPU gives ``Topology(0)``: a node without GPUs has no slices.
    """
    fake = fake if fake is not None else os.environ.get(FAKE_ENV)
    if fake:
        return fake_topology(fake)
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no library, no driver: no GPUs to slice
        return Topology(0)
    try:
        n = pynvml.nvmlDeviceGetCount()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(n)]
        buses = [pynvml.nvmlDeviceGetPciInfo(h).busId for h in handles]
        buses = [b.decode() if isinstance(b, bytes) else b for b in buses]
        nvlinks, on_switch = _nvml_nvlinks(pynvml, handles, buses)
        links = {}
        for i in range(n):
            for j in range(i + 1, n):
                if on_switch[i] and on_switch[j]:
                    links[(i, j)] = "NV"
                elif nvlinks.get((i, j)):
                    links[(i, j)] = f"NV{nvlinks[(i, j)]}"
                else:
                    links[(i, j)] = _pcie_label(pynvml, handles[i], handles[j])
        minors = [int(pynvml.nvmlDeviceGetMinorNumber(h)) for h in handles]
        memory = [pynvml.nvmlDeviceGetMemoryInfo(h).total / 2**30 for h in handles]
        names = [pynvml.nvmlDeviceGetName(h) for h in handles]
        names = [x.decode() if isinstance(x, bytes) else x for x in names]
        return Topology(n, links, minors, memory, names=names)
    finally:
        pynvml.nvmlShutdown()


def _nvml_nvlinks(pynvml, handles, buses) -> tuple[dict, list]:
    """``{(i, j): number of NVLinks}`` between GPUs, and which GPUs have a link to an NVSwitch."""
    index_of = {b.lower(): i for i, b in enumerate(buses)}
    counts: dict = {}
    on_switch = [False] * len(handles)
    for i, h in enumerate(handles):
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(h, link) != 1:
                    continue
                remote = pynvml.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId
            except Exception:  # noqa: BLE001 - link absent or not supported
                continue
            remote = (remote.decode() if isinstance(remote, bytes) else remote).lower()
            j = index_of.get(remote)
            if j is None:
                on_switch[i] = True  # the far end is not a GPU: an NVSwitch
            elif j > i:
                counts[(i, j)] = counts.get((i, j), 0) + 1
    return counts, on_switch


def _pcie_label(pynvml, a, b) -> str:
    try:
        level = int(pynvml.nvmlDeviceGetTopologyCommonAncestor(a, b))
    except Exception:  # noqa: BLE001
        return "SYS"
    # nvmlGpuTopologyLevel_t: INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30, NODE 40, SYSTEM 50
    return {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE"}.get(level, "SYS")


def worst_link(topo: Topology, gpus) -> str:
    """The slowest link inside a slice (``"-"`` for a slice of one GPU)."""
    pairs = [(i, j) for n, i in enumerate(gpus) for j in gpus[n + 1:]]
    return max((topo.link(i, j) for i, j in pairs), key=link_cost, default="-")


def plan_slices(topo: Topology, slice_size: int = 2, learners: int | None = None,
                exclude=()) -> list[tuple]:
    """Disjoint slices of ``slice_size`` GPUs, as many as fit (or ``learners`` of them).

    GPUs left over (count not a multiple of the size) and those in ``exclude`` (a broken GPU) are
    in no slice.
    """
    exclude = sorted(set(int(g) for g in exclude))
    if exclude:
        bad = [g for g in exclude if not 0 <= g < topo.count]
        if bad:
            raise SliceError(f"cannot exclude GPU {bad[0]}: the node has GPUs 0..{topo.count - 1}. "
                             f"HINT: exclude NVML indices, as nvidia-smi numbers them.")
        keep = [g for g in range(topo.count) if g not in exclude]
        sub = Topology(len(keep), {(a, b): topo.link(keep[a], keep[b])
                                   for a in range(len(keep)) for b in range(a + 1, len(keep))})
        if not keep:
            raise SliceError(f"every GPU is excluded ({exclude}). HINT: exclude only the broken ones.")
        return [tuple(keep[g] for g in s) for s in plan_slices(sub, slice_size, learners)]
    if isinstance(slice_size, bool) or not isinstance(slice_size, int) or slice_size < 1:
        raise SliceError(f"slice size must be a whole number of GPUs >= 1, got {slice_size!r}. "
                         f"HINT: 2 gives each learner a pair.")
    if topo.count == 0:
        raise SliceError("this node has no GPUs (NVML found none), so there is nothing to slice. "
                         f"HINT: run it on the GPU node, or plan with a fake topology ({FAKE_ENV}=8).")
    if slice_size > topo.count:
        raise SliceError(f"slice size {slice_size} is more than the node's {topo.count} GPUs. "
                         f"HINT: use a slice size of at most {topo.count}.")
    n_slices = topo.count // slice_size
    if learners is not None and learners > n_slices:
        raise SliceError(f"{learners} learners need {learners} slices of {slice_size} GPUs, but the node's "
                         f"{topo.count} GPUs make {n_slices}. HINT: a smaller slice size, or a second node.")
    costs = {(i, j): link_cost(topo.link(i, j)) for i in range(topo.count) for j in range(topo.count)}
    if len(set(costs[(i, j)] for i in range(topo.count) for j in range(i + 1, topo.count))) <= 1:
        slices = [tuple(range(k * slice_size, (k + 1) * slice_size)) for k in range(n_slices)]
    elif topo.count > MAX_EXACT_GPUS:
        slices = _greedy(topo.count, slice_size, costs)
    else:
        slices = _exact(topo.count, slice_size, costs)
    slices.sort(key=lambda s: (max((costs[(i, j)] for i in s for j in s if i != j), default=0), s))
    return slices[:learners] if learners is not None else slices


def _group_cost(group, costs) -> float:
    return max((costs[(i, j)] for i in group for j in group if i < j), default=0.0)


def _exact(n: int, k: int, costs: dict) -> list[tuple]:
    """The partition into n // k groups (leftovers allowed) with the best (worst link, sum of
    worst links); the group holding the lowest free GPU is chosen first, so each partition is
    seen once."""
    from itertools import combinations
    n_groups = n // k
    spare = n - n_groups * k

    @functools.lru_cache(maxsize=None)
    def best(free: frozenset, spare_left: int):
        if len(free) == spare_left:
            return (0.0, 0.0), ()
        first = min(free)
        options = []
        rest = free - {first}
        for others in combinations(sorted(rest), k - 1):
            group = (first, *others)
            sub = best(rest - set(others), spare_left)
            if sub is None:
                continue
            c = _group_cost(group, costs)
            options.append(((max(c, sub[0][0]), c + sub[0][1]), (group, *sub[1])))
        if spare_left:  # or leave `first` out of every slice
            sub = best(rest, spare_left - 1)
            if sub is not None:
                options.append(sub)
        return min(options) if options else None

    return list(best(frozenset(range(n)), spare)[1])


def _greedy(n: int, k: int, costs: dict) -> list[tuple]:
    """Past 16 GPUs: grow each slice from the lowest free GPU by its best-linked free neighbour."""
    free, slices = list(range(n)), []
    while len(free) >= k:
        group = [free.pop(0)]
        while len(group) < k:
            nxt = min(free, key=lambda g: (max(costs[(m, g)] for m in group), g))
            free.remove(nxt)
            group.append(nxt)
        slices.append(tuple(sorted(group)))
    return slices


def slice_env(gpus) -> dict:
    """The environment that points a learner's server (and its ranks) at its slice."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def device_allow(topo: Topology, gpus) -> list[str]:
    """systemd ``DeviceAllow=`` entries for a slice: its ``/dev/nvidiaN`` files and the driver's
    shared control devices (without which CUDA cannot start)."""
    own = [f"/dev/nvidia{topo.minors[g] if g < len(topo.minors) else g} rw" for g in gpus]
    return own + [f"{d} rw" for d in ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                       "/dev/nvidia-modeset")]
