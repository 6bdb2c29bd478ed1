"""Live measurements where the hardware exists, recorded 2xH200 results (labelled) where it does not.

A lab measures with its own code; on the reference machine (``LABUTILS_RECORD=1``) the result is
saved as ``recorded/<name>.json`` beside the notebook, with the hardware fingerprint and date.
On a machine with too few GPUs the same cell loads that file and says loudly that the numbers
are *recorded*, where and when -- never passed off as live::

    m = recorded.live_or_recorded("00_copy_bandwidth", measure, gpus_needed=2)
    m.data        # what measure() returned (JSON types)
    m.live        # True if measured now
    m.label       # "live: 2x NVIDIA H200" or "RECORDED 2026-11-29: 2x NVIDIA H200" (plot titles)
    m.source      # "live on <fingerprint>" or "RECORDED 2026-11-29 on <fingerprint>" (verdicts, tables)

``claims.show(verdicts, m)`` / ``claims.table(verdicts, m)`` print ``m.source`` beside every verdict;
``live_source()`` is the source of what a notebook judges from its own run, without a measurement.

The ``NCCL_*`` variables set when a measurement ran change what NCCL did (``NCCL_NVLS_ENABLE=0`` turns
NVLink SHARP off), so a recording stores them (``"nccl_env": {...}`` beside ``"fingerprint"``) and a GPU
fingerprint ends with them (``hw.nccl_env_text``). A recording made before that holds no ``"nccl_env"``:
``m.nccl_env`` is None and its fingerprint is shown ending ``| NCCL_* variables not recorded``
(``shown_fingerprint``) -- what was set then is unknown, and nothing is put in its place.
"""
from __future__ import annotations

import dataclasses
import functools
import datetime as _dt
import json
import os
from pathlib import Path
from typing import Callable, Mapping

RECORD_ENV = "LABUTILS_RECORD"
DIR_ENV = "LABUTILS_RECORDED_DIR"


@functools.lru_cache(maxsize=1)
def _this_machine():
    """``hw.describe()`` of this machine (cached: it runs nvidia-smi three times)."""
    from .hw import describe
    return describe(peer_access=False)


def _this_fingerprint(nccl_env: dict | None = None) -> str:
    """The machine's fingerprint with ``nccl_env`` (default: the ``NCCL_*`` variables set now, read afresh
    each time: a notebook may set one after the first measurement)."""
    from .hw import nccl_env as current_nccl_env
    env = current_nccl_env() if nccl_env is None else nccl_env
    return dataclasses.replace(_this_machine(), nccl_env=env).fingerprint()


def shown_fingerprint(doc: dict) -> str:
    """A recording's fingerprint as sources and banners show it: the stored one, ending ``| NCCL_* variables
    not recorded`` where a GPU recording predates ``"nccl_env"`` (a CPU recording's fingerprint has no NCCL
    part: gloo does not read NCCL's variables)."""
    from .hw import NCCL_ENV_NOT_RECORDED
    fp = doc["fingerprint"]
    if "nccl_env" in doc or " | NCCL " not in fp:
        return fp
    return f"{fp} | {NCCL_ENV_NOT_RECORDED}"


def recorded_dir() -> Path:
    """Where recorded results live: ``$LABUTILS_RECORDED_DIR``, else ``./recorded`` when the
    notebook runs from ``notebooks/``, else ``<repo>/notebooks/recorded``."""
    if os.environ.get(DIR_ENV):
        return Path(os.environ[DIR_ENV])
    here = Path.cwd() / "recorded"
    if here.is_dir():
        return here
    return Path(__file__).resolve().parent.parent / "notebooks" / "recorded"


@dataclasses.dataclass
class Measurement:
    """A result and where it came from. ``nccl_env``: the ``NCCL_*`` variables set when it was measured,
    None where a recording predates storing them (unknown)."""
    name: str
    data: dict
    live: bool
    fingerprint: str
    recorded_at: str
    nccl_env: dict | None = None

    @property
    def label(self) -> str:
        """Short provenance for plot titles and tables."""
        hw = self.fingerprint.split(" | ")[0]
        return f"live: {hw}" if self.live else f"RECORDED {self.recorded_at[:10]}: {hw}"

    @property
    def source(self) -> str:
        """Full provenance, as every verdict and summary table prints it (``labutils.claims``)."""
        return source_text(self.live, self.fingerprint, self.recorded_at)


def source_text(live: bool, fingerprint: str, recorded_at: str) -> str:
    """``"live on <fingerprint>"`` or ``"RECORDED <date> on <fingerprint>"``."""
    return f"live on {fingerprint}" if live else f"RECORDED {recorded_at[:10]} on {fingerprint}"


def live_source() -> str:
    """The source of a verdict judged from what this notebook just did on this machine (no measurement
    behind it): ``"live on <this machine's fingerprint>"``."""
    return source_text(True, _this_fingerprint(), "")


def _jsonable(x):
    """Tensors / numpy arrays / numpy scalars -> lists / floats, for json.dump."""
    if hasattr(x, "tolist"):
        return x.tolist()
    if dataclasses.is_dataclass(x):
        return dataclasses.asdict(x)
    raise TypeError(f"cannot store {type(x).__name__} in a recorded result; convert it to lists/numbers.")


def save(name: str, data: dict, fingerprint: str | None = None, directory: Path | None = None,
         nccl_env: dict | None = None) -> Path:
    """Write ``data`` with its provenance to ``<dir>/<name>.json`` and return the path: the fingerprint, the
    ``NCCL_*`` variables set (``nccl_env``; default: those set now), the date, labutils' version."""
    from .hw import nccl_env as current_nccl_env
    nccl_env = current_nccl_env() if nccl_env is None else dict(nccl_env)
    if fingerprint is None:
        fingerprint = _this_fingerprint(nccl_env)
    from . import __version__
    directory = Path(directory) if directory else recorded_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.json"
    doc = {"name": name, "fingerprint": fingerprint, "nccl_env": nccl_env,
           "recorded_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
           "labutils_version": __version__, "data": data}
    path.write_text(json.dumps(doc, indent=1, default=_jsonable) + "\n")
    return path


def load(name: str, directory: Path | None = None) -> Measurement:
    """Read a recorded result.

    Raises:
        FileNotFoundError: no such recording (with the command that makes one).
    """
    directory = Path(directory) if directory else recorded_dir()
    path = directory / f"{name}.json"
    if not path.exists():
        raise FileNotFoundError(
            f"no recorded result {name!r} at {path}. HINT: recordings are made by running the lab "
            f"on a machine with the GPUs it needs, with {RECORD_ENV}=1 (see README, 'Recording reference "
            f"results'); {DIR_ENV} points at another folder of recordings.")
    doc = json.loads(path.read_text())
    return Measurement(doc["name"], doc["data"], False, shown_fingerprint(doc), doc["recorded_at"],
                       doc.get("nccl_env"))


def live_or_recorded(name: str, measure: Callable[[], dict], *, gpus_needed: int = 2,
                     record: bool | None = None, n_gpus: int | None = None) -> Measurement:
    """Measure now if this machine has ``gpus_needed`` GPUs, else load the recording, and say which.

    Args:
        name: recording name, e.g. ``"01_broadcast_sweep"``.
        measure: zero-argument function returning JSON-able data (lists, numbers, strings).
        gpus_needed: GPUs the live measurement needs.
        record: save a live result as the new recording (default: ``$LABUTILS_RECORD == "1"``).
        n_gpus: GPU count to assume (tests); None = ask torch.
    """
    from .config import gpu_count
    n_gpus = gpu_count() if n_gpus is None else n_gpus
    if n_gpus >= gpus_needed:
        from .hw import nccl_env as current_nccl_env
        env = current_nccl_env()
        fp = _this_fingerprint(env)
        data = measure()
        data = json.loads(json.dumps(data, default=_jsonable))  # same types live and recorded
        if record if record is not None else os.environ.get(RECORD_ENV) == "1":
            save(name, data, fingerprint=fp, nccl_env=env)
        print(f"LIVE: measured now on {fp}")
        return Measurement(name, data, True, fp,
                           _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), env)
    try:
        m = load(name)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"cannot show {name!r}: this machine has {n_gpus} GPU(s), measuring it live needs "
            f"{gpus_needed}, and there is no recording of it at {recorded_dir() / (name + '.json')}. "
            f"HINT: record it once on a machine with >= {gpus_needed} GPU(s) by running the lab there with "
            f"{RECORD_ENV}=1 (see README, 'Recording reference results'), or point {DIR_ENV} at a folder "
            f"that holds {name}.json.") from None
    print(f"RECORDED: this machine has {n_gpus} GPU(s); this measurement needs {gpus_needed}.\n"
          f"Showing results recorded by this lab's own code on {m.fingerprint} "
          f"({m.recorded_at[:10]}). They are not measurements of your machine.")
    return m


def awaiting(table: Mapping) -> dict:
    """The entries of ``table`` -- a lab's ``AWAITING_RECORDING``: recording name (or tuple of names) -> verdict
    function, for measurements shown with ``live_or_none`` -- whose recordings all exist now. A lab's
    ``CLAIMS`` takes them in (``CLAIMS.update(recorded.awaiting(AWAITING_RECORDING))``): a CLAIMS entry needs
    its recording, and one made later joins by itself."""
    def names(key):
        return (key,) if isinstance(key, str) else tuple(key)
    return {key: fn for key, fn in table.items()
            if all((recorded_dir() / f"{n}.json").exists() for n in names(key))}


def live_or_none(name: str, measure: Callable[[], dict], *, gpus_needed: int, shows: str,
                 n_gpus: int | None = None) -> Measurement | None:
    """``live_or_recorded(name, measure, gpus_needed=...)``, or None -- after saying so plainly -- where
    this machine lacks the GPUs and no recording of ``name`` exists yet. ``shows`` says what a run with
    enough GPUs will show; nothing is put in place of the missing numbers."""
    from .config import gpu_count
    n_gpus = gpu_count() if n_gpus is None else n_gpus
    try:
        return live_or_recorded(name, measure, gpus_needed=gpus_needed, n_gpus=n_gpus)
    except FileNotFoundError:
        print(f"NO RECORDING YET: this machine has {n_gpus} GPU(s), this measurement needs {gpus_needed}, "
              f"and no run on {gpus_needed} GPUs has been recorded for it yet ({name!r}). Nothing is shown "
              f"in its place.\nA run on {gpus_needed} GPUs will show: {shows}")
        return None
