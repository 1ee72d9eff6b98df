"""`psrv keys DIR`: create the CurveZMQ key set of a controller and its nodes."""

from __future__ import annotations

import argparse
import sys

from psrv.transport.errors import TransportError
from psrv.transport.keys import generate_keys, write_keys


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "keys",
        help="create a CurveZMQ key set",
        description="Create a CurveZMQ key set (server and client pairs, owner-only files) "
        "in DIR; pass the same DIR as --keys to the controller and its nodes.",
    )
    p.add_argument("directory", metavar="DIR", help="directory to write the four key files into")
    p.add_argument("--force", action="store_true", help="overwrite an existing key set")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        write_keys(generate_keys(), args.directory, overwrite=args.force)
    except TransportError as exc:
        print(f"psrv keys: {exc}", file=sys.stderr)
        return 1
    print(f"wrote a CurveZMQ key set to {args.directory}")
    return 0


__all__ = ["add_parser", "run"]
