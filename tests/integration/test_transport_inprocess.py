"""The embedding API (what the Spark integration uses): Controller and Nodes in one process, real sockets."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from conftest import wait_until
from psrv.encoding import AdaptiveThreshold, ResidualEncoder, decode
from psrv.server import Controller, Node
from psrv.transport import ControllerLostError, TransportConfig
from psrv.transport.errors import InvalidUpdateError, JoinError, NoMatchingInterfaceError
from psrv.transport.messages import PROTOCOL_VERSION

N = 3000


def fast(**kw) -> TransportConfig:
    return TransportConfig(
        **{"heartbeat_s": 0.2, "missed_beats": 5, "join_timeout_s": 10, "linger_s": 0.5, **kw}
    )




def messages(count: int, seed: int, n: int = N) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    encoder = ResidualEncoder(n, threshold_algorithm=AdaptiveThreshold())  # dense bitmaps: large messages
    out = []
    while len(out) < count:
        m = encoder.encode_update((rng.standard_normal(n) * 2e-3).astype(np.float32))
        if m is not None:
            out.append(m)
    return out


@pytest.fixture
def roles():
    started: list = []
    yield started
    for role in reversed(started):
        role.stop()


@pytest.mark.timeout(60)
def test_dropped_copies_are_repaired_by_a_resync(roles) -> None:
    """A receiver that stalls while 15 MB of updates arrive loses relayed copies (tiny queues); the
    heartbeat watermarks make it re-sync, and it ends equal to the master copy."""
    big = 200_000  # bitmap messages of 50 KB: more than the kernel's socket buffers hold
    # tiny zmq queues and kernel buffers on both ends, so the overflow does not depend on timing
    cfg = fast(peer_queue_messages=2, receive_queue_messages=2, socket_buffer_bytes=64 * 1024)
    ctrl = Controller(cfg, np.zeros(big, np.float32)).start()
    roles.append(ctrl)
    slow_params = np.zeros(big, np.float32)
    stalled = threading.Event()

    def stalling_apply(payload, header):
        if not stalled.is_set():
            stalled.set()
            time.sleep(1.5)  # under the 1 s x missed-beats offline limit, over the time to overflow
        decode(payload, slow_params)

    senders = [Node(cfg, np.zeros(big, np.float32), ctrl.address).start() for _ in range(2)]
    slow = Node(cfg, slow_params, ctrl.address, apply=stalling_apply).start()
    roles.extend([*senders, slow])
    for i, node in enumerate(senders):
        for m in messages(150, seed=i, n=big):
            node.submit(m, apply_locally=True)
    wait_until(lambda: ctrl.counters()["updates_applied"] == 300, 30, "the controller to apply all 300")
    assert ctrl.counters()["updates_dropped_backpressure"] > 0, "the tiny queues must have overflowed"
    for node in [*senders, slow]:
        wait_until(
            lambda n=node: np.max(np.abs(n.params - ctrl.params)) <= 1e-6, 20, f"node {node.node_id} equal"
        )
    assert slow.counters()["resyncs"] >= 2, "equality came back through a re-sync"


@pytest.mark.timeout(60)
def test_chunked_catch_up_with_updater_state(roles) -> None:
    cfg = fast(chunk_bytes=4096, max_message_bytes=64 * 1024, max_header_bytes=8 * 1024)
    master = np.arange(N, dtype=np.float32)
    updater = np.linspace(0, 1, 2 * N)
    ctrl = Controller(cfg, master.copy(), updater_state=updater).start()
    roles.append(ctrl)
    node = Node(cfg, np.zeros(N, np.float32), ctrl.address, want_updater_state=True).start()
    roles.append(node)
    assert np.array_equal(node.params, master)
    assert np.array_equal(node.updater_state, updater)
    sender = Node(cfg, np.zeros(N, np.float32), ctrl.address).start()  # joins later: downloads the same
    roles.append(sender)
    assert np.array_equal(sender.params, master) and sender.updater_state is None
    for m in messages(5, seed=3):
        sender.submit(m, apply_locally=True)
    wait_until(lambda: node.counters()["updates_applied"] == 5, 10, "the updates")
    assert np.max(np.abs(node.params - ctrl.params)) <= 1e-6
    assert ctrl.counters()["frames_out"] > 2 * N * 4 / 4096, "the download travelled in chunks"


class LosingController(Controller):
    """Loses the first parameter download: every chunk of it, or (``chunk``) one chunk of it."""

    def __init__(self, *args, chunk: bool, **kw) -> None:
        super().__init__(*args, **kw)
        self.chunk = chunk
        self.lost = 0
        self.lost_msg: int | None = None
        links = self._loop.links  # the I/O loop's outgoing side hands each download piece over
        send_piece = links.send_piece

        def losing(peer, paced, part) -> None:
            if self.lost_msg is None:
                self.lost_msg = part["msg_id"]
                self.lost += 1
            if part["msg_id"] == self.lost_msg and (not self.chunk or part["index"] == 1):
                return  # "sent", and lost on the way
            send_piece(peer, paced, part)

        links.send_piece = losing


@pytest.mark.timeout(60)
@pytest.mark.parametrize("chunk", [False, True], ids=["reply", "chunk"])
def test_a_lost_download_is_asked_for_again(roles, chunk) -> None:
    cfg = fast(chunk_bytes=4096, max_message_bytes=64 * 1024, max_header_bytes=8 * 1024)
    master = np.arange(N, dtype=np.float32)
    ctrl = LosingController(cfg, master.copy(), chunk=chunk).start()
    roles.append(ctrl)
    started = time.monotonic()
    node = Node(cfg, np.zeros(N, np.float32), ctrl.address).start()  # catchup_timeout_s is 120 s
    roles.append(node)
    assert ctrl.lost == 1 and np.array_equal(node.params, master)
    assert node.counters()["download_retries"] == 1
    assert time.monotonic() - started < 10.0, "asked again after seconds, not at the catch-up deadline"


@pytest.mark.timeout(60)
def test_downloads_through_a_send_queue_of_one_message_wait_their_turn(roles) -> None:
    """zmq takes one message per connection at a time: the other chunks wait in the overflow queue,
    one per download, and three nodes still catch up from the one shared snapshot."""
    cfg = fast(
        chunk_bytes=4096, max_message_bytes=64 * 1024, max_header_bytes=8 * 1024, peer_queue_messages=1
    )
    master = np.arange(N, dtype=np.float32)
    ctrl = Controller(cfg, master.copy()).start()
    roles.append(ctrl)
    nodes = [Node(cfg, np.zeros(N, np.float32), ctrl.address) for _ in range(3)]
    roles.extend(nodes)
    threads = [threading.Thread(target=node.start) for node in nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(node.running and np.array_equal(node.params, master) for node in nodes)
    counters = ctrl.counters()
    assert counters["downloads_new_snapshot"] == 1 and counters["downloads_shared"] == 2
    assert counters["offline"] == 0


@pytest.mark.timeout(60)
def test_the_task_lock_and_the_status_view(roles) -> None:
    ctrl = Controller(fast(mesh="mesh", fan_out=1), np.zeros(N, np.float32)).start()
    roles.append(ctrl)
    lock = threading.RLock()
    a = Node(fast(node_name="part-0"), np.zeros(N, np.float32), ctrl.address, lock=lock).start()
    b = Node(fast(node_name="part-1"), np.zeros(N, np.float32), ctrl.address).start()
    roles.extend([a, b])
    assert a.lock is lock

    def placed() -> bool:  # b under a, and both nodes hold the mesh that says so
        status = ctrl.status()
        places = {n["id"]: n for n in status["nodes"]}
        return (len(places) == 2 and places[b.node_id]["parent"] == a.node_id
                and a.counters()["mesh_version"] == b.counters()["mesh_version"] == status["mesh_version"])

    wait_until(placed, 10, "b placed under a")
    for m in messages(20, seed=5):  # the task applies and submits under the node's lock
        with a.lock:
            decode(m, a.params)
            a.submit(m)

    def caught_up() -> bool:
        counters = b.counters()
        # each update applied once through a's relay, or (on a starved host, where a's relay came later
        # than the controller's watermark) a re-sync that downloaded them within the master copy
        done = counters["updates_applied"] == 20 or counters["resyncs"] > 1
        with b.lock:
            return done and np.max(np.abs(a.params - b.params)) <= 1e-6

    wait_until(caught_up, 10, "b holding a's updates")
    status = ctrl.status()
    places = {n["id"]: n for n in status["nodes"]}
    assert places[a.node_id]["parent"] == 0 and places[b.node_id]["parent"] == a.node_id
    assert places[a.node_id]["name"] == "part-0" and status["depth"] == 2
    counters = b.counters()
    applied = counters["applied_by_origin"].get(a.node_id, 0)
    assert counters["resyncs"] >= 1  # the download at the join
    assert applied == 20 if counters["resyncs"] == 1 else applied <= 20
    assert counters["mesh_version"] == status["mesh_version"]
    with pytest.raises(InvalidUpdateError):
        a.submit(np.zeros(3, dtype=np.float32))
    with pytest.raises(InvalidUpdateError):
        a.submit(messages(1, seed=1)[0][:-1])


@pytest.mark.timeout(60)
def test_node_surfaces_controller_lost_to_the_caller(roles) -> None:
    ctrl = Controller(fast(), np.zeros(N, np.float32)).start()
    node = Node(fast(), np.zeros(N, np.float32), ctrl.address).start()
    roles.append(node)
    ctrl.stop()
    with pytest.raises(ControllerLostError, match="shut down"):
        node.wait(5.0)
    with pytest.raises(ControllerLostError):
        node.submit(messages(1, seed=2)[0])


@pytest.mark.timeout(60)
def test_wait_acknowledged_tracks_the_controllers_watermark(roles) -> None:
    """True once the master copy holds every own update, False at the deadline while the
    controller is busy, and the controller's loss surfaces as ControllerLostError (no hang)."""
    busy = threading.Event()

    def slow_apply(payload, header):  # the controller's I/O thread stalls: no beats, no watermark
        if not busy.is_set():
            busy.set()
            time.sleep(0.8)  # well under the node's 3 s controller timeout

    cfg = fast(missed_beats=15)
    ctrl = Controller(cfg, np.zeros(N, np.float32), apply=slow_apply).start()
    roles.append(ctrl)
    node = Node(cfg, np.zeros(N, np.float32), ctrl.address).start()
    roles.append(node)
    assert node.wait_acknowledged(5.0), "nothing submitted yet: acknowledged at once"
    for m in messages(10, seed=7):
        node.submit(m, apply_locally=True)
    started = time.monotonic()
    assert not node.wait_acknowledged(0.3), "the controller is still applying the first update"
    assert time.monotonic() - started < 1.0, "False at the deadline, not later"
    assert node.wait_acknowledged(10.0)
    assert ctrl.counters()["updates_applied"] == 10, "acknowledged means applied to the master copy"
    ctrl.stop()
    started = time.monotonic()
    with pytest.raises(ControllerLostError):
        for m in messages(1, seed=8):
            node.submit(m, apply_locally=True)
        node.wait_acknowledged(30.0)
    assert time.monotonic() - started < 10.0
    with pytest.raises(ControllerLostError):
        node.wait_acknowledged(1.0)


@pytest.mark.timeout(30)
def test_join_errors_name_both_addresses_and_masks_are_checked() -> None:
    node = Node(fast(join_timeout_s=0.5), np.zeros(N, np.float32), "127.0.0.1:9")
    with pytest.raises(JoinError, match=r"127\.0\.0\.1:9 from local address 127\.0\.0\.1:\d+"):
        node.start()
    with pytest.raises(NoMatchingInterfaceError, match="interfaces seen"):
        Controller(fast(network_mask="203.0.113.0/24"), np.zeros(4, np.float32)).start()
    ctrl = Controller(fast(network_mask="127.0.0.0/8"), np.zeros(4, np.float32)).start()
    try:
        assert ctrl.address.startswith("127.")
    finally:
        ctrl.stop()


@pytest.mark.timeout(30)
def test_oversized_frames_never_arrive(roles) -> None:
    import msgpack
    import zmq
    from psrv.transport.sockets import tcp

    ctrl = Controller(
        fast(max_message_bytes=64 * 1024, chunk_bytes=16 * 1024, max_header_bytes=16 * 1024),
        np.zeros(N, np.float32),
    ).start()
    roles.append(ctrl)
    context = zmq.Context()
    try:
        big, small = context.socket(zmq.DEALER), context.socket(zmq.DEALER)
        for sock in (big, small):
            sock.linger = 0
            sock.connect(tcp(ctrl.address))
        big.send_multipart(
            [msgpack.packb({"v": PROTOCOL_VERSION, "op": "leave", "src": 1, "reason": "x"}),
             b"\0" * (1 << 20)]
        )
        small.send_multipart([b"garbage"])
        wait_until(lambda: ctrl.counters()["rejected_total"] == 1, 5, "the small garbage frame counted")
        time.sleep(0.3)
        counters = ctrl.counters()
        assert counters["rejected"] == {"bad_header": 1}, "zmq's MAXMSGSIZE dropped the 1 MB frame unread"
        assert counters["frames_in"] == 1
    finally:
        big.close(0)
        small.close(0)
        context.term()


@pytest.mark.timeout(30)
def test_crafted_join_and_mesh_messages_are_rejected_not_fatal(roles) -> None:
    import msgpack
    import zmq
    from psrv.transport.sockets import tcp

    ctrl = Controller(fast(), np.zeros(N, np.float32)).start()
    node = Node(fast(), np.zeros(N, np.float32), ctrl.address).start()
    roles.extend([ctrl, node])
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    try:
        sock.linger = 0
        sock.connect(tcp(ctrl.address))
        sock.send_multipart(
            [
                msgpack.packb(
                    {"v": PROTOCOL_VERSION, "op": "join", "src": -1, "address": "no port here", "name": None,
                     "token": "t"}
                )
            ]
        )
        wait_until(lambda: ctrl.counters()["rejected_total"] == 1, 5, "the bad join rejected")
        sock.close(0)
        sock = context.socket(zmq.DEALER)
        sock.linger = 0
        sock.connect(tcp(node.address))
        mesh = ctrl.mesh.to_dict()
        mesh["version"] += 10
        rows = [[i, p, a, c + [99] if i == node.node_id else c] for i, p, a, c in mesh["nodes"]]
        mesh["nodes"] = [*rows, [99, node.node_id, "bogus", []]]  # a child at an address that is none
        mesh["next_id"], mesh["mode"] = 100, "mesh"
        sock.send_multipart(
            [msgpack.packb({"v": PROTOCOL_VERSION, "op": "mesh", "src": 0, "mesh": mesh,
                            "version": mesh["version"]})]
        )
        wait_until(lambda: node.counters()["rejected_total"] == 1, 5, "the bad mesh rejected")
    finally:
        sock.close(0)
        context.term()
    assert ctrl.running and node.running and ctrl.counters()["joins"] == 1
    assert node.counters()["rejected"] == {"bad_field": 1}


@pytest.mark.timeout(60)
def test_updates_travel_packed_and_every_replica_applies_exactly_what_was_encoded(roles) -> None:
    """A node sends each update in its smallest wire form (packed: 1-2 bytes an element, not 4);
    what the controller and the other nodes apply is the encoder's messages, bit for bit."""
    from psrv.encoding import message_info, sparse_message

    n = 100_000
    rng = np.random.default_rng(5)
    encoded = []
    for _ in range(20):  # about 1 % of the elements, as a settled threshold sends
        where = np.flatnonzero(rng.random(n) < 0.01)
        encoded.append(sparse_message(where, rng.random(where.size) < 0.5, n, 1e-3))
    expected = np.zeros(n, np.float32)
    for m in encoded:
        decode(m, expected)
    ctrl = Controller(fast(), np.zeros(n, np.float32)).start()
    roles.append(ctrl)
    received: list = []
    receiver_params = np.zeros(n, np.float32)

    def recording_apply(payload, header):
        received.append((header["encoding"], message_info(payload)))
        decode(payload, receiver_params)

    sender = Node(fast(), np.zeros(n, np.float32), ctrl.address).start()
    receiver = Node(fast(), receiver_params, ctrl.address, apply=recording_apply).start()
    roles.extend([sender, receiver])
    sent_before, received_before = sender.counters()["bytes_out"], receiver.counters()["bytes_in"]
    for m in encoded:
        sender.submit(m, apply_locally=True)
    wait_until(lambda: len(received) == 20 and ctrl.counters()["updates_applied"] == 20, 20, "every update")
    # sent packed; unpacked once where it arrived (the intake's one walk of the varints), then applied
    assert {(form, info.form) for form, info in received} == {("packed", "sparse")}
    assert [info.count for _, info in received] == [message_info(m).count for m in encoded]
    for params in (sender.params, ctrl.params, receiver_params):
        assert np.array_equal(params, expected)  # the same elements, applied in the same order
    sparse_bytes = sum(m.nbytes for m in encoded)
    wire_bytes = sender.counters()["bytes_out"] - sent_before
    assert wire_bytes < 0.5 * sparse_bytes, (wire_bytes, sparse_bytes)
    relayed_bytes = receiver.counters()["bytes_in"] - received_before  # relayed by the controller, packed
    assert relayed_bytes < 0.5 * sparse_bytes, (relayed_bytes, sparse_bytes)
