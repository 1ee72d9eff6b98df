"""Command-line options shared by the `psrv` daemons, and the TransportConfig they build."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import signal
import time

from psrv.transport import TransportConfig


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
        help="CurveZMQ key directory written by `psrv keys`; none = no encryption or authentication",
    )


def warn_if_insecure(args: argparse.Namespace, command: str) -> None:
    """The daemons run without CurveZMQ unless given --keys: say so loudly, once, at start."""
    if not args.keys:
        logging.getLogger("psrv.server").warning(
            "psrv %s runs WITHOUT keys: any process that can reach its port can join the job and "
            "send updates (give --keys DIR, made by `psrv keys DIR`; see README, threat model)",
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
