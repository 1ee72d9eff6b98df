"""The `psrv` command: one subcommand per module of this package (``psrv demo`` lives in psrv.spark),
each module owning its own options. ``python -m psrv.server.cli`` runs it too.

A subcommand module provides ``add_parser(subparsers)`` which registers an argparse
sub-parser whose ``func`` default takes the parsed namespace and returns an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import logging

from psrv.server.version import __version__

LOG_LEVEL_HELP = "logging level (DEBUG, INFO, WARNING, ERROR)"

# Subcommand modules, in the order `psrv --help` lists them.
COMMAND_MODULES: list[str] = [
    "psrv.server.cli.controller_cmd",
    "psrv.server.cli.node_cmd",
    "psrv.server.cli.status_cmd",
    "psrv.server.cli.keys_cmd",
    "psrv.spark.demo",
]


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends "(default: X)" only where it tells something: not when the help already states its
    default, not for None (the help says what "none" means), flags, required options or positionals."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            action.default is None
            or action.default is argparse.SUPPRESS
            or action.required
            or not action.option_strings
            or action.nargs == 0  # store_true / store_false / count-like flags
            or "default" in text.lower()
        ):
            return text
        return super()._get_help_string(action)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="psrv",
        description="psrv: gradient-sharing training on Spark over a ZeroMQ mesh.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help=LOG_LEVEL_HELP)
    parser.add_argument("--version", action="version", version=f"psrv {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(subparsers)
    for sub in subparsers.choices.values():  # one help style for every subcommand, whoever wrote it
        sub.formatter_class = HelpFormatter
        if "--log-level" not in sub._option_string_actions:
            # also accepted after the subcommand (`psrv demo --log-level DEBUG`); SUPPRESS keeps the
            # value given before it when this one is absent
            sub.add_argument("--log-level", default=argparse.SUPPRESS, help=LOG_LEVEL_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)
