"""Read an ``NCCL_DEBUG=INFO`` log: NCCL's set-up report (version, rings, channels, transports, topology).

    info = debugging.parse_nccl_log(text)             # text printed with env={"NCCL_DEBUG": "INFO"}
    print(debugging.summarize_nccl(info))             # channels, rings, transports (NVLink = P2P)

``parse_nccl_log`` is pure text in, data out (unit-tested on recorded output, no GPU needed). The line
formats are NCCL 2.2x's; unknown lines are skipped.
"""
from __future__ import annotations

import collections
import dataclasses
import re


@dataclasses.dataclass
class Connection:
    """One line ``Channel 03/0 : 0[0] -> 1[1] via P2P/CUMEM/read`` as seen by ``rank``."""
    rank: int
    channel: int
    src: int
    dst: int
    transport: str


@dataclasses.dataclass(frozen=True)
class TopoLink:
    """One edge of NCCL's topology graph, ``+ NVL[370.8] - NVS/0-0`` under ``GPU/0-60``: from ``src``
    to ``dst`` over a ``kind`` link (NVL, PCI, NET, ...) that NCCL rates at ``gbps`` (its estimate)."""
    src: str
    kind: str
    gbps: float
    dst: str


@dataclasses.dataclass(frozen=True)
class TopoPath:
    """NCCL's best path from ``src`` to ``dst`` (``GPU/0-70 (2/370.8/NVL)``): ``hops`` links, the
    bandwidth NCCL rates it at, and its type (LOC = itself, NVL, NVB, PIX, PXB, PHB, SYS, NET)."""
    src: str
    dst: str
    hops: int
    gbps: float
    type: str


@dataclasses.dataclass
class NcclLog:
    """What NCCL reported while setting up a communicator (``parse_nccl_log``)."""
    version: str = ""
    nranks: int = 0
    rings: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    connections: list[Connection] = dataclasses.field(default_factory=list)
    channels: dict[str, int] = dataclasses.field(default_factory=dict)
    links: list[tuple[str, float, str]] = dataclasses.field(default_factory=list)
    bootstrap: str = ""
    network: str = ""
    collnet_plugin: str = ""  # the CollNet plugin NCCL loaded ("SHARP"), "" if none: then no CollNet
    devices: dict[int, str] = dataclasses.field(default_factory=dict)
    collectives: list[tuple[int, str, int]] = dataclasses.field(default_factory=list)
    topology: list[TopoLink] = dataclasses.field(default_factory=list)
    paths: list[TopoPath] = dataclasses.field(default_factory=list)
    env: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def transports(self) -> dict[str, int]:
        """``{transport: number of channel connections}``, most used first."""
        return dict(collections.Counter(c.transport for c in self.connections).most_common())


_PREFIX = re.compile(r"^\[rank (\d+)\] ")
_NCCL = re.compile(r"(?:\[(\d+)\] )?NCCL INFO (.*)$")
_PATTERNS = {
    "version": re.compile(r"NCCL version (\S+)"),
    "ring": re.compile(r"^Channel (\d+)/(\d+) :((?:\s+\d+)+)\s*$"),
    "conn": re.compile(r"^Channel (\d+)(?:/\d+)? : (\d+)\[[^\]]*\] -> (\d+)\[[^\]]*\]"
                       r"(?: \[(?:send|receive)\])? via (.+?)\s*$"),
    # The "collnet channels" slot is not read: NCCL's src/init.cc passes comm->nChannels for it too (recent
    # versions), so it repeats the coll count whether or not CollNet exists. "collnet_plugin" says that.
    "channels": re.compile(r"(\d+) coll channels, \d+ collnet channels, (\d+) nvls channels, "
                           r"(\d+) p2p channels, (\d+) p2p channels per peer"),
    "collnet_plugin": re.compile(r"Loaded collnet plugin (.+?)(?: \(v\d+\))?\s*$"),
    "comm": re.compile(r"rank (\d+) nRanks (\d+)|rank (\d+) nranks (\d+) cudaDev (\d+) "
                       r"(?:nvmlDev \d+ )?busId (\w+)"),
    "link": re.compile(r"\+ (NVL|PCI|SYS|NET|C2C|NVS)\[([\d.]+)\] - (\S+)"),
    "bootstrap": re.compile(r"Bootstrap\s*: Using (\S+)"),
    "network": re.compile(r"Using network (\S+)"),
    "coll": re.compile(r"^(\w+): opCount (\w+) .*?count (\d+)"),
    "node": re.compile(r"^([A-Z]+/[\w-]+) \(\d+/\d+/-?\d+\)$"),
    "paths": re.compile(r"^([A-Z]+/[\w-]+) :(.*\(\d+/[\d.]+/\w+\).*)$"),
    "env": re.compile(r"^(\w+) set by environment to (.*?)\.?$"),
}
_PATH = re.compile(r"([A-Z]+/[\w-]+) \((\d+)/([\d.]+)/(\w+)\)")


def _topology_line(log: NcclLog, stack: list, raw: str) -> bool:
    """A line of NCCL's topology tree (after ``=== System``): a root node (``CPU/0-... (1/1/4)``) or
    an indented ``+ KIND[bw] - NODE``, whose parent is the nearest line above it with less indent."""
    body = raw.rstrip()
    if p := _PATTERNS["node"].match(body.strip()):
        if body.startswith(" "):
            return False
        stack[:] = [(-1, p.group(1))]
        return True
    p = _PATTERNS["link"].search(body)
    if not p or not stack:
        return False
    indent = len(body) - len(body.lstrip())
    while len(stack) > 1 and stack[-1][0] >= indent:
        stack.pop()
    link = TopoLink(stack[-1][1], p.group(1), float(p.group(2)), p.group(3))
    if link not in log.topology:  # every rank prints the same graph
        log.topology.append(link)
    if (link.kind, link.gbps, link.dst) not in log.links:
        log.links.append((link.kind, link.gbps, link.dst))
    stack.append((indent, p.group(3)))
    return True


def parse_nccl_log(text: str) -> NcclLog:
    """Parse ``NCCL_DEBUG=INFO`` output (with or without labutils' ``[rank r]`` prefixes).

    Rings are printed by rank 0 only (``Channel 00/24 :    0   1``: channel 0 of 24, ring order);
    each rank prints its own connections (``Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read``).
    With ``NCCL_DEBUG_SUBSYS`` including ``GRAPH``, the topology tree (``CPU/0-0 (1/1/4)`` then
    indented ``+ NVL[370.8] - NVS/0-0`` lines: the links NCCL found and the bandwidth it assigns them,
    in GB/s) becomes ``topology`` (``TopoLink``s, each with the node it hangs from) and ``links``, and
    the path lines (``GPU/0-60 :GPU/0-70 (2/370.8/NVL) ...``) become ``paths``; with ``COLL``, each
    collective call appears (``AllReduce: opCount 0 ... count 262144``). ``env`` holds the settings
    NCCL says it took from the environment (``NCCL_NVLS_ENABLE set by environment to 0.``).
    """
    log = NcclLog()
    stacks: dict[int, list] = collections.defaultdict(list)  # the topology tree being read, per rank
    for line in text.splitlines():
        m = _PREFIX.match(line)
        rank = int(m.group(1)) if m else None
        m = _NCCL.search(line)
        if not m:
            continue
        rank = rank if rank is not None else int(m.group(1) or 0)
        body = m.group(2).strip()
        if _topology_line(log, stacks[rank], m.group(2)):
            continue
        if p := _PATTERNS["paths"].match(body):
            for dst, hops, gbps, kind in _PATH.findall(p.group(2)):
                path = TopoPath(p.group(1), dst, int(hops), float(gbps), kind)
                if path not in log.paths:
                    log.paths.append(path)
            continue
        if p := _PATTERNS["env"].match(body):
            log.env[p.group(1)] = p.group(2)
            continue
        if (p := _PATTERNS["version"].search(body)) and not log.version:
            log.version = p.group(1)
        elif p := _PATTERNS["ring"].match(body):
            log.rings.setdefault(int(p.group(1)), [int(x) for x in p.group(3).split()])
        elif p := _PATTERNS["conn"].match(body):
            log.connections.append(Connection(rank, int(p.group(1)), int(p.group(2)),
                                              int(p.group(3)), p.group(4)))
        elif p := _PATTERNS["channels"].search(body):
            keys = ("coll", "nvls", "p2p", "p2p_per_peer")
            log.channels = dict(zip(keys, map(int, p.groups())))
        elif p := _PATTERNS["coll"].match(body):
            log.collectives.append((rank, p.group(1), int(p.group(3))))
        elif p := _PATTERNS["link"].search(body):
            log.links.append((p.group(1), float(p.group(2)), p.group(3)))
        elif p := _PATTERNS["collnet_plugin"].search(body):
            log.collnet_plugin = log.collnet_plugin or p.group(1)
        elif p := _PATTERNS["bootstrap"].search(body):
            log.bootstrap = log.bootstrap or p.group(1)
        elif p := _PATTERNS["network"].search(body):
            log.network = log.network or p.group(1)
        elif p := _PATTERNS["comm"].search(body):
            if p.group(2):
                log.nranks = max(log.nranks, int(p.group(2)))
            else:
                log.nranks = max(log.nranks, int(p.group(4)))
                log.devices[int(p.group(3))] = f"cuda:{p.group(5)} busId {p.group(6)}"
    return log


NCCL_LOC_GBPS = 5000.0  # NCCL's LOC_BW (src/graph/topo.h): the figure it gives a node's local attachment

TRANSPORTS = {
    "P2P": "GPU to GPU directly (NVLink when the GPUs are NVLink-connected, else PCIe)",
    "SHM": "through host shared memory: the GPUs cannot reach each other directly",
    "NET": "through the network plugin (Socket = TCP, IB = InfiniBand/RoCE)",
    "NVLS": "NVLink SHARP: reductions inside the NVSwitch (multicast)",
    "COLLNET": "in-network reductions (SHARP on InfiniBand switches)",
}
DETAILS = {
    "CUMEM": "buffers shared through CUDA's virtual-memory API (cuMem*)",
    "IPC": "buffers shared through cudaIpc handles", "direct pointer": "same process, plain pointer",
    "read": "the receiver reads from the sender's buffer",
    "GDRDMA": "the NIC reads GPU memory directly (GPUDirect RDMA)",
}


def explain_transport(transport: str) -> str:
    """One line for a transport string, e.g. ``"P2P/CUMEM/read"``."""
    parts = transport.split("/")
    head = TRANSPORTS.get(parts[0].upper(), "unknown transport")
    extra = [DETAILS[p] for p in parts[1:] if p in DETAILS]
    return f"{transport}: {head}" + (f"; {'; '.join(extra)}" if extra else "")


def summarize_nccl(log: NcclLog) -> str:
    """A few lines a person can read instead of the wall of ``NCCL INFO`` lines."""
    lines = [f"NCCL {log.version or '?'}: {log.nranks or '?'} ranks"
             + (f", bootstrap over {log.bootstrap}" if log.bootstrap else "")]
    if log.channels:
        c = log.channels
        lines.append(f"channels: {c['coll']} for collectives, {c['p2p']} for point-to-point, {c['nvls']} NVLS")
    if log.network:  # NCCL has chosen its network, so it has loaded its plugins: a CollNet one would show
        collnet = (f"plugin {log.collnet_plugin} loaded (used with NCCL_COLLNET_ENABLE=1)" if log.collnet_plugin
                   else "none (NCCL loaded no CollNet plugin)")
        lines.append(f"network between nodes: {log.network}; CollNet (reductions inside the network switches): "
                     f"{collnet}")
    if log.rings:
        orders = collections.Counter(" -> ".join(map(str, r + r[:1])) for r in log.rings.values())
        lines.append(f"rings: {len(log.rings)} channels; ring order(s): "
                     + ", ".join(f"{o} (x{n})" for o, n in orders.items()))
    for transport, n in log.transports.items():
        lines.append(f"{n} channel connections via {explain_transport(transport)}")
    links = sorted({(k, bw) for k, bw, _ in log.links})
    if links:
        lines.append("links in NCCL's topology graph, rated by NCCL's own constants (GB/s; estimates, not "
                     "measurements): " + ", ".join(f"{k} {bw:g}" + (" (its placeholder for a local attachment)"
                                                                     if bw == NCCL_LOC_GBPS else "")
                                                   for k, bw in links))
    if log.collectives:
        per_rank = collections.Counter(r for r, _, _ in log.collectives)
        lines.append("collective calls logged: " + ", ".join(f"rank {r}: {n}" for r, n in sorted(per_rank.items())))
    return "\n".join(lines)
