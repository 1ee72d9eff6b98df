"""A node process whose wall clock is deliberately off by SKEW seconds.

Usage: ``python skewed_clock_node.py CONTROLLER_ADDRESS SKEW_S``. Joins, waits until its node has
estimated its clock offset from a few heartbeat round trips (deadline 30 s), prints one JSON line
``{"node_id", "offset_s", "error_s"}`` and then keeps beating until stdin closes, so the controller
hears the estimate too.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main(address: str, skew_s: float) -> None:
    from psrv.server.node import Node
    from psrv.transport.config import TransportConfig

    config = TransportConfig(heartbeat_s=0.1, missed_beats=20, join_timeout_s=20.0)
    with Node(config, np.zeros(32, np.float32), address, wall_clock=lambda: time.time() + skew_s) as node:
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            counters = node.counters()
            if "clock_offset_s" in counters and time.monotonic() > deadline - 29.0:  # ten round trips
                break
            time.sleep(0.05)
        print(json.dumps({"node_id": node.node_id, "offset_s": counters.get("clock_offset_s"),
                          "error_s": counters.get("clock_error_s")}), flush=True)
        sys.stdin.read()  # until the test closes it


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
