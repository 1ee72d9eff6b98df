"""`psrv controller`: run a controller for a parameter vector of N zeros until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import json
import sys

import numpy as np
from psrv.server import Controller
from psrv.server.cli.options import (
    add_network_options,
    config_from_args,
    resolve_keys,
    stop_event_on_signals,
    warn_if_insecure,
)
from psrv.transport import TransportError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "controller",
        help="run a controller (root of the mesh, master copy of the params)",
        description="Run a controller for a parameter vector of N zeros until SIGINT or "
        "SIGTERM, logging joins, leaves and remaps; on exit write the master "
        "copy to --dump.",
    )
    p.add_argument("--port", type=int, required=True, help="TCP port to listen on (0 = any free port)")
    p.add_argument("--params", type=int, required=True, metavar="N", help="number of float32 parameters")
    p.add_argument(
        "--mesh",
        choices=("plain", "mesh"),
        default="plain",
        help="plain: every node is a child of the controller; mesh: a breadth-first tree",
    )
    p.add_argument("--fan-out", type=int, default=8, help="most children per place in mesh mode")
    p.add_argument(
        "--heartbeat-ms", type=int, default=1000, help="heartbeat interval, both ways (nodes adopt it)"
    )
    p.add_argument("--missed-beats", type=int, default=3, help="a node silent for this many beats is offline")
    add_network_options(p)
    p.add_argument("--dump", metavar="FILE.npy", default=None, help="write the master copy here on exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.params < 1:
        print(f"psrv controller: --params must be >= 1, got {args.params}", file=sys.stderr)
        return 2
    stop = stop_event_on_signals()
    try:
        resolve_keys(args, "controller", create=True)
        warn_if_insecure(args, "controller")
        config = config_from_args(args, port=args.port, mesh=args.mesh, fan_out=args.fan_out)
        controller = Controller(config, np.zeros(args.params, dtype=np.float32)).start()
    except (TransportError, ValueError) as exc:
        hint = ""
        if "in use" in str(exc):
            hint = (f" (another program listens on port {args.port}: choose another --port, or --port 0 "
                    "for any free port; the controller prints the address it listens on)")
        print(f"psrv controller: {exc}{hint}", file=sys.stderr)
        return 2
    print(f"psrv controller listening on {controller.address}", flush=True)
    try:
        while not stop.wait(0.2):
            if not controller.running:
                break
    finally:
        controller.stop()
    print(json.dumps(controller.counters(), sort_keys=True, default=str), flush=True)
    if args.dump:
        np.save(args.dump, controller.params)
    if controller.error is not None:
        print(f"psrv controller: {controller.error}", file=sys.stderr)
        return 1
    return 0


__all__ = ["add_parser", "run"]
