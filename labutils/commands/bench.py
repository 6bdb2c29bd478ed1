"""``python -m labutils bench``: the options of the benchmark and their checks (``DESCRIPTION`` is its
``--help``). The engine is ``labutils.bench``; ``labutils.bench.run`` takes the ``BenchConfig`` and
``Outputs`` built here and raises, and a bad option is a one-line usage error (exit status 2).
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
import time
from pathlib import Path

from .. import bandwidth
from . import seconds
from ..bench import files, graph, run as driver
from ..bench.config import AUTO_ITERS, DTYPES, REDOPS, BenchConfig, Outputs, canonical_dtype
from ..config import resolve, under_torchrun
from ..errors import LaunchConfigError

DESCRIPTION = """\
Benchmark torch.distributed collectives the way nccl-tests does: for each collective and message size,
the time per call, algbw, busbw and a check that every result is right; then a summary. Optionally
CSV/JSON files and a plot of busbw against size.

examples:
  python -m labutils bench                                  # 8 collectives, 8 B .. 128 MiB, every GPU
  python -m labutils bench -b 1K -e 1G -f 2 --json r.json --csv r.csv --plot r.png
  python -m labutils bench -b 8 -e 1M -G 20                 # CUDA graphs: device time without host launch
  python -m labutils bench --backend gloo -e 4M             # CPU only: gloo ranks (labelled)
  torchrun --nproc-per-node 8 -m labutils bench -b 8 -e 1G  # under torchrun, one or more nodes
  python -m labutils bench --from-json r.json --note        # print a recorded run again

Eager mode (the default) times calls back to back, each launched by the host, as a training loop
launches them, and beside them a bare loop of the same torch call (the summary gives the ratio).
-G N captures each point's calls in one CUDA graph and replays it N times: what remains is the
device's time per call (NCCL only).

On its own it starts one rank per GPU (2 gloo ranks on CPU tensors without GPUs) and shows progress
on a terminal; under torchrun each process is one rank and rank 0 prints.

Exit status: 0; 1 if a result was wrong or a rank failed; 2 for bad arguments."""

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
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}. "
                                             f"HINT: a whole number, {low} or more.")
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
    if text.lower() not in REDOPS:
        raise ValueError(f"unknown reduction {text!r}. HINT: one of {', '.join(REDOPS)}.")
    return text.lower()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.description = DESCRIPTION
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.set_defaults(_bench_parser=p)
    g = p.add_argument_group("sweep (nccl-tests' options)")
    g.add_argument("-b", "--minbytes", type=parse_size, default=8, help="smallest size (default 8)")
    g.add_argument("-e", "--maxbytes", type=parse_size, default=None,
                   help="largest size (default 128M with nccl, 4M with gloo)")
    g.add_argument("-f", "--stepfactor", type=_int_at_least(2), default=2, help="size factor (default 2)")
    g.add_argument("-n", "--iters", type=_int_at_least(1), default=None,
                   help=f"calls per sample (default: {AUTO_ITERS})")
    g.add_argument("-w", "--warmup_iters", type=_int_at_least(0), default=5, help="warm-up calls (default 5)")
    g.add_argument("-d", "--datatype", type=_typed(canonical_dtype), default="float",
                   help=f"one of {', '.join(DTYPES)} (default float)")
    g.add_argument("-o", "--op", type=_typed(_redop), default="sum", help="reduction: sum, prod, max, min, avg")
    g.add_argument("-r", "--root", type=_int_at_least(0), default=0, help="root of broadcast/reduce (default 0)")
    g.add_argument("-c", "--check", type=_int_at_least(0), default=1,
                   help="correctness checks per point, 0 = off (default 1)")
    g.add_argument("-G", "--cuda-graph", type=_int_at_least(0), default=0, metavar="N",
                   help="capture each point's iters calls in one CUDA graph and replay it N times per sample "
                        "(nccl-tests' -G; NCCL only; default 0 = eager calls)")
    g.add_argument("--repeat", type=_int_at_least(1), default=5, help="samples per point; the median is shown")
    g.add_argument("--no-bare", action="store_true",
                   help="do not time a bare loop of the same torch call beside the benchmark's (eager mode)")
    g.add_argument("--collectives", type=_typed(_collectives), default=bandwidth.OPS,
                   help=f"comma-separated, or 'all' (default): {','.join(bandwidth.OPS)} "
                        "(send_recv: both directions at once, nccl-tests' ring; send_one_way: one direction)")
    g = p.add_argument_group("ranks")
    g.add_argument("--world-size", type=_int_at_least(2), default=None,
                   help="ranks (default: number of GPUs, or 2 gloo ranks without GPUs); not under torchrun")
    g.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl with GPUs, else gloo")
    g.add_argument("--timeout", type=seconds, default=900.0, help="seconds for the whole run (standalone)")
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="write the result (rows, summary, fingerprint) as JSON")
    g.add_argument("--csv", metavar="PATH", help="write one CSV row per measurement (fingerprint in each)")
    g.add_argument("--plot", metavar="PATH", help="save busbw vs size as an image (PNG, SVG, PDF)")
    g.add_argument("--from-json", metavar="PATH", help="re-print (and re-export) a recorded JSON; runs nothing")
    g.add_argument("--note", action="store_true", help="also print the Markdown note: peak vs the link")
    g.add_argument("--no-progress", action="store_true",
                   help="no progress bar (there is none anyway when the output is not a terminal)")


def sweep_config(args, backend: str, world_size: int) -> BenchConfig:
    """The sweep's configuration from parsed arguments. Raises ValueError (with a HINT)."""
    if args.root >= world_size:
        raise ValueError(f"--root {args.root} is not a rank of {world_size}. HINT: 0 .. {world_size - 1}.")
    if args.cuda_graph:
        graph.require_graphs(backend)
    maxbytes = args.maxbytes or (128 * 2**20 if backend == "nccl" else 4 * 2**20)
    return BenchConfig(
        minbytes=args.minbytes, maxbytes=maxbytes, stepfactor=args.stepfactor, datatype=args.datatype,
        redop=args.op, root=args.root, iters=args.iters, warmup_iters=args.warmup_iters,
        repeat=args.repeat, check=args.check, collectives=tuple(args.collectives),
        cuda_graph=args.cuda_graph, bare=not args.no_bare)


def outputs(args) -> Outputs:
    """What to print and write besides the table. Raises ValueError for a folder that does not exist."""
    for flag in ("json", "csv", "plot"):
        path = getattr(args, flag)
        if path and not Path(path).resolve().parent.is_dir():
            raise ValueError(f"cannot write --{flag} {path}: folder {Path(path).resolve().parent} does not "
                             "exist. HINT: create it first, or choose another path.")
    return Outputs(json=args.json, csv=args.csv, plot=args.plot, note=args.note, progress=not args.no_progress)


def torchrun_backend(args) -> tuple[str, int]:
    """This torchrun process's backend and the job's world size. Raises ValueError (with a HINT)."""
    import torch
    local = int(os.environ.get("LOCAL_RANK", "0"))
    n_local = torch.cuda.device_count() if torch.cuda.is_available() else 0
    backend = args.backend or ("nccl" if local < n_local else "gloo")
    world_size = int(os.environ["WORLD_SIZE"])
    if args.world_size is not None:
        raise ValueError(f"--world-size is set by torchrun here (WORLD_SIZE={world_size}). HINT: drop it.")
    if backend == "nccl" and local >= n_local:
        raise ValueError(f"--backend nccl: LOCAL_RANK {local} has no GPU (this node has {n_local}). "
                         "HINT: --nproc-per-node <= GPUs per node, or --backend gloo.")
    if world_size < 2:
        raise ValueError("a communication benchmark needs >= 2 ranks. HINT: torchrun --nproc-per-node 2 ...")
    return backend, world_size


def run(args) -> int:
    t0 = time.perf_counter()
    parser = args._bench_parser
    command = "python -m labutils " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else \
        "python -m labutils bench"
    doc = launch_config = backend = None
    try:
        out = outputs(args)
        if args.from_json:
            try:
                doc = files.load_json(args.from_json)
            except OSError as exc:
                raise ValueError(f"--from-json {args.from_json}: {exc.strerror}. HINT: the path of a JSON "
                                 "file that --json wrote.") from None
            except ValueError as exc:
                raise ValueError(f"--from-json: {exc}") from None
        elif under_torchrun():
            backend, world_size = torchrun_backend(args)
            cfg = sweep_config(args, backend, world_size)
            command += f"  # under torchrun, WORLD_SIZE={world_size}"
        else:
            launch_config = resolve(args.world_size, args.backend, cli=True)
            cfg = sweep_config(args, launch_config.backend, launch_config.world_size)
    except (ValueError, LaunchConfigError) as exc:
        parser.error(str(exc))  # one line, and exit status 2
    if doc is not None:
        return driver.finish(doc, out, None)
    if backend is not None:
        return driver.run_torchrun(cfg, backend, out, command, t0)
    return driver.run_standalone(cfg, launch_config, out, args.timeout, command, t0)
