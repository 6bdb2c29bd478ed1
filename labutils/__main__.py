"""Command line: ``python -m labutils <command>`` (``DESCRIPTION`` is what ``--help`` shows).

Each command is a module of ``labutils.commands`` with ``add_arguments(parser)`` and ``run(args)``;
a usage error is one line that points to ``--help`` (``Parser.error``), not the whole usage.
"""
from __future__ import annotations

import argparse
import importlib
import sys

DESCRIPTION = """\
The GPU communication labs' tools.

  python -m labutils workspace [DIR]         your own copy of the labs to edit (default ./my-labs)
  python -m labutils hw                      describe this machine
  python -m labutils run-labs [LAB ...]      execute the labs headless and print a summary table
  python -m labutils bench [...]             benchmark collectives, nccl-tests-style (busbw, #wrong)
  python -m labutils classroom STEP          for instructors: release, grade, check

python -m labutils COMMAND --help says more about each."""

# command -> (module, help); each module has add_arguments(parser) and run(args) -> int
COMMANDS = {
    "hw": ("labutils.commands.hw", "describe this machine (GPUs, links, versions, fingerprint)"),
    "run-labs": ("labutils.commands.run_labs", "execute the lab notebooks headless and print a summary"),
    "bench": ("labutils.commands.bench", "benchmark collectives like nccl-tests (table, CSV/JSON, plot)"),
    "workspace": ("labutils.commands.workspace", "copy the labs into your own working folder (default ./my-labs)"),
    "classroom": ("labutils.commands.classroom", "for instructors: release student editions, grade, check GPU slices"),
}


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: ``PROG: error: MESSAGE (see PROG --help)``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> Parser:
    ap = Parser(prog="python -m labutils", description=DESCRIPTION,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", metavar="command")  # subparsers are Parsers too
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        p.set_defaults(_module=module)
        try:
            importlib.import_module(module).add_arguments(p)
        except ImportError as exc:  # a command whose module is missing still shows up in --help
            p.set_defaults(_import_error=exc)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
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
