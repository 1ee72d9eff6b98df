"""Bounded whatever peers send: JOIN admission control, per-origin state
pruned once a departed member is folded into the master copy, reassembly budgets per sender."""

from __future__ import annotations

import uuid

import msgpack
import numpy as np
import pytest
import zmq
from conftest import Stranger, header, update, wait_until
from psrv.encoding import encode
from psrv.server import Controller, Node
from psrv.transport import TransportConfig
from psrv.transport.sockets import tcp

N = 1000


def fast(**kw) -> TransportConfig:
    return TransportConfig(
        **{"heartbeat_s": 0.2, "missed_beats": 10, "join_timeout_s": 20, "linger_s": 0.2, **kw}
    )




@pytest.fixture
def roles():
    started: list = []
    yield started
    for role in reversed(started):
        role.stop()


def one_hot(i: int) -> np.ndarray:
    vector = np.zeros(N, np.float32)
    vector[i % N] = 1.0
    return encode(vector, 0.5)


@pytest.mark.timeout(180)
def test_a_join_flood_makes_no_more_members_than_the_limits(cluster) -> None:
    cluster.start_controller(params=N)
    procs = [cluster.start_node(updates=200, rate=30, seed=i, wait_nodes=2) for i in range(2)]
    cluster.wait_for(lambda s: len(s["nodes"]) == 2, 60, "2 nodes joined")
    stranger = Stranger()
    context = zmq.Context()
    many = []
    try:
        one = stranger.dealer(cluster.address)

        def join() -> list[bytes]:
            return [header("join", -1, address=stranger.address, name=None, token=uuid.uuid4().hex)]

        for _ in range(5000):  # one connection, 5 000 joins: at most one member for it
            one.send_multipart(
                [header("join", -1, address=stranger.address, name=None, token=uuid.uuid4().hex)]
            )
        for _ in range(150):  # 150 connections: admitted at most max_pending_joins (64) not heard from
            sock = context.socket(zmq.DEALER)
            sock.linger = 1000
            sock.connect(tcp(cluster.address))
            sock.send_multipart(
                [header("join", -1, address=stranger.address, name=None, token=uuid.uuid4().hex)]
            )
            many.append(sock)
        status = cluster.wait_for(
            lambda s: s["counters"]["rejected"].get("join_refused", 0) + s["counters"]["joins"] >= 5150 + 2,
            60,
            "every join answered or refused",
        )
        assert len(status["nodes"]) <= 2 + 64 + 1, f"{len(status['nodes'])} members after the flood"
        assert status["counters"]["joins"] <= 2 + 64 + 1 + 50 * 60, "joins admitted at most at the join rate"
    finally:
        for sock in many:
            sock.close(0)
        context.term()
        stranger.close()
    # the fake members never speak: they go offline; the real nodes lose nothing
    cluster.wait_for(
        lambda s: len(s["nodes"]) == 2 and s["counters"]["updates_applied"] == 400,
        90,
        "the real nodes' updates",
    )
    cluster.assert_equal_to_master(procs)


@pytest.mark.timeout(120)
def test_departed_origins_are_pruned_and_watermarks_stay_small(roles) -> None:
    cfg = fast(departed_kept_s=0.5)
    ctrl = Controller(cfg, np.zeros(N, np.float32)).start()
    roles.append(ctrl)
    stayer = Node(cfg, np.zeros(N, np.float32), ctrl.address).start()
    roles.append(stayer)
    departed = []
    for round_ in range(12):  # members come, send, and go: the history grows, the state must not
        node = Node(cfg, np.zeros(N, np.float32), ctrl.address).start()
        for i in range(3):
            node.submit(one_hot(round_ * 3 + i), apply_locally=True)
        assert node.wait_acknowledged(10.0)
        departed.append(node.node_id)
        node.stop()
    wait_until(lambda: np.allclose(stayer.params, ctrl.params), 10, "the stayer caught every update")
    wait_until(
        lambda: (
            ctrl.call(lambda: set(ctrl.seen.origins())) <= {stayer.node_id}
            and stayer.call(lambda: set(stayer.seen.origins())) <= {stayer.node_id}
        ),
        10,
        "departed origins forgotten by controller and node",
    )
    assert ctrl.counters()["updates_applied"] == 36
    # a late update of a departed origin is refused, not applied again
    before = ctrl.params.copy()
    stranger = Stranger()
    try:
        stranger.send(ctrl.address, update(-1, departed[0], 1, 0.5, N))
        me = stranger.join(ctrl.address)
        stranger.send(ctrl.address, update(me, departed[0], 1, 0.5, N))
        wait_until(
            lambda: ctrl.counters()["rejected"].get("bad_origin", 0) >= 1, 10, "the late update refused"
        )
    finally:
        stranger.close()
    assert np.array_equal(ctrl.params, before)
    assert np.max(np.abs(stayer.params - ctrl.params)) <= 1e-6


@pytest.mark.timeout(60)
def test_chunks_claiming_huge_totals_are_refused_within_the_senders_budget(roles) -> None:
    cfg = fast()
    ctrl = Controller(cfg, np.zeros(N, np.float32)).start()
    roles.append(ctrl)
    per_peer, per_process = cfg.reassembly_budget(N * 4)
    assert per_peer == 8 * N * 4 + 2 * cfg.chunk_bytes and per_process == 4 * per_peer
    stranger = Stranger()
    try:
        me = stranger.join(ctrl.address)
        for msg_id in range(200):  # each claims 1 GiB, or just under the budget; one 4 KB piece each
            total = 2**30 if msg_id % 2 else per_peer - 1
            fields = {
                "msg_id": msg_id,
                "index": 0,
                "count": 2,
                "offset": 0,
                "total": total,
                "inner": msgpack.unpackb(header("heartbeat", me, mesh_version=0, stats={}, watermark={})),
                "lengths": [total],
            }
            stranger.send(ctrl.address, [header("chunk", me, **fields), b"\0" * 4096])
        wait_until(lambda: ctrl.counters()["rejected"].get("bad_chunk", 0) >= 199, 20, "the chunks refused")
        held = ctrl.call(lambda: ctrl._reassembler.in_flight_bytes)  # noqa: SLF001
        assert held <= per_peer, f"{held} bytes held for one sender, budget {per_peer}"
    finally:
        stranger.close()
