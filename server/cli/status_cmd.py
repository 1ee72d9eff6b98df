"""`psrv status HOST:PORT`: the controller's view of the mesh, its nodes and counters."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from psrv.server.cli.options import default_keys_dir
from psrv.transport import TransportConfig, TransportError
from psrv.transport.client import request_status


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "status",
        help="show a controller's nodes, mesh and counters",
        description="Ask a controller for its view: every node (id, address, state, parent, "
        "children), the mesh version, its counters and the master-copy checksum.",
    )
    p.add_argument("address", metavar="HOST:PORT", help="address of the controller")
    p.add_argument("--json", action="store_true", help="print the whole status as one JSON document")
    p.add_argument(
        "--keys",
        metavar="DIR",
        default=None,
        help="CurveZMQ key directory; none = the default key directory when it exists "
        "(see `psrv controller --help`)",
    )
    p.add_argument(
        "--insecure", action="store_true", help="ask without CurveZMQ (a controller run --insecure)"
    )
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the reply")
    p.set_defaults(func=run)


def format_status(status: dict[str, Any]) -> str:
    lines = [
        f"controller {status['address']}  mesh {status['mesh_mode']} (fan-out {status['fan_out']})  "
        f"version {status['mesh_version']}  depth {status['depth']}  params {status['params_size']}",
        "checksum: " + "  ".join(f"{k}={v}" for k, v in status["checksum"].items()),
    ]
    c = status["counters"]
    lines.append(
        "counters: "
        + "  ".join(
            f"{k}={c[k]}"
            for k in (
                "updates_received",
                "updates_applied",
                "updates_relayed",
                "duplicates_dropped",
                "rejected_total",
                "joins",
                "leaves",
                "offline",
            )
        )
    )
    lines.append(f"{'id':>5} {'address':<22} {'state':<8} {'parent':>6}  children  sent/applied")
    for n in status["nodes"]:
        s = n.get("stats") or {}
        lines.append(
            f"{n['id']:>5} {n['address']:<22} {n['state']:<8} {n['parent']:>6}  "
            f"{','.join(map(str, n['children'])) or '-':<8}  {s.get('updates_sent', '?')}/"
            f"{s.get('updates_applied', '?')}"
        )
    if status["departed"]:
        lines.append(
            "departed: " + ", ".join(f"{d['id']} ({d['state']}: {d['reason']})" for d in status["departed"])
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        keys = args.keys
        if keys is None and not args.insecure and default_keys_dir().is_dir():
            keys = str(default_keys_dir())
        status = request_status(args.address, TransportConfig(keys_dir=keys), timeout_s=args.timeout)
    except TransportError as exc:
        print(f"psrv status: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(status, sort_keys=True) if args.json else format_status(status))
    return 0


__all__ = ["add_parser", "format_status", "run"]
