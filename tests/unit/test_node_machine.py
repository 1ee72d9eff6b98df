"""NodeMachine driven by events only: no sockets, no threads, a fake clock (server/node_machine.py).

Each test plays the controller and the neighbours by hand-made ``Received`` events and checks the
actions and the replica: what is applied (once), relayed (never back), held, refused (counted), and
when the machine stops.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from psrv.encoding.codec import sparse_message
from psrv.server.mesh import MeshOrganizer
from psrv.server.node_machine import NodeMachine, NodeState
from psrv.server.node_state import SlotToken
from psrv.server.updates import unbatch
from psrv.transport.config import TransportConfig
from psrv.transport.errors import ControllerLostError, JoinError
from psrv.transport.events import (
    CheckRequested,
    Connect,
    Disconnect,
    Dropped,
    Notify,
    Received,
    ReleaseSlots,
    Send,
    Started,
    Stop,
    Stopping,
    Submit,
    Tick,
)
from psrv.transport.messages import Message, Op

N = 64
TAU = 0.5
CTRL_RID = bytes(range(16))
ADDR = "127.0.0.1:7000"


def rid(node_id: int) -> bytes:
    return bytes([node_id]) * 16


def update(origin: int, seq: int, index: int | None = None, src: int | None = None) -> Message:
    index = (origin * 7 + seq) % N if index is None else index
    payload = sparse_message(np.array([index]), np.array([False]), N, TAU)
    fields = {"origin": origin, "seq": seq, "iteration": 0, "epoch": 0, "tau": TAU, "encoding": "sparse"}
    return Message(Op.UPDATE, fields, [payload.tobytes()], src if src is not None else origin)


def delta(index: int) -> np.ndarray:
    out = np.zeros(N, dtype=np.float32)
    out[index] += np.float32(TAU)
    return out


class Harness:
    """A NodeMachine, a fake clock, and the controller's side of the protocol written by hand."""

    def __init__(self, mode: str = "plain", fan_out: int = 8, **config) -> None:
        cfg = {"heartbeat_s": 1.0, "missed_beats": 3, "join_timeout_s": 10.0,
               "controller_lost_timeout_s": 20.0, "catchup_timeout_s": 30.0, **config}
        self.config = TransportConfig(**cfg)
        self.params = np.zeros(N, dtype=np.float32)
        self.released = 0
        self.rng = random.Random(7)
        self.machine = NodeMachine(self.config, self.params, "127.0.0.1:5000",
                                   random_bytes=self.rng.randbytes)
        self.now = 100.0
        self.mesh = MeshOrganizer(mode, fan_out, controller_address="127.0.0.1:5000")
        self.routes: dict[int, str] = {0: CTRL_RID.hex()}

    def _release(self, n: int) -> None:
        self.released += n

    def handle(self, event, dt: float = 0.0) -> list:
        """As the facade does: give slots back, bind the slot tokens, and hand the loop the rest."""
        self.now += dt
        rest = []
        for action in self.machine.handle(event, self.now):
            if isinstance(action, ReleaseSlots):
                self._release(action.count)
            elif not isinstance(action, Notify):
                if isinstance(action, Send) and isinstance(action.token, SlotToken):
                    action.token.bind(self._release)
                rest.append(action)
        return rest

    def start(self) -> list:
        return self.handle(Started(ADDR))

    def from_ctrl(self, message: Message, *, own_connection: bool = False, dt: float = 0.0) -> list:
        if own_connection:
            return self.handle(Received(message, routing_id=None, via=0), dt)
        return self.handle(Received(message, routing_id=CTRL_RID), dt)

    def from_node(self, message: Message, node_id: int, dt: float = 0.0) -> list:
        return self.handle(Received(message, routing_id=rid(node_id)), dt)

    def add(self, *node_ids: int) -> None:
        for node_id in node_ids:
            self.mesh.add_node(node_id, f"127.0.0.1:{7000 + node_id}")

    def join(self, node_id: int = 1, others: tuple[int, ...] = ()) -> list:
        """Start, join as ``node_id`` in a mesh holding ``others`` too; returns the join reply's actions."""
        if self.machine.address is None:
            self.start()
        self.add(node_id, *others)
        self.routes.update({n: rid(n).hex() for n in others})
        token = self.machine.timers.token
        reply = Message(Op.JOIN_REPLY, {"node_id": node_id, "mesh": self.mesh.to_dict(), "restart": False,
                                        "heartbeat_s": 1.0, "missed_beats": 3, "token": token,
                                        "routes": dict(self.routes)}, src=0)
        return self.from_ctrl(reply, own_connection=True)

    def snapshot(self, master: np.ndarray, watermark: dict[int, int], request_id: int,
                 extra: dict[int, list[int]] | None = None,
                 given_up: dict[int, list[int]] | None = None) -> Message:
        return Message(Op.PARAMS_REPLY, {"request_id": request_id, "dtype": "<f4", "size": N,
                                         "updater_dtype": None, "updater_size": 0, "watermark": watermark,
                                         "extra_seen": extra or {}, "given_up": given_up or {}},
                       [master.astype("<f4").tobytes()], src=0)

    def catch_up(self, master: np.ndarray | None = None, watermark: dict[int, int] | None = None) -> list:
        master = np.zeros(N, dtype=np.float32) if master is None else master
        return self.from_ctrl(self.snapshot(master, watermark or {}, self.machine.download.request_id),
                              own_connection=True)

    def mesh_update(self, *added: int) -> list:
        self.add(*added)
        self.routes.update({n: rid(n).hex() for n in added})
        msg = Message(Op.MESH, {"mesh": self.mesh.to_dict(), "version": self.mesh.version,
                                "routes": dict(self.routes)}, src=0)
        return self.from_ctrl(msg)

    def beat(self, watermark: dict[int, int], dt: float = 1.0) -> list:
        return self.from_ctrl(Message(Op.HEARTBEAT, {"mesh_version": self.mesh.version, "stats": {},
                                                     "watermark": watermark}, src=0), dt=dt)

    def submit(self, index: int) -> tuple[int, list]:
        payload = sparse_message(np.array([index]), np.array([False]), N, TAU)
        self.params += delta(index)  # the caller applies its own update
        fields = {"iteration": 0, "epoch": 0, "tau": TAU, "encoding": "sparse"}
        actions = self.handle(Submit(payload, fields))
        return self.machine.submitted_seq, actions

    @staticmethod
    def sent(actions: list, op: Op, to: int | None = None) -> list[Send]:
        return [a for a in actions
                if isinstance(a, Send) and a.message.op is op and (to is None or a.to == to)]

    def rejected(self, reason: str) -> int:
        return self.machine.counters_.snapshot()["rejected"].get(reason, 0)


def joined(mode: str = "plain", node_id: int = 1, others: tuple[int, ...] = (), **config) -> Harness:
    h = Harness(mode, **config) if mode == "plain" else Harness(mode, fan_out=2, **config)
    h.join(node_id, others)
    h.catch_up()
    assert h.machine.state is NodeState.RUNNING
    return h


def rows(send: Send) -> list[tuple[int, int]]:
    return [(f["origin"], f["seq"]) for f, _ in unbatch(send.message)]


# ------------------------------------------------------------------------------------ joining


def test_join_backs_off_then_fails_at_the_deadline():
    h = Harness(join_timeout_s=5.0)
    actions = h.start()
    (connect,) = [a for a in actions if isinstance(a, Connect)]
    assert (connect.peer, connect.address, connect.listen) == (0, "127.0.0.1:5000", True)
    times = [h.now] if h.sent(actions, Op.JOIN, 0) else []
    stop = None
    for _ in range(200):
        actions = h.handle(Tick(), dt=0.05)
        if h.sent(actions, Op.JOIN):
            times.append(h.now)
        stop = next((a for a in actions if isinstance(a, Stop)), None)
        if stop is not None:
            break
    gaps = np.diff(times)
    assert gaps[0] == pytest.approx(0.1, abs=0.051) and all(g <= 2.0 + 0.051 for g in gaps)
    assert all(b >= a - 0.051 for a, b in zip(gaps, gaps[1:], strict=False))  # never faster
    assert isinstance(stop, Stop) and isinstance(stop.error, JoinError)
    assert h.now - 100.0 == pytest.approx(5.0, abs=0.06)
    assert h.handle(Tick(), dt=0.05) == []  # stopped: nothing more


def test_a_mesh_that_passes_the_join_reply_is_installed_after_it():
    """The join reply comes on the node's own connection, the controller's MESH on its ROUTER: the MESH
    naming a member that joined just after us may be handled first. The controller counts it
    delivered and will not send it again, so it is held until the reply, not dropped."""
    h = Harness()
    h.start()
    h.add(1)
    answer = h.mesh.to_dict()  # the reply's mesh: version 1, node 1 alone
    h.mesh_update(2)  # version 2 (node 2 joined), on the ROUTER, before the reply is handled
    assert h.machine.state is NodeState.JOINING and h.machine.mesh is None
    token = h.machine.timers.token
    h.from_ctrl(Message(Op.JOIN_REPLY, {"node_id": 1, "mesh": answer, "restart": False, "heartbeat_s": 1.0,
                                        "missed_beats": 3, "token": token, "routes": {0: CTRL_RID.hex()}},
                        src=0), own_connection=True)
    assert h.machine.mesh.version == 2 and 2 in h.machine.mesh
    h.catch_up()
    h.from_ctrl(update(2, 1, src=0))  # node 2's update, relayed by the controller: node 2 is known
    assert h.machine.counters_["updates_applied"] == 1 and h.rejected("bad_origin") == 0


def test_a_late_join_reply_to_an_old_token_is_ignored():
    h = Harness()
    h.start()
    h.add(1)
    stale = Message(Op.JOIN_REPLY, {"node_id": 1, "mesh": h.mesh.to_dict(), "restart": False,
                                    "heartbeat_s": 1.0, "missed_beats": 3, "token": "00" * 16,
                                    "routes": dict(h.routes)}, src=0)
    assert h.from_ctrl(stale, own_connection=True) == []
    assert h.machine.state is NodeState.JOINING


def test_the_same_random_source_replays_the_same_actions():
    def run() -> list:
        h = Harness()
        out = [h.start(), h.join(1, others=(2,)), h.catch_up(), h.from_node(update(2, 1), 2)]
        def key(a) -> tuple:
            message = getattr(a, "message", None)
            return type(a).__name__, getattr(a, "to", None), str(getattr(message, "fields", ""))

        return [[key(a) for a in actions] for actions in out]

    assert run() == run()


# ---------------------------------------------------------------------------------- catch-up


def test_catch_up_equals_master_plus_held_updates_applied_once():
    h = Harness()
    h.join(1, others=(2,))
    assert h.machine.state is NodeState.SYNCING
    # during the download: 2/1 (which the master includes) and 2/2 (which it lacks) arrive and are held
    h.from_node(update(2, 1, index=3), 2)
    h.from_node(update(2, 2, index=5), 2)
    assert not h.params.any()
    master = np.zeros(N, dtype=np.float32)
    master[10] = 4.0
    master += delta(3)  # the master includes 2/1
    h.catch_up(master, {2: 1})
    assert h.machine.state is NodeState.RUNNING
    np.testing.assert_array_equal(h.params, master + delta(5))
    # a duplicate of what the download included and of what was held is dropped, not applied
    h.from_node(update(2, 1, index=3), 2)
    h.from_node(update(2, 2, index=5), 2)
    np.testing.assert_array_equal(h.params, master + delta(5))
    assert h.machine.counters_["duplicates_dropped"] == 2
    assert h.machine.counters_["updates_applied"] == 1


def test_backlog_submitted_while_joining_is_numbered_and_sent_after_catch_up():
    h = Harness()
    h.join(1)
    seq, actions = h.submit(7)
    assert (seq, actions) == (0, [])
    assert h.released == 1  # its slot was released at once
    actions = h.catch_up()
    sends = h.sent(actions, Op.UPDATES, 0)
    assert [rows(s) for s in sends] == [[(1, 1)]] and not sends[0].droppable
    np.testing.assert_array_equal(h.params, delta(7))  # re-applied on the downloaded replica


def test_a_download_that_stops_moving_is_asked_for_again_and_times_out():
    h = Harness(catchup_timeout_s=12.0)
    h.join(1)
    asked = 1
    stop = None
    alive = Message(Op.HEARTBEAT, {"mesh_version": 1, "stats": {}, "watermark": {}}, src=0)
    for _ in range(300):
        h.from_ctrl(alive, own_connection=True)  # the controller is alive; only the download is lost
        actions = h.handle(Tick(), dt=0.1)
        asked += len(h.sent(actions, Op.PARAMS_REQUEST))
        stop = next((a for a in actions if isinstance(a, Stop)), None)
        if stop:
            break
    assert 2 <= asked <= 3  # retried after 4 s, then after 8 s more: backing off
    assert isinstance(stop.error, JoinError)


# -------------------------------------------------------------------------------- steady state


def test_a_duplicate_is_dropped():
    h = joined(others=(2,))
    h.from_node(update(2, 1, index=4), 2)
    h.from_node(update(2, 1, index=4), 2)
    np.testing.assert_array_equal(h.params, delta(4))
    assert h.machine.counters_["duplicates_dropped"] == 1


def test_relay_never_goes_back_and_only_relayed_copies_are_droppable():
    h = Harness("mesh", fan_out=2)
    # 1 and 2 are the controller's children; 3 and 4 are node 1's
    h.join(1, others=(2, 3, 4))
    h.catch_up()
    assert h.mesh.parent(3) == 1 and h.mesh.parent(4) == 1
    actions = h.from_node(update(3, 1), 3)
    assert sorted(a.to for a in h.sent(actions, Op.UPDATES)) == [0, 4]
    assert all(a.droppable for a in h.sent(actions, Op.UPDATES))
    actions = h.from_ctrl(update(2, 1, src=0))
    assert sorted(a.to for a in h.sent(actions, Op.UPDATES)) == [3, 4]
    seq, actions = h.submit(9)
    own = h.sent(actions, Op.UPDATES)
    assert seq == 1 and sorted(a.to for a in own) == [0, 3, 4] and not any(a.droppable for a in own)
    # the submit slot is released once every target socket took the frames
    assert len({id(a.token) for a in own}) == 1 and h.released == 0
    for a in own:
        a.token.sent()
    assert h.released == 1
    before = h.machine.counters_["updates_relayed"]
    h.handle(Dropped(4, 1))
    assert h.machine.counters_["updates_dropped_backpressure"] == 1
    assert h.machine.counters_["updates_relayed"] == before - 1


def test_resync_when_behind_for_two_beats():
    h = joined(others=(2,))
    # the controller holds 5 updates of node 2 that never reach us
    h.beat({2: 5})
    h.beat({2: 5})
    assert h.machine.state is NodeState.RUNNING
    actions = h.beat({2: 5}, dt=3.1)  # two beats later, still behind and not moving
    assert h.sent(actions, Op.PARAMS_REQUEST, 0)
    assert h.machine.state is NodeState.SYNCING and h.machine.counters_["resyncs"] == 2


def test_no_resync_while_the_gap_is_moving():
    h = joined(others=(2,))
    h.beat({2: 5})
    h.from_node(update(2, 1), 2)
    h.beat({2: 5})
    h.from_node(update(2, 2), 2)
    actions = h.beat({2: 5}, dt=3.1)
    assert not h.sent(actions, Op.PARAMS_REQUEST) and h.machine.state is NodeState.RUNNING


def below_node_1() -> Harness:
    """Node 3 in a MESH of fan-out 2, a child of node 1: node 2's updates reach it through node 1."""
    h = Harness("mesh", fan_out=2)
    h.add(1, 2)  # the controller's children
    h.routes.update({1: rid(1).hex(), 2: rid(2).hex()})
    h.join(3, others=(4,))
    h.catch_up()
    assert h.mesh.parent(3) == 1 and h.machine.state is NodeState.RUNNING
    return h


def test_no_resync_below_a_relay_that_is_slow_for_less_than_the_liveness_timeout():
    """The controller's beat overtakes the copies a starved (live) parent still holds: no download."""
    h = below_node_1()
    h.beat({2: 2}, dt=4.0)  # node 2's updates 1 and 2 are in the master, still inside node 1 here
    h.beat({2: 2})
    actions = h.beat({2: 2})  # two beats later (2 s), not moved: a gap, but not older than 3 s
    assert not h.sent(actions, Op.PARAMS_REQUEST) and h.machine.state is NodeState.RUNNING
    # three beats that queued while this node was starved, read at once: they span no time
    for _ in range(3):
        actions = h.beat({2: 2}, dt=0.0)
        assert not h.sent(actions, Op.PARAMS_REQUEST)
    h.from_node(update(2, 1, src=1), 1)  # the parent is back: the copies arrive
    h.from_node(update(2, 2, src=1), 1)
    for _ in range(5):
        actions = h.beat({2: 2})
        assert not h.sent(actions, Op.PARAMS_REQUEST)
    assert h.machine.state is NodeState.RUNNING and h.machine.counters_["resyncs"] == 1
    assert h.machine.counters_["updates_applied"] == 2


def test_resync_below_a_relay_once_the_gap_outlives_the_liveness_timeout():
    h = below_node_1()
    h.beat({2: 2}, dt=4.0)
    for _ in range(2):
        actions = h.beat({2: 2})
        assert not h.sent(actions, Op.PARAMS_REQUEST)
    actions = h.beat({2: 2})  # 3 s after the first beat that showed the gap: a loss
    assert h.sent(actions, Op.PARAMS_REQUEST, 0)
    assert h.machine.state is NodeState.SYNCING and h.machine.counters_["resyncs"] == 2


def test_own_updates_the_controller_lacks_are_sent_again():
    h = joined()
    for index in (1, 2, 3):
        h.submit(index)
    h.beat({1: 1})
    h.beat({1: 1})
    actions = h.beat({1: 1}, dt=3.1)
    again = h.sent(actions, Op.UPDATES, 0) + h.sent(actions, Op.UPDATE, 0)
    assert sorted(r for s in again for r in rows(s)) == [(1, 2), (1, 3)]
    assert h.machine.counters_["updates_resent"] == 2
    assert not h.machine.all_acknowledged()
    h.beat({1: 3})
    assert h.machine.all_acknowledged()


# ----------------------------------------------------------------------------- faults and stop


def test_partition_rejoin_attempts_then_controller_lost_error():
    h = joined(controller_lost_timeout_s=20.0)
    h.submit(3)
    joins = 0
    lost_at = stop = None
    for _ in range(600):
        actions = h.handle(Tick(), dt=0.1)  # the controller is silent from now on
        if lost_at is None and h.machine.state is NodeState.JOINING:
            lost_at = h.now
        joins += len(h.sent(actions, Op.JOIN))
        stop = next((a for a in actions if isinstance(a, Stop)), None)
        if stop:
            break
    assert lost_at is not None and lost_at - 100.0 <= 4.0  # silent > 3.5 s
    assert joins >= 10  # it kept trying to rejoin
    assert isinstance(stop.error, ControllerLostError)
    assert h.now - lost_at == pytest.approx(20.0, abs=0.15)


def test_a_partition_that_heals_rejoins_and_catches_up():
    h = joined(others=(2,))
    for _ in range(50):
        h.handle(Tick(), dt=0.1)
    assert h.machine.state is NodeState.JOINING
    seq, _ = h.submit(3)  # submitted while rejoining: the backlog
    assert seq == 0
    h.mesh = MeshOrganizer("plain", controller_address="127.0.0.1:5000")
    h.mesh.add_node(1, "x:1")
    h.mesh.remove_node(1)  # ids never come back: the rejoin gets id 3
    h.add(2)
    h.routes = {0: CTRL_RID.hex(), 2: rid(2).hex()}
    h.join(3)
    actions = h.catch_up()
    assert h.machine.ids_held == [1, 3] and h.machine.state is NodeState.RUNNING
    assert [rows(s) for s in h.sent(actions, Op.UPDATES, 0)] == [[(3, 1)]]


def test_evicted_rejoins_at_once_and_disconnects_the_mesh():
    h = Harness("mesh", fan_out=2)
    h.join(1, others=(2, 3))
    h.catch_up()
    actions = h.from_ctrl(Message(Op.EVICTED, {"reason": "missed beats", "node_id": 1}, src=0))
    assert Disconnect(3, 0.0) in actions and h.sent(actions, Op.JOIN, 0)
    assert h.machine.state is NodeState.JOINING and h.machine.node_id == -1
    # an eviction naming an id we no longer hold is ignored
    assert h.from_ctrl(Message(Op.EVICTED, {"reason": "late", "node_id": 1}, src=0)) == []


def test_stopping_says_leave_then_stops():
    h = joined()
    actions = h.handle(Stopping())
    assert h.sent(actions, Op.LEAVE, 0) and actions[-1] == Stop(None)
    # a submit that raced the stop gets its slot back
    h.handle(Submit(None, {}, slot=True))
    assert h.released == 1


def test_beats_go_out_once_per_interval():
    h = joined()
    beats = 0
    for _ in range(50):
        actions = h.handle(Tick(), dt=0.1)
        h.beat({}, dt=0.0) if _ % 10 == 0 else None
        beats += len(h.sent(actions, Op.HEARTBEAT, 0))
    assert 4 <= beats <= 6
    assert all(a.urgent for a in h.sent(h.handle(Tick(), dt=1.0), Op.HEARTBEAT))


def test_check_replica_probe_compares_against_the_snapshot():
    h = joined(others=(2,))
    h.from_node(update(2, 1, index=1), 2)
    h.submit(2)
    actions = h.handle(CheckRequested())
    (request,) = h.sent(actions, Op.PARAMS_REQUEST, 0)
    assert h.machine.check_verdict(1e-6) is None  # no snapshot yet
    master = delta(1)  # the master has 2/1, not yet our 1/1
    h.from_ctrl(h.snapshot(master, {2: 1}, request.message["request_id"]), own_connection=True)
    verdict = h.machine.check_verdict(1e-6)
    assert verdict.status == "equal" and verdict.replayed == 1
    h.params[0] += 1.0
    assert h.machine.check_verdict(1e-6).status == "differs"


def test_sends_the_driver_says_more_of_go_out_as_one_batch():
    h = joined()
    payload = sparse_message(np.array([1]), np.array([False]), N, TAU)
    fields = {"iteration": 0, "epoch": 0, "tau": TAU, "encoding": "sparse"}
    out = []
    for i in range(3):
        out += h.handle(Submit(payload, fields, more=i < 2))
    (batch,) = h.sent(out, Op.UPDATES, 0)
    assert rows(batch) == [(1, 1), (1, 2), (1, 3)]


def test_each_join_draws_a_session_and_every_connection_presents_its_link_id():
    from psrv.server.identity import link_id

    h = Harness("mesh", fan_out=2)
    start = h.start()
    (join,) = h.sent(start, Op.JOIN, 0)
    session = bytes.fromhex(join.message["session"])
    (ctrl,) = [a for a in start if isinstance(a, Connect)]
    assert ctrl.routing_id == link_id(session, 0) and ctrl.listen
    actions = h.join(1, others=(2, 3))
    (child,) = [a for a in actions if isinstance(a, Connect)]
    assert (child.peer, child.routing_id) == (3, link_id(session, 3))
    h.catch_up()
    # a rejoin is a new membership: a new session, the controller's connection replaced
    actions = h.from_ctrl(Message(Op.EVICTED, {"reason": "missed beats", "node_id": 1}, src=0))
    (join,) = h.sent(actions, Op.JOIN, 0)
    fresh = bytes.fromhex(join.message["session"])
    (ctrl,) = [a for a in actions if isinstance(a, Connect)]
    assert fresh != session and ctrl.routing_id == link_id(fresh, 0)


def test_in_a_mesh_own_updates_are_resent_straight_to_the_controller():
    """A copy that died past the first hop would die again as a duplicate at the neighbour that holds it."""
    h = Harness("mesh", fan_out=2)
    h.add(1, 2)  # the controller's children
    h.routes.update({1: rid(1).hex(), 2: rid(2).hex()})
    h.join(3, others=(4,))  # node 3 is a child of node 1, not of the controller
    h.catch_up()
    assert h.mesh.parent(3) == 1
    for index in (1, 2):
        _, actions = h.submit(index)
        assert sorted(a.to for a in h.sent(actions, Op.UPDATES)) == [1]  # along the mesh first (no children)
    h.beat({3: 0})
    h.beat({3: 0})
    actions = h.beat({3: 0}, dt=3.1)
    again = h.sent(actions, Op.UPDATES)
    assert [a.to for a in again] == [0] and sorted(r for a in again for r in rows(a)) == [(3, 1), (3, 2)]
    # the controller relays the re-sent copy to everyone: ours comes back down, a duplicate
    h.from_node(update(3, 1, src=1), 1)
    assert h.machine.counters_["duplicates_dropped"] == 1 and h.rejected("bad_origin") == 0
    # an own seq never sent is forged: refused
    h.from_node(update(3, 99, src=1), 1)
    assert h.rejected("bad_origin") == 1
    np.testing.assert_array_equal(h.params, delta(1) + delta(2))
