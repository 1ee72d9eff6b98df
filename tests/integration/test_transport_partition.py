"""Partitions heal: a node cut off from the controller by a proxy that stops
forwarding keeps trying to rejoin for --controller-lost-timeout, rejoins when the partition heals,
catches up and ends equal to the master copy; a partition longer than the timeout ends it with a
clear error (exit 3). Real `psrv` daemons; the partition is tests/faults/proxy.py blocking."""

from __future__ import annotations

import time

import pytest

from tests.faults.proxy import FaultProxy


def node_via(cluster, proxy: FaultProxy, lost_timeout_s: float, **kw):
    """A node that reaches the controller through the proxy (its beats, joins, updates, downloads)."""
    direct, cluster.address = cluster.address, proxy.address
    try:
        return cluster.start_node(extra=["--controller-lost-timeout", str(lost_timeout_s)], **kw)
    finally:
        cluster.address = direct


@pytest.mark.timeout(180)
def test_a_partition_shorter_than_the_timeout_heals(cluster) -> None:
    cluster.start_controller(params=1000)  # beats every 0.5 s, 4 missed beats: offline after 2 s
    with FaultProxy(cluster.address) as proxy:
        steady = cluster.start_node(updates=400, rate=40, seed=1)
        cut = node_via(cluster, proxy, 30, updates=400, rate=40, seed=2, name="cut")
        status = cluster.wait_for(
            lambda s: len(s["nodes"]) == 2 and s["counters"]["updates_applied"] > 40, 60, "2 nodes exchanging"
        )
        cut_id = next(n["id"] for n in status["nodes"] if n["name"] == "cut")
        proxy.block()  # the partition: nothing the cut node sends reaches the controller
        cluster.wait_for(lambda s: cut_id not in [n["id"] for n in s["nodes"]], 30, "the cut node offline")
        time.sleep(4.0)  # well past the node's own controller timeout (2.25 s): it is rejoining now
        assert cut.popen.poll() is None, cut.stderr()
        proxy.unblock()
        status = cluster.wait_for(
            lambda s: (
                any(n["name"] == "cut" and n["id"] != cut_id for n in s["nodes"]) and len(s["nodes"]) == 2
            ),
            60,
            "the cut node rejoined under a new id",
        )
        cluster.wait_for(
            lambda s: all(n["stats"].get("synthetic_sent") == 400 for n in s["nodes"]), 90, "both nodes done"
        )
        time.sleep(2.0)  # the last updates drain
        assert "lost the controller" in cut.stderr() and "rejoining" in cut.stderr()
        cluster.assert_equal_to_master([steady, cut])


@pytest.mark.timeout(120)
def test_a_partition_longer_than_the_timeout_fails_with_a_clear_error(cluster) -> None:
    cluster.start_controller(params=1000)
    with FaultProxy(cluster.address) as proxy:
        cut = node_via(cluster, proxy, 2, updates=10_000, rate=20, seed=3)
        cluster.wait_for(lambda s: len(s["nodes"]) == 1, 60, "the node joined")
        proxy.block()
        rc = cut.wait(timeout_s=30)
        assert rc == 3, cut.stderr()
        assert "could not rejoin within controller_lost_timeout_s = 2.0 s" in cut.stderr()
