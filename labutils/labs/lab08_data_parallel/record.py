"""Record lab 08's GPU measurements without running the notebook (>= 2 GPUs; ~30 s on 2xH200).

    python -m labutils.labs.lab08_data_parallel.record                 # all four, saved + verdicts
    python -m labutils.labs.lab08_data_parallel.record ddp --no-save    # one of build / ddp / zero / fsdp

Saves ``notebooks/recorded/08_build_ddp.json``, ``08_ddp.json``, ``08_zero.json``, ``08_fsdp.json`` (with
this machine's fingerprint) and the DDP traces under ``notebooks/traces/``; prints each recording's
verdicts. It runs the notebook's own code, taken from ``notebooks/src/08_data_parallel.py`` (the lesson's
functions and the exercises as written there: it refuses to record while an exercise is still a stub).
Executing the notebook with ``LABUTILS_RECORD=1`` records the same files.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from labutils import claims, recorded
from labutils.notebook_source import load_definitions

from . import build_measure, measure
from .claims import CLAIMS

NOTEBOOK = "08_data_parallel"
# the notebook's names of the ZeRO code measure.zero runs: its lesson functions and its two exercises
ZERO_NAMES = {"shard_of": "shard_of", "zero1_step": "my_zero1_step", "zero2_attach": "my_zero2_attach",
              "zero2_step": "zero2_step", "average_gradients": "my_average_gradients"}


BUILD_NAMES = {"naive": "my_average_gradients", "overlapped": "MyOverlappedGradients",
               "bucketed": "MyBucketedGradients"}


def _refuse_stubs(nb, names) -> None:
    """Raise ValueError if one of the notebook's exercises ``names`` is still its stub."""
    def is_stub(obj):
        codes = [obj.__code__] if hasattr(obj, "__code__") else [
            f.__code__ for f in vars(obj).values() if hasattr(f, "__code__")]
        return any("NotImplementedError" in c.co_names for c in codes)
    stubs = [name for name in names if is_stub(getattr(nb, name))]
    if stubs:
        raise ValueError(f"the notebook's exercise {', '.join(stubs)} still raises NotImplementedError, and lab "
                         "08 records the code the notebook runs. HINT: record from the course's edition of notebooks/src/"
                         f"{NOTEBOOK}.py, whose exercise cells hold the answers, or write them first.")


def zero_impl(nb) -> dict:
    """``measure.zero``'s ``impl`` from the notebook's definitions ``nb``.

    Raises:
        ValueError: an exercise is still the notebook's stub (it raises NotImplementedError).
    """
    _refuse_stubs(nb, ("my_average_gradients", "my_zero1_step", "my_zero2_attach"))
    return {key: getattr(nb, name) for key, name in ZERO_NAMES.items()}


def build_impl(nb) -> dict:
    """``build_measure.build_ddp``'s three designs from the notebook's definitions ``nb``.

    Raises:
        ValueError: an exercise is still the notebook's stub.
    """
    _refuse_stubs(nb, tuple(BUILD_NAMES.values()))
    return {key: getattr(nb, name) for key, name in BUILD_NAMES.items()}


MEASUREMENTS = {"build": ("08_build_ddp", lambda pool, traces, nb: build_measure.build_ddp(pool, **build_impl(nb))),
                "ddp": ("08_ddp", lambda pool, traces, nb: measure.ddp(pool, trace_dir=traces)),
                "zero": ("08_zero", lambda pool, traces, nb: measure.zero(pool, impl=zero_impl(nb))),
                "fsdp": ("08_fsdp", lambda pool, traces, nb: measure.fsdp(pool, shard_transformer=nb.shard_transformer))}


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
    nb = load_definitions(NOTEBOOK)
    with labutils.RankPool(backend="nccl") as pool:
        for key in args.which or list(MEASUREMENTS):
            name, fn = MEASUREMENTS[key]
            t0 = time.perf_counter()
            data = fn(pool, traces, nb)
            print(f"{name}: measured in {time.perf_counter() - t0:.1f} s")
            claims.show(CLAIMS[name](data), recorded.live_source())
            if not args.no_save:
                print(f"  saved {recorded.save(name, data)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
