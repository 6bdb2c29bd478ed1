"""Read what distributed ranks leave behind: flight-recorder records and ``NCCL_DEBUG=INFO`` logs.

Lab 05 uses these to debug hangs like a professional would::

    try:
        labutils.launch(buggy)
    except labutils.RankTimeout as e:
        print(debugging.first_divergence(e.flight))   # which collective the ranks disagree on

    info = debugging.parse_nccl_log(text)             # text printed with env={"NCCL_DEBUG": "INFO"}
    print(debugging.summarize_nccl(info))             # channels, rings, transports (NVLink = P2P)

* ``flight_record`` runs *in a rank*: torch's flight recorder (``TORCH_FR_BUFFER_SIZE``, on by
  default in recent torch: the last 2000 collectives of each process group) as plain data.
* ``first_divergence`` compares the ranks' records: the first collective they disagree on.
* ``parse_nccl_log`` pulls NCCL's set-up report out of a log (pure text in, data out: unit-tested
  on recorded output, no GPU needed). The line formats are NCCL 2.2x's; unknown lines are skipped.
"""
from __future__ import annotations

import collections
import dataclasses
import pickle
import re
import sys

# ----------------------------------------------------------------------------------------------
# Flight recorder

_OP_NAMES = {"all_reduce_barrier": "barrier", "allreduce": "all_reduce", "allgather": "all_gather",
             "allgather_base": "all_gather_into_tensor", "reduce_scatter_base":
             "reduce_scatter_tensor", "alltoall_base": "all_to_all_single", "alltoall": "all_to_all"}


def op_name(profiling_name: str) -> str:
    """``"nccl:all_reduce"`` / ``"gloo:allreduce"`` -> ``"all_reduce"`` (same name on every backend)."""
    name = profiling_name.split(":", 1)[-1].lstrip("_")
    return _OP_NAMES.get(name, name)


def summarize_flight(doc: dict) -> dict:
    """Reduce a flight-recorder dump (``pickle.loads`` of torch's dump) to plain, small data.

    Returns:
        ``{"entries": [{"seq", "op", "sizes", "dtypes", "state", "pg", "p2p"}...], "pg_status"}``;
        ``seq`` is the collective's sequence number in its process group (1, 2, ...).
    """
    entries = []
    for e in doc.get("entries", []):
        pg = e.get("process_group", ("", ""))
        entries.append({
            "seq": int(e.get("p2p_seq_id") if e.get("is_p2p") else e.get("collective_seq_id", 0)),
            "op": op_name(str(e.get("profiling_name", "?"))),
            "sizes": [list(s) for s in e.get("input_sizes", [])],
            "dtypes": list(e.get("input_dtypes", [])),
            "state": e.get("state", ""),
            "pg": str(pg[0] if isinstance(pg, (tuple, list)) else pg),
            "p2p": bool(e.get("is_p2p", False)),
        })
    return {"entries": entries, "pg_status": doc.get("pg_status", {})}


def flight_record(backend: str | None = None) -> dict | None:
    """This rank's flight record (call it inside a rank), or None where torch has none.

    Uses ``torch._C._distributed_c10d._dump_nccl_trace`` (NCCL) or ``_dump_fr_trace`` (other
    backends, torch >= 2.8), without stack traces (cheap). Returns ``summarize_flight(dump)``.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    import torch._C._distributed_c10d as c10d
    names = ["_dump_nccl_trace", "_dump_fr_trace"] if backend in (None, "nccl") else ["_dump_fr_trace"]
    for name in names:
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        for call in (lambda: dump(includeCollectives=True, includeStackTraces=False, onlyActive=False),
                     lambda: dump(True, False, False), dump):
            try:
                summary = summarize_flight(pickle.loads(call()))
            except TypeError:
                continue
            except Exception:  # noqa: BLE001 - e.g. NCCL not initialised: try the next dumper
                break
            if summary["entries"]:
                return summary
            break
    return None


def read_flight_dumps(prefix: str) -> dict[int, dict]:
    """Read the files torch writes on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``): one per rank,
    named ``<prefix><rank>`` (``TORCH_NCCL_DEBUG_INFO_TEMP_FILE`` / ``TORCH_FR_DUMP_TEMP_FILE``),
    pickled (the default) or JSON.

    Returns:
        ``{rank: summarize_flight(dump)}`` for every readable file, ready for ``first_divergence``.
    """
    import glob
    import json
    records = {}
    for path in sorted(glob.glob(f"{glob.escape(prefix)}*")):
        m = re.match(r"(\d+)(?:\D|$)", path[len(prefix):])
        if not m:
            continue
        with open(path, "rb") as f:
            raw = f.read()
        for load in (pickle.loads, json.loads):
            try:
                records[int(m.group(1))] = summarize_flight(load(raw))
                break
            except Exception:  # noqa: BLE001 - other format, or a half-written dump
                continue
    return records


def _describe_call(e: dict) -> str:
    if e["op"] == "barrier":  # NCCL's is an all_reduce of one float, gloo's has no tensor
        return "barrier"
    sizes = ", ".join("x".join(map(str, s)) or "scalar" for s in e["sizes"])
    return f"{e['op']}([{sizes}], {'/'.join(e['dtypes'])})" if e["sizes"] else e["op"]


def first_divergence(records: dict[int, dict | None], pg: str | None = None) -> str:
    """The first collective on which the ranks' flight records disagree, in one sentence.

    Args:
        records: ``{rank: flight_record(...)}`` (e.g. ``RankTimeout.flight``).
        pg: the process group to compare (default: the first one in rank 0's record).

    Returns:
        e.g. ``"collective #3: rank 0 called barrier; rank 1 never did (its last was #2)"``, or
        a sentence saying the records agree or that there are none to compare.
    """
    have = {r: rec for r, rec in sorted(records.items()) if rec and rec.get("entries")}
    if len(have) < 2:
        return ("no flight records to compare (this torch records none for the backend, or the "
                "ranks could not answer)")
    pg = pg if pg is not None else next(e["pg"] for rec in have.values() for e in rec["entries"])
    calls = {r: {e["seq"]: e for e in rec["entries"] if e["pg"] == pg and not e["p2p"]}
             for r, rec in have.items()}
    last = {r: max(c, default=0) for r, c in calls.items()}
    start = max((min(c) for c in calls.values() if c), default=1)  # older ones may have rolled out
    for seq in range(start, max(last.values()) + 1):
        seen = {r: c[seq] for r, c in calls.items() if seq in c}
        missing = [r for r in calls if r not in seen]
        kinds = collections.defaultdict(list)
        for r, e in seen.items():
            kinds[(e["op"], str(e["sizes"]), str(e["dtypes"]))].append(r)
        if missing and seen:
            called = sorted(seen)
            what = _describe_call(seen[called[0]]) if len(kinds) == 1 else "different collectives"
            lasts = sorted({last[r] for r in missing})
            return (f"collective #{seq}: {_ranks(called)} called {what}; {_ranks(missing)} never did "
                    f"({'its' if len(missing) == 1 else 'their'} last was #{'/#'.join(map(str, lasts))})")
        if len(kinds) > 1:
            parts = "; ".join(f"{_ranks(rs)} called {_describe_call(seen[rs[0]])}"
                              for rs in sorted(kinds.values()))
            return f"collective #{seq}: {parts}"
    return f"the ranks' flight records agree: {max(last.values())} collectives, the same on every rank"


_FINGERPRINT = re.compile(r"Rank (\d+) is running collective: CollectiveFingerPrint\(SequenceNumber=\d+, "
                          r"OpType=(\w+)(?:, TensorShape=\[([^\]]*)\])?(?:, TensorDtypes=(\w+))?")


def explain_mismatch(message: str) -> str:
    """``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s "Detected mismatch between collectives" in one line,
    without the device details (``"rank 0: ALLREDUCE([4], Float) / rank 1: BROADCAST([4], Float)"``),
    so that it reads the same under gloo and NCCL. Returns '' for any other message."""
    parts = [f"rank {r}: {op}([{shape}], {dtype})" if shape is not None else f"rank {r}: {op}"
             for r, op, shape, dtype in _FINGERPRINT.findall(message)
             for shape in [shape if shape or dtype else None]]
    return " / ".join(parts)


def describe_flight(record: dict | None, last: int = 5) -> list[str]:
    """The last ``last`` collectives of one rank's flight record, one line each:
    ``"#2 barrier: scheduled"`` (NCCL also says started/completed; gloo only what was issued)."""
    if not record or not record.get("entries"):
        return ["(no flight record)"]
    entries = [e for e in record["entries"] if not e["p2p"]][-last:]
    return [f"#{e['seq']} {_describe_call(e)}: {e['state'] or '?'}" for e in entries]


def _ranks(rs: list[int]) -> str:
    return f"rank {rs[0]}" if len(rs) == 1 else f"ranks {rs}"


# ----------------------------------------------------------------------------------------------
# NCCL_DEBUG=INFO logs

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
