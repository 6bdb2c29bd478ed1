"""The verbs of ``python -m labutils``, one module each, with ``add_arguments(parser)`` and
``run(args) -> exit status``: ``hw``, ``run_labs`` (``run-labs``), ``bench``, ``workspace``."""
from __future__ import annotations

import argparse


def seconds(text: str) -> float:
    """argparse type: a positive number of seconds (``--timeout``)."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}. HINT: e.g. 600.")
    return value
