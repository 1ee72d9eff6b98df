"""Clock offsets between real processes: a controller here and two node processes over real ZeroMQ
sockets, one of them with its wall clock deliberately 4 s behind. Each node's estimate must hold the
true offset within the error it reports, and the controller must hear the same estimate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from psrv.server.controller import Controller
from psrv.transport.config import TransportConfig

NODE = Path(__file__).with_name("skewed_clock_node.py")


@pytest.mark.timeout(120)
def test_each_process_offset_is_estimated_within_its_error(tmp_path: Path) -> None:
    config = TransportConfig(host="127.0.0.1", port=0, heartbeat_s=0.1, missed_beats=20)
    skews = (0.0, -4.0)  # the second process's clock reads 4 s less than the controller's
    with Controller(config, np.zeros(32, np.float32)) as controller:
        procs = [subprocess.Popen([sys.executable, str(NODE), controller.address, str(skew)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=open(tmp_path / f"node{i}.log", "w"), text=True,  # noqa: SIM115
                                  env=dict(os.environ, OMP_NUM_THREADS="1"))
                 for i, skew in enumerate(skews)]
        try:
            estimates = {}
            for i, (proc, skew) in enumerate(zip(procs, skews, strict=True)):
                line = proc.stdout.readline()  # the node's own deadline bounds this wait (30 s)
                assert line, f"node (skew {skew}) printed nothing:\n{(tmp_path / f'node{i}.log').read_text()}"
                estimates[skew] = json.loads(line)
            for skew, found in estimates.items():
                assert found["offset_s"] is not None, f"no round trip completed for skew {skew}"
                assert abs(found["offset_s"] - (-skew)) <= found["error_s"] + 1e-6, found
                assert found["error_s"] < 0.25  # loopback: milliseconds, even on a loaded machine
            deadline = time.monotonic() + 10.0
            heard: dict[int, dict] = {}
            while time.monotonic() < deadline and len(heard) < 2:
                heard = {s["id"]: s["stats"] for s in controller.node_stats()
                         if "clock_offset_s" in s["stats"]}
                time.sleep(0.1)
            for skew, found in estimates.items():
                stats = heard[found["node_id"]]
                assert abs(stats["clock_offset_s"] - (-skew)) <= stats["clock_error_s"] + 1e-6
        finally:
            for proc in procs:
                proc.stdin.close()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=5)
