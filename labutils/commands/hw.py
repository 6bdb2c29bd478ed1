"""``python -m labutils hw``: print what this machine is, as the labs see it."""
from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--fingerprint", action="store_true", help="print only the fingerprint line")


def run(args) -> int:
    from ..hw import describe
    info = describe()
    print(info.fingerprint() if args.fingerprint else info)
    return 0
