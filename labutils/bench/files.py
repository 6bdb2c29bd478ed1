"""A benchmark result on disk: JSON (everything, with provenance and summary) and CSV (one tidy row per
measurement, the fingerprint in each). Pure I/O, no GPU::

    from labutils.bench import files
    files.write_json("r.json", doc); doc = files.load_json("r.json"); files.write_csv("r.csv", doc)
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

from .report import summarize

CSV_COLUMNS = ("kind", "mode", "collective", "placement", "size_bytes", "count", "type", "redop", "root",
               "time_us", "p10_us", "p90_us", "algbw_gbps", "busbw_gbps", "wrong", "iters", "repeat",
               "bare_us", "world_size", "backend", "fingerprint")


def write_json(path, doc: dict) -> Path:
    path = Path(path)
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load_json(path) -> dict:
    """Read a document written by ``write_json`` (the summary is recomputed if absent)."""
    doc = json.loads(Path(path).read_text())
    if not {"meta", "rows"} <= doc.keys():
        raise ValueError(f"{path} is not a labutils bench result (no 'meta'/'rows'). "
                         "HINT: pass a file written by `python -m labutils bench --json`.")
    doc.setdefault("summary", summarize(doc))
    return doc


def csv_rows(doc: dict) -> list[dict]:
    """Tidy rows (one per measurement, the latency line first) with the fingerprint in each."""
    extra = {"world_size": doc["meta"]["world_size"], "backend": doc["meta"]["backend"],
             "fingerprint": doc.get("fingerprint", "")}
    out = [{"kind": "latency", **doc["latency"], **extra}] if doc.get("latency") else []
    out += [{"kind": "latency", **doc["graph_latency"], **extra}] if doc.get("graph_latency") else []
    out += [{"kind": "sweep", **r, **extra} for r in doc["rows"]]
    return [{k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS} for row in out]


def write_csv(path, doc: dict) -> Path:
    path = Path(path)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        w.writerows(csv_rows(doc))
    return path
