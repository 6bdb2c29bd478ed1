"""``python -m labutils bench``: benchmark torch.distributed collectives the nccl-tests way.

    python -m labutils bench                                  # 8 collectives, 8 B .. 128 MiB, every GPU
    python -m labutils bench -b 1K -e 1G -f 2 --json r.json --csv r.csv --plot r.png
    python -m labutils bench -b 8 -e 1M -G 20                 # CUDA graphs: device time without host launch
    python -m labutils bench --backend gloo -e 4M             # CPU only: gloo ranks (labelled)
    torchrun --nproc-per-node 8 -m labutils bench -b 8 -e 1G  # under torchrun (env://), one or more nodes
    python -m labutils bench --from-json r.json --note        # re-print a recorded run (+ README note)

Eager mode (default) times back-to-back torch calls, each paying the host's launch, and times a bare
loop of the same torch call beside the benchmark's at each collective's smallest size (the summary
gives the ratio). ``-G N`` (nccl-tests' ``--cudagraph``) captures each point's calls in one CUDA graph
and replays it N times: what remains is the device's time per call (NCCL only).

Standalone, it starts its ranks with ``labutils.launch`` (one per GPU, or 2 gloo ranks without
GPUs) and shows progress while they run; under torchrun every process joins the env:// rendezvous
itself and rank 0 prints. This module holds the options; the engine is ``labutils.bench``
(``run``: the driver, ``sweep``: the rank side, ``graph``: CUDA graphs, ``report``: the table,
``files``: JSON/CSV). Exit status: 0,
1 if any result was wrong or a rank failed, 2 for bad arguments.
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
from ..bench import files, run as driver
from ..bench.config import DTYPES, REDOPS, canonical_dtype
from ..config import under_torchrun

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
    if text.lower() not in REDOPS:
        raise ValueError(f"unknown reduction {text!r}. HINT: one of {', '.join(REDOPS)}.")
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
    g.add_argument("--timeout", type=float, default=900.0, help="seconds for the whole run (standalone)")
    g = p.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="write the result (rows, summary, fingerprint) as JSON")
    g.add_argument("--csv", metavar="PATH", help="write one CSV row per measurement (fingerprint in each)")
    g.add_argument("--plot", metavar="PATH", help="save busbw vs size as an image (PNG, SVG, PDF)")
    g.add_argument("--from-json", metavar="PATH", help="re-print (and re-export) a recorded JSON; runs nothing")
    g.add_argument("--note", action="store_true", help="also print the Markdown note: peak vs the link")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")


def _check_outputs(parser, args) -> None:
    for flag in ("json", "csv", "plot"):
        path = getattr(args, flag)
        if path and not Path(path).resolve().parent.is_dir():
            parser.error(f"cannot write --{flag} {path}: folder {Path(path).resolve().parent} does not "
                         "exist. HINT: create it first, or choose another path.")


def run(args) -> int:
    t0 = time.perf_counter()
    parser = args._bench_parser
    _check_outputs(parser, args)
    command = "python -m labutils " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else \
        "python -m labutils bench"
    if args.from_json:
        try:
            doc = files.load_json(args.from_json)
        except (OSError, ValueError) as exc:
            parser.error(f"--from-json: {exc}")
        return driver.finish(doc, args, None)
    if under_torchrun():
        where = f"  # under torchrun, WORLD_SIZE={os.environ.get('WORLD_SIZE', '?')}"
        return driver.run_torchrun(args, parser, command + where, t0)
    return driver.run_standalone(args, parser, command, t0)
