"""The `psrv` command: one subcommand per declared command, each owning its own options.
``python -m psrv.server.cli`` runs it too.

Commands are declared as entry points of the group ``psrv.commands`` (pyproject.toml), each naming an
``add_parser(subparsers)`` function that registers an argparse sub-parser whose ``func`` default takes
the parsed namespace and returns an exit code. The CLI lists the group rather than importing the
commands, so a package above psrv.server (``psrv demo`` lives in psrv.spark) adds its command
without psrv.server knowing about it.
"""

from __future__ import annotations

import argparse
import logging
from importlib.metadata import EntryPoint, entry_points

from psrv.server.version import __version__

LOG_LEVEL_HELP = "logging level (DEBUG, INFO, WARNING, ERROR)"

__all__ = ["COMMAND_GROUP", "HelpFormatter", "build_parser", "main"]

COMMAND_GROUP = "psrv.commands"
# psrv.server's own commands, in the order `psrv --help` lists them; other declared commands follow by name
_SERVER_COMMANDS = ("controller", "node", "status", "keys")


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


def _listing_order(command: EntryPoint) -> tuple[int, str]:
    if command.name in _SERVER_COMMANDS:
        return _SERVER_COMMANDS.index(command.name), ""
    return len(_SERVER_COMMANDS), command.name


def build_parser() -> argparse.ArgumentParser:
    """The `psrv` parser with every declared command (loading a command imports only its module)."""
    parser = argparse.ArgumentParser(
        prog="psrv",
        description="psrv: gradient-sharing training on Spark over a ZeroMQ mesh.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--log-level", default="INFO", help=LOG_LEVEL_HELP)
    parser.add_argument("--version", action="version", version=f"psrv {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands = entry_points(group=COMMAND_GROUP)
    if not commands:
        parser.error(f"no {COMMAND_GROUP!r} entry points: psrv is not installed (pip install -e .)")
    for command in sorted(commands, key=_listing_order):
        command.load()(subparsers)
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
