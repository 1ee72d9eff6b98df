"""Identity inside a job, with real daemons and no keys: a stranger who joins
with its own connection, and one who only forges frames, cannot leave, stop, poison or silence a
member. Every attack is a counted rejection; the members' updates all reach every replica."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import Stranger, header, update

PARAMS = 1000


def rejected(status: dict, reason: str, node_id: int | None = None) -> int:
    if node_id is None:
        return status["counters"]["rejected"].get(reason, 0)
    return next(n["stats"] for n in status["nodes"] if n["id"] == node_id).get("rejected_total", 0)


@pytest.mark.timeout(180)
def test_forged_leave_shutdown_poison_and_stolen_origin_are_rejected(cluster) -> None:
    cluster.start_controller(params=PARAMS)
    procs = [cluster.start_node(updates=300, rate=30, seed=i, wait_nodes=2) for i in range(2)]
    status = cluster.wait_for(
        lambda s: len(s["nodes"]) == 2 and s["counters"]["updates_applied"] > 10, 60, "2 nodes exchanging"
    )
    victim, other = status["nodes"]
    stranger = Stranger()
    try:
        # 1. frames claiming to be a member, or the controller, from a connection that is not theirs
        for _ in range(15):
            stranger.send(cluster.address, [header("leave", victim["id"], reason="forged")])
        stranger.send(victim["address"], [header("shutdown", 0, reason="forged")])
        stranger.send(victim["address"], [header("evicted", 0, reason="forged")])
        stranger.send(cluster.address, update(victim["id"], victim["id"], 10**12, 1e-3, PARAMS))
        # 2. a stranger that joined (no keys: anyone can) poisons with tau 1e30 and steals the
        #    victim's origin with a huge sequence number, on its own connection
        me = stranger.join(cluster.address)
        stranger.send(cluster.address, update(me, me, 1, 1e30, PARAMS))
        stranger.send(cluster.address, update(me, victim["id"], 10**12, 1e-3, PARAMS))
        stranger.send(cluster.address, update(me, victim["id"], 5_000, 1e-3, PARAMS))
        stranger.send(cluster.address, update(me, 10**6, 1, 1e-3, PARAMS))  # an origin that never existed
        cluster.wait_for(
            lambda s: rejected(s, "bad_sender") >= 16 and rejected(s, "bad_origin") >= 3, 30, "the forgeries"
        )
    finally:
        stranger.close()
    status = cluster.wait_for(
        lambda s: (
            all(n["stats"].get("synthetic_sent") == 300 for n in s["nodes"] if n["id"] != me)
            and s["counters"]["updates_applied"] == 600
        ),
        90,
        "every member update in the master copy (none dropped as a duplicate, none from the stranger)",
    )
    members = {n["id"] for n in status["nodes"]} - {me}
    assert members == {victim["id"], other["id"]}, "no member was made to leave or rejoin"
    assert status["counters"]["rejected"].get("bad_payload", 0) >= 1, "tau 1e30 was refused"
    assert rejected(status, "", victim["id"]) >= 2, "the node counted the forged shutdown and eviction"
    assert all(p.popen.poll() is None for p in procs), "no node stopped"
    cluster.assert_equal_to_master(procs)
    assert float(np.max(np.abs(np.load(cluster.controller.dump)))) < 1.0, "no poisoned update in the master"
