"""Record lab 08's GPU measurements without running the notebook (>= 2 GPUs; ~30 s on 2xH200).

    python -m labutils.labs.lab08_data_parallel.record                 # all three, saved + verdicts
    python -m labutils.labs.lab08_data_parallel.record ddp --no-save    # one of ddp / zero / fsdp, printed

Saves ``notebooks/recorded/08_ddp.json``, ``08_zero.json``, ``08_fsdp.json`` (with this machine's
fingerprint) and the DDP traces under ``notebooks/traces/``; prints each recording's verdicts. It runs
the reference implementations (``reference``, ``labutils.solutions.lab08``), which are the notebook's
code. Executing the notebook with ``LABUTILS_RECORD=1`` records the same three files.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from labutils import claims, recorded

from . import measure
from .claims import CLAIMS

MEASUREMENTS = {"ddp": ("08_ddp", lambda pool, traces: measure.ddp(pool, trace_dir=traces)),
                "zero": ("08_zero", lambda pool, traces: measure.zero(pool)),
                "fsdp": ("08_fsdp", lambda pool, traces: measure.fsdp(pool))}


def main(argv=None) -> int:
    import labutils
    from labutils.config import gpu_count
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("which", nargs="*", help=f"any of {', '.join(MEASUREMENTS)} (default: all)")
    parser.add_argument("--no-save", action="store_true", help="print the verdicts, keep the recordings as they are")
    args = parser.parse_args(argv)
    unknown = [w for w in args.which if w not in MEASUREMENTS]
    if unknown:
        parser.error(f"unknown measurement(s) {unknown}; choose from {', '.join(MEASUREMENTS)}")
    if gpu_count() < 2:
        print(f"lab 08's measurements need >= 2 CUDA GPUs; this machine has {gpu_count()}. "
              "HINT: run this on the GPU machine; elsewhere the notebook shows the recordings.", file=sys.stderr)
        return 2
    traces = Path(labutils.__file__).resolve().parent.parent / "notebooks" / "traces"
    with labutils.RankPool(backend="nccl") as pool:
        for key in args.which or list(MEASUREMENTS):
            name, fn = MEASUREMENTS[key]
            t0 = time.perf_counter()
            data = fn(pool, traces)
            print(f"{name}: measured in {time.perf_counter() - t0:.1f} s")
            claims.show(CLAIMS[name](data), recorded.live_source())
            if not args.no_save:
                print(f"  saved {recorded.save(name, data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
