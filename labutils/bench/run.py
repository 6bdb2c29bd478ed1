"""The driver of ``python -m labutils bench``: run the sweep on ranks, print the table as points
arrive, write the files.

* ``run_standalone``: start the ranks with ``labutils.launch`` (one per GPU, or 2 gloo ranks without
  GPUs); rank 0 appends progress events to a file that this process tails, so the table and a
  progress bar appear while the ranks run.
* ``run_torchrun``: this process is one rank of a ``torchrun`` job (``labutils.config.under_torchrun()``):
  it joins the ``env://`` rendezvous itself and rank 0 prints.
* ``finish``: table or summary, the Markdown note, JSON / CSV / plot files; the exit status.

Each takes the sweep's ``BenchConfig`` and the ``Outputs`` wanted, built and checked by
``labutils.commands.bench`` (which turns a ValueError into a usage error).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import threading
import time

from .. import bandwidth
from . import analysis, files, report
from .config import BenchConfig, Outputs, planned_points
from .sweep import sweep


class Printer:
    """Prints the table as points arrive (header, latency, one line per size) under a tqdm bar."""

    def __init__(self, fingerprint: str, total: int, progress: bool):
        from tqdm import tqdm
        self.fingerprint, self.current = fingerprint, None
        self.bar = tqdm(total=total, unit="point", desc="bench", file=sys.stderr, leave=False,
                        disable=None if progress else True)

    def _out(self, lines) -> None:
        for line in lines:
            self.bar.write(line, file=sys.stdout)

    def handle(self, event: dict) -> None:
        kind = event["event"]
        if kind == "start":
            self._out(report.header_lines({"meta": event["meta"], "fingerprint": self.fingerprint}))
        elif kind == "latency":
            graph = event["row"].get("mode") == "graph"
            self._out(([] if graph else ["#"]) + [report.latency_line(event["row"])])
            self.bar.update(0 if graph else 1)
        elif kind == "rows":
            coll = event["rows"][0]["collective"]
            if coll != self.current:
                self._out(report.block_lines(coll))
                self.current = coll
            self._out([report.row_line(event["rows"])])
            self.bar.set_postfix_str(f"{coll} {bandwidth.format_size(event['rows'][0]['size_bytes'])}")
            self.bar.update(1)

    def finish(self, doc: dict) -> None:
        self.bar.close()
        self._out(["#"] + report.summary_lines(doc["summary"]))


def _tail(path: str, handle, stop: threading.Event) -> None:
    """Feed each complete JSON line of ``path`` to ``handle`` until ``stop`` is set and all is read."""
    pos, buf = 0, ""
    while True:
        done = stop.is_set()
        if os.path.exists(path):
            with open(path) as f:
                f.seek(pos)
                buf += f.read()
                pos = f.tell()
        *lines, buf = buf.split("\n")
        for line in lines:
            if line.strip():
                handle(json.loads(line))
        if done:
            return
        stop.wait(0.1)


def finish(doc: dict, out: Outputs, printer: Printer | None) -> int:
    """Print the table (or, after a live run, its summary), write the files asked for; 1 if any result
    was wrong, else 0."""
    if printer is not None:
        printer.finish(doc)
    else:
        print("\n".join(report.table_lines(doc)))
    if out.note:
        print("\n" + report.link_note(doc))
    if out.json:
        files.write_json(out.json, doc)
    if out.csv:
        files.write_csv(out.csv, doc)
    if out.plot:
        analysis.busbw_figure(doc).savefig(out.plot, dpi=120, bbox_inches="tight")
    wrong = doc["summary"]["wrong_total"]
    if wrong:
        print(f"labutils bench: {wrong} wrong elements: a collective returned wrong data. HINT: see the "
              "#wrong column; rerun that collective alone with --collectives NAME.", file=sys.stderr)
    return 1 if wrong else 0


def run_standalone(cfg: BenchConfig, launch_config, out: Outputs, timeout: float, command: str,
                   t0: float) -> int:
    """Run the sweep on ranks started by ``labutils.launch`` (``launch_config``: a resolved
    ``labutils.config.LaunchConfig``), printing rows as rank 0 reports them."""
    from .. import hw
    from ..errors import RankError, RankTimeout
    from ..launch import launch
    lc = launch_config
    info = hw.describe(peer_access=False)
    printer = Printer(info.fingerprint(), planned_points(cfg, lc.world_size) + 1, out.progress)
    print(f"# {lc.describe()}")
    fd, progress = tempfile.mkstemp(prefix="labutils-bench-", suffix=".jsonl")
    os.close(fd)
    stop = threading.Event()
    tail = threading.Thread(target=_tail, args=(progress, printer.handle, stop), daemon=True)
    tail.start()
    try:
        results = launch(sweep, cfg, world_size=lc.world_size, backend=lc.backend,
                         timeout=timeout, output="live", kwargs={"progress_path": progress})
    except (RankError, RankTimeout) as exc:
        printer.bar.close()
        print(f"labutils bench: {exc}", file=sys.stderr)
        if getattr(exc, "traceback", ""):
            print(exc.traceback, file=sys.stderr)
        return 1
    finally:
        stop.set()
        tail.join()
        os.unlink(progress)
    doc = report.make_doc(results[0], fingerprint=info.fingerprint(), command=command,
                                link_peak_gbps=info.link_peak_gbps if lc.backend == "nccl" else None,
                                wall_s=round(time.perf_counter() - t0, 1))
    return finish(doc, out, printer)


def run_torchrun(cfg: BenchConfig, backend: str, out: Outputs, command: str, t0: float) -> int:
    """Run the sweep as this rank of a torchrun job (``env://``); rank 0 prints and writes."""
    import torch
    import torch.distributed as dist
    from .. import hw
    local = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ["WORLD_SIZE"])
    kw = {}
    if backend == "nccl":
        torch.cuda.set_device(local)
        kw["device_id"] = torch.device("cuda", local)
    dist.init_process_group(backend, **kw)  # env://: MASTER_ADDR/PORT, RANK, WORLD_SIZE from torchrun
    try:
        rank = dist.get_rank()
        printer = None
        if rank == 0:
            fp = hw.describe(peer_access=False)
            printer = Printer(fp.fingerprint(), planned_points(cfg, world_size) + 1, out.progress)
        result = sweep(rank, world_size, cfg, emit=printer.handle if printer else None)
        if rank != 0:
            return 1 if sum(r["wrong"] or 0 for r in result["rows"]) else 0
        one_node = backend == "nccl" and result["meta"]["nodes"] == 1  # else the network is the link
        doc = report.make_doc(result, fingerprint=fp.fingerprint(), command=command,
                                    link_peak_gbps=fp.link_peak_gbps if one_node else None,
                                    wall_s=round(time.perf_counter() - t0, 1))
        return finish(doc, out, printer)
    finally:
        dist.destroy_process_group()
