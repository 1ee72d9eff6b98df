"""A join burst in miniature: several nodes of a large model join one controller at once.

Their joint download of the master copy (4 x 24 MB through CurveZMQ on loopback) takes longer
than the heartbeat timeout (1 s) on this kind of machine, and while it runs they poll the
controller's status (``--wait-nodes``). Before the fix the controller's beats queued behind the
parameter chunks, and each status request summed the whole model on the I/O thread: members were
declared offline, or lost the controller, rejoined and downloaded again. The properties: no member
is lost, every update is applied exactly once everywhere, and every replica equals the master copy.
"""

from __future__ import annotations

import pytest
from psrv.transport.keys import generate_keys, write_keys

PARAMS = 6_000_000  # 24 MB of float32: four downloads at once outlast the 1 s heartbeat timeout here
NODES = 4
UPDATES = 25
HEARTBEAT_MS = 250
MISSED_BEATS = 4


@pytest.mark.slow
@pytest.mark.timeout(170)
@pytest.mark.parametrize("mesh", ["plain", "mesh"])
def test_a_join_burst_of_a_large_model_loses_no_member(cluster, mesh: str) -> None:
    keys = cluster.tmp / "keys"
    write_keys(generate_keys(), keys)  # CurveZMQ, the daemons' default: encryption is part of the load
    cluster.start_controller(  # MESH with fan-out 2: two levels, updates relayed through nodes
        params=PARAMS, mesh=mesh, fan_out=2, heartbeat_ms=HEARTBEAT_MS, missed_beats=MISSED_BEATS,
        keys=str(keys),
    )
    nodes = [
        cluster.start_node(
            updates=UPDATES,
            rate=50.0,
            seed=i,
            name=f"n{i}",
            wait_nodes=NODES,
            extra=["--sparsity", "0.001"],
        )
        for i in range(NODES)
    ]

    def done(status: dict) -> bool:
        # fail at once, naming the cause, where the wait could only run out: a download covers the
        # updates it holds, which then never count as applied at that node
        assert status["counters"]["offline"] == 0 and not status["departed"], \
            f"a member was declared offline: {status['departed']}"
        again = {n["id"]: n["stats"]["resyncs"] for n in status["nodes"] if n["stats"].get("resyncs", 0) > 1}
        assert not again, f"nodes downloaded the master copy again (their resyncs): {again}"
        online = [n for n in status["nodes"] if n["state"] == "online"]
        return (
            len(online) == NODES
            and status["counters"]["updates_applied"] == NODES * UPDATES
            and all(n["stats"].get("updates_applied") == (NODES - 1) * UPDATES for n in online)
        )

    status = cluster.wait_for(done, 150.0, f"{NODES} nodes to exchange {UPDATES} updates each")
    counters = status["counters"]
    assert counters["offline"] == 0 and not status["departed"], "a member was declared offline"
    assert counters["joins"] == NODES, "a node had to join again"
    ids = sorted(n["id"] for n in status["nodes"])
    assert counters["applied_by_origin"] == {i: UPDATES for i in ids}, "not every update applied once"

    cluster.assert_equal_to_master(nodes)  # each exits 0; every replica equals the master copy
    for proc in nodes:
        line = proc.json_line()
        assert line.get("controller_lost", 0) == 0 and line.get("rejoins", 0) == 0, proc.name
        assert line["node_ids"] == [line["node_id"]], f"{proc.name} held several ids: it rejoined"
        assert line["updates_applied"] == (NODES - 1) * UPDATES, proc.name
        assert line["synthetic_sent"] == UPDATES, proc.name
