"""Command line: ``python -m labutils <command>``.

    python -m labutils hw                      # describe this machine
    python -m labutils run-labs [--inplace]    # execute every lab headless, print a summary table
    python -m labutils bench [...]             # nccl-tests-style collective benchmark
    python -m labutils workspace [DIR]         # your own copy of the labs to edit (default ./my-labs)
    python -m labutils classroom <step>        # release, grade, check: for instructors
"""
from __future__ import annotations

import argparse
import importlib
import sys

# command -> (module, help); each module has add_arguments(parser) and run(args) -> int
COMMANDS = {
    "hw": ("labutils.commands.hw", "describe this machine (GPUs, links, versions, fingerprint)"),
    "run-labs": ("labutils.commands.run_labs", "execute the lab notebooks headless and print a summary"),
    "bench": ("labutils.commands.bench", "benchmark collectives like nccl-tests (table, CSV/JSON, plot)"),
    "workspace": ("labutils.commands.workspace", "copy the labs into your own working folder (default ./my-labs)"),
    "classroom": ("labutils.commands.classroom", "for instructors: release student editions, grade, check GPU slices"),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m labutils", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="command")
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_)
        p.set_defaults(_module=module)
        try:
            importlib.import_module(module).add_arguments(p)
        except ImportError as exc:  # a command whose module is missing still shows up in --help
            p.set_defaults(_import_error=exc)
    args = ap.parse_args(argv)
    if args.command is None:
        ap.print_help()
        return 2
    if getattr(args, "_import_error", None):
        print(f"python -m labutils {args.command}: cannot import {args._module}: {args._import_error}",
              file=sys.stderr)
        return 2
    return importlib.import_module(args._module).run(args)


if __name__ == "__main__":
    sys.exit(main())
