"""Describe the machine: mode, GPUs, how they are linked, software versions, and a fingerprint.

``describe()`` gathers; the ``parse_*`` and ``summarize_*`` functions are pure (unit-tested on
recorded ``nvidia-smi`` / NVML output) so the logic does not need a GPU to be checked.

Two NVLink peaks per GPU and direction: ``link_peak_gbps`` sums the per-link *line rates*
``nvidia-smi nvlink -s`` prints (raw signalling, coding bits included: a ceiling no payload reaches;
the labs draw it as "NVLink peak"); ``link_data_peak_gbps`` is links x the datasheet *data rate* per
link of the NVLink version NVML reports (25 GB/s for NVLink 2-4, 50 for NVLink 5), the ceiling a copy
can approach. ``nvlinks`` says what the links end at (NVML): ``GPU`` (direct) or ``NVSwitch``.

The ``NCCL_*`` environment variables that are set change what NCCL does on the same hardware
(``NCCL_NVLS_ENABLE=0`` turns NVLink SHARP off on an NVSwitch board, ``NCCL_ALGO``/``NCCL_PROTO`` pin an
algorithm or protocol), so a GPU machine's fingerprint ends with them (``nccl_env``, ``nccl_env_text``):
``... | driver 580.159.04 | NCCL_NVLS_ENABLE=0``, or ``... | no NCCL_* set``.

Modes (what the labs do with them):

* ``"multi-gpu"``: >= 2 CUDA GPUs: NCCL, live measurements;
* ``"single-gpu"``: 1 GPU: single-device parts live, the rest from recorded 2xH200 results;
* ``"cpu"``: gloo ranks for correctness, recorded results for every measurement.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import re
import shlex
import shutil
import subprocess

MODES = ("multi-gpu", "single-gpu", "cpu")


def detect_mode(n_gpus: int | None = None) -> str:
    """``"multi-gpu"``, ``"single-gpu"`` or ``"cpu"`` for ``n_gpus`` (None = ask torch)."""
    if n_gpus is None:
        from .config import gpu_count
        n_gpus = gpu_count()
    return "multi-gpu" if n_gpus >= 2 else ("single-gpu" if n_gpus == 1 else "cpu")


NCCL_PREFIX = "NCCL_"
NO_NCCL_ENV = f"no {NCCL_PREFIX}* set"
NCCL_ENV_NOT_RECORDED = f"{NCCL_PREFIX}* variables not recorded"


def nccl_env(environ=None) -> dict[str, str]:
    """The ``NCCL_*`` variables set in ``environ`` (default: this process's environment), sorted by name."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in sorted(environ) if k.startswith(NCCL_PREFIX)}


def nccl_env_text(env: dict | None) -> str:
    """One stable line for a fingerprint: ``"NCCL_ALGO=Ring NCCL_NVLS_ENABLE=0"`` (sorted, each value quoted
    as a shell would need it), ``"no NCCL_* set"`` for ``{}``, ``"NCCL_* variables not recorded"`` for None
    (a recording made before fingerprints carried them: what was set then is unknown, never guessed)."""
    if env is None:
        return NCCL_ENV_NOT_RECORDED
    if not env:
        return NO_NCCL_ENV
    one_line = {k: shlex.quote(str(v).replace("\n", "\\n")) for k, v in env.items()}   # a fingerprint is one line
    return " ".join(f"{k}={v}" for k, v in sorted(one_line.items()))


def parse_topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """Parse ``nvidia-smi topo -m`` into ``{(i, j): "NV18" | "PIX" | "SYS" | ...}`` for GPU pairs.

    ANSI escapes (the header is underlined) and non-GPU columns (NICs, CPU affinity) are ignored.
    """
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)
    rows = [line.split() for line in text.splitlines() if line.strip()]
    header = next((r for r in rows if r and r[0].startswith("GPU")), None)
    if header is None:
        return {}
    gpu_cols = [c for c in header if re.fullmatch(r"GPU\d+", c)]
    links: dict[tuple[int, int], str] = {}
    for r in rows:
        if r is header or not re.fullmatch(r"GPU\d+", r[0]):
            continue
        i = int(r[0][3:])
        for col, val in zip(gpu_cols, r[1:1 + len(gpu_cols)]):
            j = int(col[3:])
            if i != j:
                links[(i, j)] = val
    return links


def parse_nvlink_speeds(text: str) -> dict[int, list[float]]:
    """Parse ``nvidia-smi nvlink -s`` into ``{gpu: [GB/s of each active link]}``.

    Inactive links (``<inactive>``) are left out. The per-link figure is what the driver reports
    for one direction.
    """
    speeds: dict[int, list[float]] = {}
    gpu = None
    for line in text.splitlines():
        m = re.match(r"\s*GPU (\d+):", line)
        if m:
            gpu = int(m.group(1))
            speeds[gpu] = []
            continue
        m = re.match(r"\s*Link \d+:\s*([\d.]+)\s*GB/s", line)
        if m and gpu is not None:
            speeds[gpu].append(float(m.group(1)))
    return speeds


# NVML enums (nvml.h): nvmlNvLinkDeviceType of the remote end, and nvmlNvlinkVersion_t.
NVLINK_REMOTE = {0: "GPU", 1: "IBM NPU", 2: "NVSwitch", 255: "unknown"}
NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0"}
# Data rate of one link, per direction, GB/s (NVIDIA datasheets: P100, V100, A100, H100/H200, B200).
NVLINK_DATA_GBPS = {"1.0": 20.0, "2.0": 25.0, "2.2": 25.0, "3.0": 25.0, "3.1": 25.0, "4.0": 25.0, "5.0": 50.0}


def summarize_nvlinks(links: list[tuple[int, int]], hopper: bool = False) -> dict:
    """What a GPU's active NVLinks end at, from NVML codes ``[(remote_type, version), ...]``.

    Returns ``{"links": n, "remote": {"NVSwitch": n, ...}, "version": "4.0" | None}``. Some drivers
    report NVLink 5.0 for Hopper GPUs, whose links are NVLink 4 (``hopper=True`` corrects that).
    """
    remote: dict[str, int] = {}
    for code, _ in links:
        name = NVLINK_REMOTE.get(code, f"type {code}")
        remote[name] = remote.get(name, 0) + 1
    versions = {NVLINK_VERSIONS.get(v) for _, v in links}
    version = versions.pop() if len(versions) == 1 else None
    if hopper and version == "5.0":
        version = "4.0"
    return {"links": len(links), "remote": remote, "version": version}


# nvmlClocksEventReasons (nvml.h): why the SM clock is where it is, one bit per reason.
CLOCK_EVENT_REASONS = {0x1: "GPU idle", 0x2: "applications clocks setting", 0x4: "software power cap",
                       0x8: "hardware slowdown", 0x10: "sync boost", 0x20: "software thermal slowdown",
                       0x40: "hardware thermal slowdown", 0x80: "hardware power brake",
                       0x100: "display clock setting"}


def clock_event_reasons_query(pynvml):
    """NVML's query of the current clock-event reasons (a bit mask, ``CLOCK_EVENT_REASONS``) under the name
    the installed nvidia-ml-py has: ``nvmlDeviceGetCurrentClocksEventReasons``, called
    ``nvmlDeviceGetCurrentClocksThrottleReasons`` before NVML 12 (a new nvidia-ml-py on an old driver has the
    new name but not the driver's function: the old name is tried then). None if it has neither."""
    names = [n for n in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
             if hasattr(pynvml, n)]
    if not names:
        return None

    def query(handle) -> int:
        for name in names[:-1]:
            try:
                return int(getattr(pynvml, name)(handle))
            except Exception:  # noqa: BLE001 - the driver lacks this name: try the next one
                pass
        return int(getattr(pynvml, names[-1])(handle))
    return query


def reason_words(mask: int) -> list[str]:
    """The reasons set in a clock-event bit mask, in words (unknown bits as ``"0x..."``)."""
    words = [w for bit, w in CLOCK_EVENT_REASONS.items() if mask & bit]
    rest = mask & ~sum(CLOCK_EVENT_REASONS)
    return words + ([hex(rest)] if rest else [])


def nvml_nvlinks(n_gpus: int) -> dict[int, dict]:
    """``{gpu: summarize_nvlinks(...)}`` for GPUs ``0 .. n_gpus-1`` (NVML's index order) with at least
    one active link, read through ``pynvml`` (package nvidia-ml-py). ``{}`` when NVML, the driver or
    the package is missing: callers treat the remote ends as unknown."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no package, no driver, no NVML: nothing to report
        return {}
    out = {}
    try:
        for i in range(n_gpus):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            try:
                hopper = pynvml.nvmlDeviceGetArchitecture(handle) == getattr(pynvml, "NVML_DEVICE_ARCH_HOPPER", 9)
            except Exception:  # noqa: BLE001 - old driver: no architecture query
                hopper = False
            links = []
            for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
                try:
                    if pynvml.nvmlDeviceGetNvLinkState(handle, link) != 1:  # NVML_FEATURE_ENABLED
                        continue
                    links.append((int(pynvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)),
                                  int(pynvml.nvmlDeviceGetNvLinkVersion(handle, link))))
                except Exception:  # noqa: BLE001 - no such link, or not supported on this GPU
                    continue
            if links:
                out[i] = summarize_nvlinks(links, hopper=hopper)
    except Exception:  # noqa: BLE001 - a driver that answers some queries and not others
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
    return out


# GT/s per lane and line-code efficiency by PCIe generation (PCI-SIG base specifications).
_PCIE_GTS = {1: (2.5, 8 / 10), 2: (5.0, 8 / 10), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130),
             5: (32.0, 128 / 130), 6: (64.0, 242 / 256)}


def pcie_peak_gbps(gen: int, width: int) -> float:
    """Per-direction PCIe payload ceiling in GB/s before packet overheads, e.g. Gen5 x16 = 63.0.

    Raises:
        ValueError: unknown generation or width < 1.
    """
    if gen not in _PCIE_GTS or width < 1:
        raise ValueError(f"unknown PCIe link gen {gen!r} x{width!r}. HINT: gen 1..6, width >= 1.")
    gts, eff = _PCIE_GTS[gen]
    return round(gts * eff * width / 8, 1)


def parse_pcie(text: str) -> dict[int, tuple[int, int]]:
    """Parse ``nvidia-smi --query-gpu=index,pcie.link.gen.max,pcie.link.width.max
    --format=csv,noheader`` into ``{gpu: (gen, width)}`` (rows that are not numbers are skipped)."""
    out = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            out[int(parts[0])] = (int(parts[1]), int(parts[2]))
    return out


def _run(cmd: list[str], timeout_s: float = 20.0) -> str:
    if shutil.which(cmd[0]) is None:
        return ""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclasses.dataclass
class GPU:
    index: int
    name: str
    memory_gib: float


@dataclasses.dataclass(repr=False)
class HardwareInfo:
    """What ``describe()`` found. ``links[(i, j)]`` is the topo code (``NV18`` = 18 NVLinks)."""
    mode: str
    gpus: list
    links: dict
    peer_access: dict
    nvlink_gbps: dict
    pcie: dict
    torch_version: str
    cuda_version: str
    nccl_version: str
    driver_version: str
    python_version: str
    cpu_count: int
    nvlinks: dict = dataclasses.field(default_factory=dict)  # {gpu: summarize_nvlinks(...)}, from NVML
    nccl_env: dict = dataclasses.field(default_factory=dict)  # the NCCL_* variables set (nccl_env())

    @property
    def link_peak_gbps(self) -> float | None:
        """Per-direction NVLink *line rate* of GPU 0: the sum of the per-link rates ``nvidia-smi nvlink
        -s`` reports (GB/s), a ceiling no payload reaches; None if unknown."""
        v = self.nvlink_gbps.get(0)
        return round(sum(v), 1) if v else None

    @property
    def link_data_peak_gbps(self) -> float | None:
        """Per-direction NVLink *data rate* of GPU 0: its active links x the datasheet rate per link of
        the NVLink version NVML reports (GB/s); None if NVML or the version is unknown."""
        info = self.nvlinks.get(0, {})
        rate = NVLINK_DATA_GBPS.get(info.get("version"))
        return round(info["links"] * rate, 1) if rate and info.get("links") else None

    @property
    def nvlink_remote(self) -> dict:
        """What GPU 0's active NVLinks end at, ``{"NVSwitch": 18}`` or ``{"GPU": 4}``; ``{}`` if unknown."""
        return dict(self.nvlinks.get(0, {}).get("remote", {}))

    @property
    def pcie_peak_gbps(self) -> float | None:
        """Per-direction PCIe ceiling of GPU 0 (GB/s) from its maximum link gen/width, None if unknown."""
        if 0 not in self.pcie:
            return None
        try:
            return pcie_peak_gbps(*self.pcie[0])
        except ValueError:
            return None

    def fingerprint(self) -> str:
        """One line identifying the hardware and software of a measurement, e.g.
        ``2x NVIDIA H200 | NV18 | torch 2.11.0+cu130 | CUDA 13.0 | NCCL 2.28.9 | driver 580.159.04 |
        NCCL_NVLS_ENABLE=0``. The ``NCCL_*`` part (``nccl_env_text``) is on GPU machines only: without GPUs
        the ranks use gloo, which NCCL's variables do not touch."""
        if self.gpus:
            names = sorted({g.name for g in self.gpus})
            parts = [f"{len(self.gpus)}x {'/'.join(names)}"]
            link = self.links.get((0, 1))
            if link:
                parts.append(link)
        else:
            parts = [f"CPU only ({platform.machine()}, {self.cpu_count} cores)"]
        parts.append(f"torch {self.torch_version}")
        if self.gpus:
            parts += [f"CUDA {self.cuda_version}", f"NCCL {self.nccl_version}",
                      f"driver {self.driver_version}", nccl_env_text(self.nccl_env)]
        return " | ".join(parts)

    def rows(self) -> list[tuple[str, str]]:
        """(field, value) rows for a table."""
        rows = [("mode", self.mode)]
        for g in self.gpus:
            rows.append((f"GPU {g.index}", f"{g.name}, {g.memory_gib:.0f} GiB"))
        for (i, j), code in sorted(self.links.items()):
            if i < j:
                peer = self.peer_access.get((i, j))
                rows.append((f"link GPU{i}-GPU{j}", f"{code} (peer access: {peer})"))
        if self.nvlink_remote:
            ends = ", ".join(f"{n} to {kind}" for kind, n in self.nvlink_remote.items())
            version = self.nvlinks[0].get("version")
            rows.append(("NVLinks of GPU 0", f"{ends}" + (f" (NVLink {version})" if version else "")))
        if self.link_peak_gbps:
            n = len(self.nvlink_gbps.get(0, []))
            rows.append(("NVLink line rate per GPU", f"{self.link_peak_gbps} GB/s per direction "
                         f"({n} links x {self.nvlink_gbps[0][0]} GB/s, nvidia-smi)"))
        if self.link_data_peak_gbps:
            rows.append(("NVLink data rate per GPU", f"{self.link_data_peak_gbps} GB/s per direction "
                         f"(datasheet: {NVLINK_DATA_GBPS[self.nvlinks[0]['version']]:g} GB/s per link)"))
        if self.pcie_peak_gbps:
            gen, width = self.pcie[0]
            rows.append(("PCIe (host link)", f"Gen{gen} x{width}: {self.pcie_peak_gbps} GB/s per direction"))
        rows += [("torch", self.torch_version), ("CUDA", self.cuda_version),
                 ("NCCL", self.nccl_version), ("NCCL_* variables", nccl_env_text(self.nccl_env)),
                 ("driver", self.driver_version),
                 ("python", self.python_version), ("CPU cores", str(self.cpu_count)),
                 ("fingerprint", self.fingerprint())]
        return rows

    def __str__(self) -> str:
        import pandas as pd
        table = pd.Series(dict(self.rows()))
        table = table.str.ljust(int(table.str.len().max()))  # values read from the left
        with pd.option_context("display.max_colwidth", None, "display.width", None):
            text = table.to_string()
        return "\n".join(line.rstrip() for line in text.splitlines())

    __repr__ = __str__  # a notebook's last expression shows the table, not the dataclass fields

    def _repr_html_(self) -> str:
        body = "".join(f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'>{v}</td></tr>"
                       for k, v in self.rows())
        return f"<table>{body}</table>"


def describe(peer_access: bool = True) -> HardwareInfo:
    """Inspect this machine (GPUs via torch, links via ``nvidia-smi`` when it is installed).

    Args:
        peer_access: also query ``torch.cuda.can_device_access_peer`` (creates a CUDA context
            on each GPU in this process; harmless for the labs, which start ranks with spawn).
    """
    import sys
    import torch
    from .config import gpu_count
    n = gpu_count()
    gpus = []
    for i in range(n):
        p = torch.cuda.get_device_properties(i)
        gpus.append(GPU(i, p.name, p.total_memory / 2**30))
    peer = {}
    if peer_access and n >= 2:
        peer = {(i, j): torch.cuda.can_device_access_peer(i, j)
                for i in range(n) for j in range(n) if i != j}
    links = parse_topo_matrix(_run(["nvidia-smi", "topo", "-m"])) if n >= 2 else {}
    nvlink = parse_nvlink_speeds(_run(["nvidia-smi", "nvlink", "-s"])) if n >= 1 else {}
    pcie = parse_pcie(_run(["nvidia-smi", "--query-gpu=index,pcie.link.gen.max,pcie.link.width.max",
                            "--format=csv,noheader"])) if n >= 1 else {}
    nvlinks = nvml_nvlinks(n) if n >= 1 else {}
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).strip()
    nccl = ""
    if torch.cuda.is_available() and hasattr(torch.cuda, "nccl"):
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
        except (RuntimeError, AttributeError):
            nccl = ""
    return HardwareInfo(
        mode=detect_mode(n), gpus=gpus, links=links, peer_access=peer,
        nvlink_gbps={k: v for k, v in nvlink.items() if v}, pcie=pcie,
        torch_version=torch.__version__, cuda_version=torch.version.cuda or "none",
        nccl_version=nccl or "none", driver_version=driver.splitlines()[0] if driver else "none",
        python_version=sys.version.split()[0], cpu_count=os.cpu_count() or 0, nvlinks=nvlinks,
        nccl_env=nccl_env())
