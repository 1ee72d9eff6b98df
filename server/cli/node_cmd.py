"""`psrv node`: join a controller, catch up, send K synthetic updates at R/s, apply what arrives.

Runs until SIGINT/SIGTERM, then prints its counters and parameter checksum as one JSON line,
writes its parameters to --dump and exits 0. Losing the controller exits 3 with the error.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from psrv.server.cli.options import (
    StopFlag,
    add_network_options,
    config_from_args,
    resolve_keys,
    stop_event_on_signals,
    warn_if_insecure,
)
from psrv.server.cli.synthetic import SyntheticUpdates
from psrv.server.node import Node
from psrv.transport import JoinError, SendQueueFullError, TransportConfig, TransportError
from psrv.transport.client import request_status

EXIT_LOST = 3


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "node",
        help="run a node sending synthetic updates",
        description="Join the controller (retrying until --join-timeout), catch up, send "
        "--updates synthetic updates at --rate per second and keep applying what "
        "arrives until SIGINT/SIGTERM; then print the counters as one JSON line "
        "and write the parameters to --dump. Exit 3 if the controller is lost and no rejoin "
        "succeeds within --controller-lost-timeout.",
    )
    p.add_argument("--controller", required=True, metavar="HOST:PORT", help="address of the controller")
    add_network_options(p)
    p.add_argument("--port", type=int, default=0, help="port of this node (0 = an ephemeral port)")
    p.add_argument(
        "--updates", type=int, default=100, metavar="K", help="number of synthetic updates to send"
    )
    p.add_argument("--rate", type=float, default=100.0, metavar="R", help="updates per second (0 = no pause)")
    p.add_argument(
        "--sparsity",
        type=float,
        default=0.05,
        metavar="S",
        help="fraction of the parameters each synthetic update touches",
    )
    p.add_argument("--threshold", type=float, default=1e-3, help="threshold tau of the encoder")
    p.add_argument("--seed", type=int, default=None, metavar="X", help="random seed (none = fresh entropy)")
    p.add_argument(
        "--name", default=None, help="stable name of this worker; rejoining under it sets the restart flag"
    )
    p.add_argument(
        "--wait-nodes",
        type=int,
        default=0,
        metavar="N",
        help="start sending only once the controller counts N live nodes that have caught up "
        "(0 = at once)",
    )
    p.add_argument("--join-timeout", type=float, default=30.0, help="seconds to keep retrying the join")
    p.add_argument(
        "--controller-lost-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="after losing the controller (a partition, a paused driver), seconds to keep trying to "
        "rejoin before exiting 3",
    )
    p.add_argument("--dump", metavar="FILE.npy", default=None, help="write the parameters here on exit")
    p.set_defaults(func=run)


def wait_for_nodes(
    address: str, config: TransportConfig, count: int, timeout_s: float, stop: StopFlag
) -> None:
    deadline = time.monotonic() + timeout_s
    while count > 0 and not stop.is_set():
        live = [
            n
            for n in request_status(address, config, timeout_s)["nodes"]
            if n["state"] == "online" and n["stats"].get("state") == "running"  # caught up (its beats say)
        ]
        if len(live) >= count:
            return
        if time.monotonic() > deadline:
            raise JoinError(
                f"only {len(live)} of the {count} nodes awaited joined {address} within {timeout_s} s"
            )
        stop.wait(0.25)  # each poll is a status request the controller answers


def run(args: argparse.Namespace) -> int:
    stop = stop_event_on_signals()
    try:
        resolve_keys(args, "node", create=False)
        warn_if_insecure(args, "node")
        config = config_from_args(
            args,
            port=args.port,
            node_name=args.name,
            join_timeout_s=args.join_timeout,
            controller_lost_timeout_s=args.controller_lost_timeout,
        )
        status = request_status(args.controller, config, timeout_s=args.join_timeout)
        params = np.zeros(int(status["params_size"]), dtype=np.float32)
        synthetic = SyntheticUpdates(
            params.size, sparsity=args.sparsity, threshold=args.threshold, seed=args.seed
        )
        synthetic.warm_up()
        node = Node(config, params, args.controller).start()
    except (TransportError, ValueError) as exc:
        print(f"psrv node: {exc}", file=sys.stderr)
        return EXIT_LOST
    try:
        wait_for_nodes(args.controller, config, args.wait_nodes, args.join_timeout, stop)
    except TransportError as exc:
        node.stop()
        print(f"psrv node: {exc}", file=sys.stderr)
        return EXIT_LOST
    interval = 1.0 / args.rate if args.rate > 0 else 0.0
    sent, next_at = 0, time.monotonic()
    pending = None  # a message the full queue refused: submitted again (the sequence stays reproducible)
    try:
        while not stop.is_set() and node.error is None and node.running:
            now = time.monotonic()
            if sent < args.updates and now >= next_at:
                message = pending if pending is not None else synthetic.next_message()
                try:
                    node.submit(message, apply_locally=True)
                except SendQueueFullError:
                    pending = message
                    continue
                except TransportError:
                    break
                pending = None
                sent += 1
                if sent == 1:
                    node.counters_.gauges["synthetic_started_at"] = time.time()
                node.counters_.gauges["synthetic_sent"] = sent  # reported with the heartbeats
                next_at = max(next_at + interval, now - 1.0)
            else:
                stop.wait(min(0.05, max(0.0, next_at - now)) if sent < args.updates else 0.05)
    finally:
        node.stop()
    counters = node.counters()
    counters["synthetic_sent"] = sent
    print(json.dumps(counters, sort_keys=True), flush=True)
    if args.dump:
        np.save(args.dump, params)
    if node.error is not None:
        print(f"psrv node: {node.error}", file=sys.stderr)
        return EXIT_LOST
    return 0


__all__ = ["EXIT_LOST", "add_parser", "run", "wait_for_nodes"]
