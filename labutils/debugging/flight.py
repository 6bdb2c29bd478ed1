"""Read torch's flight recorder: what collectives each rank issued, and the first one they disagree on.

    try:
        labutils.launch(buggy)
    except labutils.RankTimeout as e:
        print(debugging.first_divergence(e.flight))   # which collective the ranks disagree on

* ``flight_record`` runs *in a rank*: torch's flight recorder (``TORCH_FR_BUFFER_SIZE``, on by
  default in recent torch: the last 2000 collectives of each process group) as plain data.
* ``read_flight_dumps`` reads the files torch writes on a timeout (``TORCH_NCCL_DUMP_ON_TIMEOUT=1``).
* ``first_divergence`` compares the ranks' records: the first collective they disagree on;
  ``describe_flight`` lists one rank's last ones; ``explain_mismatch`` shortens
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL``'s "Detected mismatch between collectives".
"""
from __future__ import annotations

import collections
import pickle
import re
import sys


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

    Uses torch's dumpers (``compat.flight_recorder_dumpers``: ``_dump_nccl_trace`` under NCCL,
    ``_dump_fr_trace`` for other backends, torch >= 2.8), without stack traces (cheap). Returns
    ``summarize_flight(dump)``.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    from .. import compat  # torch is loaded already: a rank with a process group
    for dump in compat.flight_recorder_dumpers(backend):
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
