"""``python -m labutils classroom <step>``: what an instructor runs for a class.

    python -m labutils classroom release [LABS ...] DIR   # student notebooks without answers, and their install
    python -m labutils classroom grade SUBMISSIONS_DIR    # autograde submitted notebooks into a gradebook
    python -m labutils classroom check                    # check every learner's GPU slice on this node

Each step is a module of ``labutils.classroom`` with ``add_arguments(parser)`` and ``run(args) -> int``.
"""
from __future__ import annotations

import importlib

# step -> (module, help)
STEPS = {
    "release": ("labutils.classroom.release", "write the student edition (no answers) of some or all labs"),
    "grade": ("labutils.classroom.grade", "autograde a folder of submitted notebooks into a gradebook"),
    "check": ("labutils.classroom.check", "check each learner's GPU slice: GPUs, links, an all_reduce, memory"),
}


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="step", metavar="step", required=True)
    for name, (module, help_) in STEPS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_step_module=module)
        try:
            importlib.import_module(module).add_arguments(p)
        except ImportError as exc:  # a step whose module is missing still shows up in --help
            p.set_defaults(_step_import_error=exc)


def run(args) -> int:
    error = getattr(args, "_step_import_error", None)
    if error is not None:
        raise SystemExit(f"python -m labutils classroom {args.step}: cannot import {args._step_module}: {error}")
    return importlib.import_module(args._step_module).run(args)
