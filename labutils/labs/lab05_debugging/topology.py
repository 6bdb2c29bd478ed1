"""What the figures in NCCL's topology lines are (lab 05)::

    log = debugging.parse_nccl_log(text)        # text printed with NCCL_DEBUG=INFO, SUBSYS GRAPH
    topology.links_table(log)                   # one row per link: from, to, kind, NCCL's GB/s, meaning
    topology.gpu_paths(log)                     # the paths NCCL found between GPUs

NCCL builds a graph of the machine -- GPUs, NVSwitches, PCIe switches, CPUs, NICs -- and gives every
link a bandwidth of its own, from constants in its source (``src/graph/topo.h``), not from a
measurement. It uses them to choose rings, trees and channel counts. The constants below are those
of NCCL 2.2x; they explain the numbers a log shows.
"""
from __future__ import annotations

from ...debugging.nccl_log import NCCL_LOC_GBPS as LOC_GBPS  # LOC_BW: a node to itself, or a local attachment
from ...debugging.nccl_log import NcclLog, TopoLink, TopoPath

# NCCL's constants (src/graph/topo.h), GB/s: what NCCL assumes, not what was measured.
NVLINK_GBPS_PER_LINK = {           # SMxx_NVLINK_BW: one NVLink, one direction, per GPU generation
    "sm60 (Pascal)": 18.0, "sm70/sm80 (Volta, Ampere)": 20.0, "sm86 (Ampere GA10x)": 12.0,
    "sm90 (Hopper)": 20.6, "sm100 (Blackwell)": 40.1}
PCI_GBPS = {12.0: "PCIe Gen3 x16", 24.0: "PCIe Gen4 x16", 48.0: "PCIe Gen5 x16"}  # lanes x per-lane rate / 80

NODES = {"GPU": "GPU", "NVS": "NVSwitch", "CPU": "CPU (a NUMA node)", "NIC": "network card", "NET": "network port",
         "PCI": "PCIe switch"}
PATH_TYPES = {"LOC": "the node itself", "NVL": "NVLink (directly, or through NVSwitches)",
              "NVB": "NVLink through another GPU", "C2C": "chip-to-chip link", "PIX": "one PCIe switch",
              "PXB": "several PCIe switches", "PXN": "a GPU, then its NIC", "PHB": "PCIe through the CPU's host bridge",
              "SYS": "across CPU sockets", "NET": "the network"}


def node_name(node: str) -> str:
    """``"NVS/0-0"`` -> ``"NVSwitch NVS/0-0"``."""
    return f"{NODES.get(node.split('/')[0], 'node')} {node}"


def nvlink_count(gbps: float) -> tuple[int, str, float] | None:
    """(links, GPU generation, NCCL's GB/s per link) such that links x per-link = ``gbps``, or None."""
    for arch, per_link in NVLINK_GBPS_PER_LINK.items():
        n = gbps / per_link
        if round(n) >= 1 and abs(n - round(n)) < 1e-3:
            return round(n), arch, per_link
    return None


def explain_link(link: TopoLink) -> str:
    """What NCCL's figure on one link of its graph is."""
    if link.gbps == LOC_GBPS:
        where = (" (a network card it found no PCIe path for, such as the loopback interface of the socket "
                 "transport)" if link.dst.startswith("NIC/") else "")
        return f"not a {link.kind} rate: NCCL's placeholder {LOC_GBPS:g} (LOC_BW) for an attachment it treats as local{where}"
    if link.kind == "NVL":
        n = nvlink_count(link.gbps)
        if n:
            return (f"{n[0]} NVLinks x NCCL's {n[2]:g} GB/s per link for {n[1]}, to the "
                    f"{NODES.get(link.dst.split('/')[0], 'node')}")
        return "NCCL's estimate for the NVLinks of this connection"
    if link.kind == "PCI":
        table = PCI_GBPS.get(link.gbps)
        return ("PCIe: NCCL's estimate from the link's lanes and speed"
                + (f" ({table} in its table)" if table else ""))
    if link.kind == "NET":
        return f"network port: NCCL's figure for its speed, about {link.gbps * 8:.0f} Gbit/s"
    return f"{link.kind} link: NCCL's estimate"


def links_table(log: NcclLog) -> list[dict]:
    """One row per link of NCCL's topology graph: from, to, kind, NCCL's GB/s, what that number is."""
    return [{"from": node_name(link.src), "to": node_name(link.dst), "link": link.kind,
             "NCCL's GB/s": link.gbps, "what the number is": explain_link(link)} for link in log.topology]


def gpu_paths(log: NcclLog) -> list[TopoPath]:
    """The paths NCCL found from one GPU to another (not to itself), one per direction."""
    return [p for p in log.paths if p.src.startswith("GPU/") and p.dst.startswith("GPU/") and p.src != p.dst]


def describe_path(path: TopoPath, log: NcclLog) -> str:
    """``"GPU/0-60 -> GPU/0-70: 2 hops of NVLink (...) through NVSwitch NVS/0-0, NCCL rates it 370.8 GB/s"``."""
    via = sorted({link.dst for link in log.topology if link.src in (path.src, path.dst) and link.dst.startswith("NVS/")})
    through = f" through {', '.join(node_name(v) for v in via)}" if via and path.hops > 1 else ""
    return (f"{path.src} -> {path.dst}: {path.hops} hop{'s' if path.hops != 1 else ''} of "
            f"{PATH_TYPES.get(path.type, path.type)}{through}; NCCL rates it {path.gbps:g} GB/s")
