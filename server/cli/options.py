"""Command-line options shared by the `psrv` daemons, and the TransportConfig they build."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import time
from pathlib import Path

from psrv.transport import TransportConfig
from psrv.transport.errors import TransportConfigError
from psrv.transport.keys import KEY_FILES, generate_keys, write_keys

KEYS_ENV = "PSRV_KEYS_DIR"
DEFAULT_KEYS_DIR = "~/.psrv/keys"


def add_network_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--network-mask",
        metavar="CIDR",
        default=None,
        help="bind and advertise the local address inside this CIDR (e.g. 10.0.0.0/16); "
        "the PSRV_IP environment variable overrides it; none = 127.0.0.1",
    )
    parser.add_argument(
        "--keys",
        metavar="DIR",
        default=None,
        help="CurveZMQ key directory written by `psrv keys`; none = the default key directory "
        f"(${KEYS_ENV}, else {DEFAULT_KEYS_DIR}), which `psrv controller` creates if missing",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="no CurveZMQ: anyone who can reach the ports can join the job (logged loudly at start)",
    )


def default_keys_dir() -> Path:
    return Path(os.environ.get(KEYS_ENV) or DEFAULT_KEYS_DIR).expanduser()


def resolve_keys(args: argparse.Namespace, command: str, *, create: bool) -> str | None:
    """Keys are on by default: --keys DIR, else the default key directory (the controller makes
    it with a fresh key set when missing); None only with --insecure. Sets ``args.keys``."""
    if getattr(args, "insecure", False):
        if args.keys:
            raise TransportConfigError("--keys and --insecure contradict each other; give one")
        return None
    if args.keys:
        return args.keys
    directory = default_keys_dir()
    if not (directory / KEY_FILES["server_public"]).exists() and create:
        write_keys(generate_keys(), directory)
        logging.getLogger("psrv.server").warning(
            "psrv %s: wrote a fresh CurveZMQ key set to %s; give it to the nodes (--keys, or the "
            "same default directory on their host)",
            command,
            directory,
        )
    if not directory.is_dir():
        raise TransportConfigError(
            f"psrv {command}: no --keys given and the default key directory {directory} does not exist; "
            f"pass --keys DIR (made by `psrv keys DIR` or by `psrv controller`), set ${KEYS_ENV}, "
            "or run without keys with --insecure"
        )
    args.keys = str(directory)
    return args.keys


def warn_if_insecure(args: argparse.Namespace, command: str) -> None:
    """The daemons run without CurveZMQ only with --insecure: say so loudly, once, at start."""
    if not args.keys:
        logging.getLogger("psrv.server").warning(
            "psrv %s runs WITHOUT keys (--insecure): any process that can reach its port can join "
            "the job and send updates (see README, Security and limits)",
            command,
        )


def config_from_args(args: argparse.Namespace, **overrides: object) -> TransportConfig:
    values: dict[str, object] = {"network_mask": args.network_mask, "keys_dir": args.keys}
    if getattr(args, "heartbeat_ms", None) is not None:
        values["heartbeat_s"] = args.heartbeat_ms / 1000.0
    if getattr(args, "missed_beats", None) is not None:
        values["missed_beats"] = args.missed_beats
    values.update(overrides)
    return TransportConfig(**values)


class StopFlag:
    """Set by SIGINT/SIGTERM. The handler only flips a bool: taking a lock there (as Event.set does)
    can deadlock against the main thread that was interrupted inside Event.wait."""

    def __init__(self) -> None:
        self.flag = False

    def set(self) -> None:
        self.flag = True

    def is_set(self) -> bool:
        return self.flag

    def wait(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.flag:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 0.02))
        return self.flag


def stop_event_on_signals() -> StopFlag:
    """A flag set by SIGINT or SIGTERM (the daemons run until one arrives)."""
    flag = StopFlag()

    def handler(signum: int, frame: object) -> None:
        flag.flag = True

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID` prints every thread's stack (hang diagnosis)
    return flag


__all__ = [
    "DEFAULT_KEYS_DIR", "KEYS_ENV", "StopFlag", "add_network_options", "config_from_args", "default_keys_dir",
    "resolve_keys",
    "stop_event_on_signals", "warn_if_insecure",
]
