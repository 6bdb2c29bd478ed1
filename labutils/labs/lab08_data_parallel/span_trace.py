"""A recorded kernel timeline as a trace file, for a learner whose machine cannot take the trace itself.

Lab 08 writes a Chrome/Perfetto trace per rank when its DDP timeline runs live on GPUs. A recording keeps
that timeline only as spans (``{"lane", "start_ms", "end_ms", "kind"}``: compute kernels, NCCL kernels,
the optimizer's, per rank), which is what the notebook plots; ``write`` turns them into a small trace file
that opens in the same viewers, labelled with the recording's source::

    path = span_trace.write(per_rank_spans, DDP_M.source, TRACES / "08_ddp_best.RECORDED.json")

One process per rank, one thread per lane, one complete event (``"ph": "X"``) per span, named by its kind:
the kernels' own names are not in the recording, and the trace says so in ``otherData``.
"""
from __future__ import annotations

import json
from pathlib import Path


def chrome_trace(spans: list[dict], source: str) -> dict:
    """Spans (every rank's, lanes named ``"rank r ..."``) as a Chrome trace labelled with ``source``."""
    lanes = list(dict.fromkeys(s["lane"] for s in spans))
    ranks = list(dict.fromkeys(lane.split(" ")[1] if lane.startswith("rank ") else "0" for lane in lanes))

    def pid(lane: str) -> int:
        return ranks.index(lane.split(" ")[1] if lane.startswith("rank ") else "0")
    meta = [{"name": "process_name", "ph": "M", "pid": i, "args": {"name": f"rank {r} (recorded)"}}
            for i, r in enumerate(ranks)]
    meta += [{"name": "process_labels", "ph": "M", "pid": i, "args": {"labels": source}} for i in range(len(ranks))]
    meta += [{"name": "thread_name", "ph": "M", "pid": pid(lane), "tid": t, "args": {"name": lane}}
             for t, lane in enumerate(lanes)]
    events = [{"name": s.get("label") or s.get("kind", s["lane"]), "cat": s.get("kind", "span"), "ph": "X",
               "pid": pid(s["lane"]), "tid": lanes.index(s["lane"]), "ts": s["start_ms"] * 1e3,
               "dur": max(0.0, s["end_ms"] - s["start_ms"]) * 1e3} for s in spans]
    return {"traceEvents": meta + events, "displayTimeUnit": "ms",
            "otherData": {"source": source, "what": "spans of a recorded kernel timeline, named by kind (compute, "
                                                    "nccl, optimizer); the kernels' own names are not recorded"}}


def write(per_rank: list[dict], source: str, path: Path) -> Path:
    """Write the spans of ``per_rank`` (the recording's per-rank timeline summaries, each with ``"spans"``)
    to ``path`` as one labelled trace; returns the path.

    Raises:
        ValueError: no spans to write.
    """
    spans = [s for t in per_rank for s in t.get("spans") or []]
    if not spans:
        raise ValueError(f"no spans to write to {path}. HINT: this recording has no kernel timeline; it is "
                         "taken when the DDP cell runs live on >= 2 GPUs.")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(spans, source)))
    return path
