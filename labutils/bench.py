"""``python -m labutils bench``: benchmark torch.distributed collectives the nccl-tests way.

    python -m labutils bench                                  # 7 collectives, 8 B .. 128 MiB, every GPU
    python -m labutils bench -b 1K -e 1G -f 2 --json r.json --csv r.csv --plot r.png
    python -m labutils bench --backend gloo -e 4M             # CPU only: gloo ranks (labelled)
    torchrun --nproc-per-node 8 -m labutils bench -b 8 -e 1G  # under torchrun (env://), one or more nodes
    python -m labutils bench --from-json r.json --note        # re-print a recorded run (+ README note)

Standalone, it starts its ranks with ``labutils.launch`` (one per GPU, or 2 gloo ranks without
GPUs) and shows progress while they run; under torchrun (``RANK``/``WORLD_SIZE`` set) every
process joins the env:// rendezvous itself and rank 0 prints. The rank-side work is in
``bench_ops``, the table and files in ``bench_report``. Exit status: 0, 1 if any result was wrong
or a rank failed, 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
import threading
import time
from pathlib import Path

from . import bandwidth, bench_ops, bench_report

_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_size(text: str) -> int:
    """``"8"`` -> 8, ``"1K"`` -> 1024, ``"64M"``, ``"1G"``, ``"1.5M"``, ``"4KiB"`` (binary, as nccl-tests).

    Raises:
        argparse.ArgumentTypeError: not a size (the message has the fix).
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGkmg]?)(?:i?B)?\s*", str(text))
    if not m or float(m.group(1)) * _UNITS[m.group(2).upper()] < 1:
        raise argparse.ArgumentTypeError(
            f"invalid size {text!r}. HINT: bytes or a binary unit K, M, G, e.g. 8, 1K, 64M, 1G.")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = None
        if v is None or v < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}.")
        return v
    return parse


def _typed(fn):
    def parse(text: str):
        try:
            return fn(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return parse


def _collectives(text: str) -> tuple:
    names = [t for t in text.replace(" ", "").split(",") if t]
    return bandwidth.OPS if names == ["all"] else tuple(bandwidth.canonical_op(t) for t in names)


def _redop(text: str) -> str:
    if text.lower() not in bench_ops.REDOPS:
        raise ValueError(f"unknown reduction {text!r}. HINT: one of {', '.join(bench_ops.REDOPS)}.")
    return text.lower()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.set_defaults(_bench_parser=p)
    g = p.add_argument_group("sweep (nccl-tests' options)")
    g.add_argument("-b", "--minbytes", type=parse_size, default=8, help="smallest size (default 8)")
    g.add_argument("-e", "--maxbytes", type=parse_size, default=None,
                   help="largest size (default 128M with nccl, 4M with gloo)")
    g.add_argument("-f", "--stepfactor", type=_int_at_least(2), default=2, help="size factor (default 2)")
    g.add_argument("-n", "--iters", type=_int_at_least(1), default=None,
                   help="calls per sample (default: auto, 20 up to 64 MiB, fewer above, >= 5)")
    g.add_argument("-w", "--warmup_iters", type=_int_at_least(0), default=5, help="warm-up calls (default 5)")
    g.add_argument("-d", "--datatype", type=_typed(bench_ops.canonical_dtype), default="float",
                   help=f"one of {', '.join(bench_ops.DTYPES)} (default float)")
    g.add_argument("-o", "--op", type=_typed(_redop), default="sum", help="reduction: sum, prod, max, min, avg")
    g.add_argument("-r", "--root", type=_int_at_least(0), default=0, help="root of broadcast/reduce (default 0)")
    g.add_argument("-c", "--check", type=_int_at_least(0), default=1,
                   help="correctness checks per point, 0 = off (default 1)")
    g.add_argument("--repeat", type=_int_at_least(1), default=5, help="samples per point; the median is shown")
    g.add_argument("--collectives", type=_typed(_collectives), default=bandwidth.OPS,
                   help=f"comma-separated, or 'all' (default): {','.join(bandwidth.OPS)}")
    g = p.add_argument_group("ranks")
    g.add_argument("--world-size", type=_int_at_least(2), default=None,
                   help="ranks (default: number of GPUs, or 2 gloo ranks without GPUs); not under torchrun")
    g.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl with GPUs, else gloo")
    g.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run (standalone)")
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="write the result (rows, summary, fingerprint) as JSON")
    g.add_argument("--csv", metavar="PATH", help="write one CSV row per measurement (fingerprint in each)")
    g.add_argument("--plot", metavar="PATH", help="save busbw vs size as an image (PNG, SVG, PDF)")
    g.add_argument("--from-json", metavar="PATH", help="re-print (and re-export) a recorded JSON; runs nothing")
    g.add_argument("--note", action="store_true", help="also print the Markdown note: peak vs the link")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def under_torchrun(env=None) -> bool:
    """True when started by torchrun (or any env:// launcher) rather than by labutils."""
    env = os.environ if env is None else env
    return "RANK" in env and "WORLD_SIZE" in env and "LABUTILS_RANK" not in env


def _check_outputs(parser, args) -> None:
    for flag in ("json", "csv", "plot"):
        path = getattr(args, flag)
        if path and not Path(path).resolve().parent.is_dir():
            parser.error(f"cannot write --{flag} {path}: folder {Path(path).resolve().parent} does not "
                         "exist. HINT: create it first, or choose another path.")


def make_config(args, backend: str, world_size: int) -> bench_ops.BenchConfig:
    """The sweep's configuration from parsed arguments. Raises ValueError (with a HINT)."""
    if args.root >= world_size:
        raise ValueError(f"--root {args.root} is not a rank of {world_size}. HINT: 0 .. {world_size - 1}.")
    maxbytes = args.maxbytes or (128 * 2**20 if backend == "nccl" else 4 * 2**20)
    return bench_ops.BenchConfig(
        minbytes=args.minbytes, maxbytes=maxbytes, stepfactor=args.stepfactor, datatype=args.datatype,
        redop=args.op, root=args.root, iters=args.iters, warmup_iters=args.warmup_iters,
        repeat=args.repeat, check=args.check, collectives=tuple(args.collectives))


class _Printer:
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
            self._out(bench_report.header_lines({"meta": event["meta"], "fingerprint": self.fingerprint}))
        elif kind == "latency":
            self._out(["#", bench_report.latency_line(event["row"])])
            self.bar.update(1)
        elif kind == "rows":
            coll = event["rows"][0]["collective"]
            if coll != self.current:
                self._out(bench_report.block_lines(coll))
                self.current = coll
            self._out([bench_report.row_line(event["rows"])])
            self.bar.set_postfix_str(f"{coll} {bandwidth.format_size(event['rows'][0]['size_bytes'])}")
            self.bar.update(1)

    def finish(self, doc: dict) -> None:
        self.bar.close()
        self._out(["#"] + bench_report.summary_lines(doc["summary"]))


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


def _finish(doc: dict, args, printer: _Printer | None) -> int:
    if printer is not None:
        printer.finish(doc)
    else:
        print("\n".join(bench_report.table_lines(doc)))
    if args.note:
        print("\n" + bench_report.link_note(doc))
    if args.json:
        bench_report.write_json(args.json, doc)
    if args.csv:
        bench_report.write_csv(args.csv, doc)
    if args.plot:
        bench_report.busbw_figure(doc).savefig(args.plot, dpi=120, bbox_inches="tight")
    wrong = doc["summary"]["wrong_total"]
    if wrong:
        print(f"labutils bench: {wrong} wrong elements: a collective returned wrong data. HINT: see the "
              "#wrong column; rerun that collective alone with --collectives NAME.", file=sys.stderr)
    return 1 if wrong else 0


def _run_standalone(args, parser, command: str, t0: float) -> int:
    from . import hw
    from .launch import launch
    from .config import resolve
    from .errors import LaunchConfigError, RankError, RankTimeout
    try:
        lc = resolve(args.world_size, args.backend)
        cfg = make_config(args, lc.backend, lc.world_size)
    except (LaunchConfigError, ValueError) as exc:
        parser.error(str(exc))
    info = hw.describe(peer_access=False)
    printer = _Printer(info.fingerprint(), bench_ops.planned_points(cfg, lc.world_size) + 1,
                       not args.no_progress)
    print(f"# {lc.describe()}")
    fd, progress = tempfile.mkstemp(prefix="labutils-bench-", suffix=".jsonl")
    os.close(fd)
    stop = threading.Event()
    tail = threading.Thread(target=_tail, args=(progress, printer.handle, stop), daemon=True)
    tail.start()
    try:
        results = launch(bench_ops.sweep, cfg, world_size=lc.world_size, backend=lc.backend,
                         timeout=args.timeout, output="live", kwargs={"progress_path": progress})
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
    doc = bench_report.make_doc(results[0], fingerprint=info.fingerprint(), command=command,
                                link_peak_gbps=info.link_peak_gbps if lc.backend == "nccl" else None,
                                wall_s=round(time.perf_counter() - t0, 1))
    return _finish(doc, args, printer)


def _run_torchrun(args, parser, command: str, t0: float) -> int:
    import torch
    import torch.distributed as dist
    from . import hw
    local = int(os.environ.get("LOCAL_RANK", "0"))
    n_local = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = args.backend or ("nccl" if local < n_local else "gloo")
    world_size = int(os.environ["WORLD_SIZE"])
    if args.world_size is not None:
        parser.error(f"--world-size is set by torchrun here (WORLD_SIZE={world_size}). HINT: drop it.")
    if backend == "nccl" and local >= n_local:
        parser.error(f"--backend nccl: LOCAL_RANK {local} has no GPU (this node has {n_local}). "
                     "HINT: --nproc-per-node <= GPUs per node, or --backend gloo.")
    if world_size < 2:
        parser.error("a communication benchmark needs >= 2 ranks. HINT: torchrun --nproc-per-node 2 ...")
    try:
        cfg = make_config(args, backend, world_size)
    except ValueError as exc:
        parser.error(str(exc))
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
            printer = _Printer(fp.fingerprint(), bench_ops.planned_points(cfg, world_size) + 1,
                               not args.no_progress)
        result = bench_ops.sweep(rank, world_size, cfg, emit=printer.handle if printer else None)
        if rank != 0:
            return 1 if sum(r["wrong"] or 0 for r in result["rows"]) else 0
        one_node = backend == "nccl" and result["meta"]["nodes"] == 1  # else the network is the link
        doc = bench_report.make_doc(result, fingerprint=fp.fingerprint(), command=command,
                                    link_peak_gbps=fp.link_peak_gbps if one_node else None,
                                    wall_s=round(time.perf_counter() - t0, 1))
        return _finish(doc, args, printer)
    finally:
        dist.destroy_process_group()


def run(args) -> int:
    t0 = time.perf_counter()
    parser = args._bench_parser
    _check_outputs(parser, args)
    command = "python -m labutils " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else \
        "python -m labutils bench"
    if args.from_json:
        try:
            doc = bench_report.load_json(args.from_json)
        except (OSError, ValueError) as exc:
            parser.error(f"--from-json: {exc}")
        return _finish(doc, args, None)
    if under_torchrun():
        return _run_torchrun(args, parser, command + f"  # under torchrun, WORLD_SIZE={os.environ['WORLD_SIZE']}", t0)
    return _run_standalone(args, parser, command, t0)
