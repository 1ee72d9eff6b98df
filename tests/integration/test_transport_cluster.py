"""A controller and 4 node processes exchange 1 000 updates each, PLAIN and MESH (fan-out 2)."""

from __future__ import annotations

import numpy as np
import pytest

NODES = 4
UPDATES = 1000
PARAMS = 2000


def drained(status: dict, nodes: int, updates: int) -> bool:
    entries = status["nodes"]
    return (
        len(entries) == nodes
        and status["counters"]["updates_applied"] == nodes * updates
        and all(
            n["stats"].get("updates_sent") == updates
            and n["stats"].get("updates_applied") == (nodes - 1) * updates
            for n in entries
        )
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mesh", ["plain", "mesh"])
def test_four_nodes_end_equal_to_the_controller(cluster, mesh: str) -> None:
    cluster.start_controller(params=PARAMS, mesh=mesh, fan_out=2)
    nodes = [cluster.start_node(updates=UPDATES, rate=1000, seed=i, wait_nodes=NODES) for i in range(NODES)]
    status = cluster.wait_for(lambda s: drained(s, NODES, UPDATES), 90, "every update applied everywhere")
    if mesh == "mesh":
        assert status["depth"] >= 2, "fan-out 2 with 4 nodes must build a tree of depth 2"
        assert any(n["parent"] != 0 for n in status["nodes"])
    for proc in nodes:
        assert cluster.stop(proc) == 0, proc.stderr()
    assert cluster.stop(cluster.controller) == 0
    master = np.load(cluster.controller.dump)
    assert np.abs(master).sum() > 0, "the updates must have moved the parameters"
    ids = [proc.json_line()["node_id"] for proc in nodes]
    for proc in nodes:
        counters = proc.json_line()
        replica = np.load(proc.dump)
        assert np.max(np.abs(replica - master)) <= 1e-6
        applied = {int(origin): n for origin, n in counters["applied_by_origin"].items()}
        others = {i: UPDATES for i in ids if i != counters["node_id"]}
        assert applied == others, "each node applies exactly the others' updates, once each"
        assert counters["updates_sent"] == UPDATES
        assert counters["rejected_total"] == 0
