"""The controller's protocol driven by events alone: no socket, no thread, a made-up clock."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.encoding import encode
from psrv.server.controller_machine import ControllerMachine
from psrv.server.identity import link_id
from psrv.transport.config import TransportConfig
from psrv.transport.events import (
    Connect,
    Disconnect,
    Download,
    Dropped,
    Ready,
    Received,
    Reply,
    Send,
    Started,
    Stop,
    Stopping,
    Tick,
)
from psrv.transport.messages import UNJOINED, Message, Op
from psrv.transport.stat_codes import BEAT_BASELINE

N = 64
CTRL_SESSION = b"\x11" * 16
ADDRESS = "127.0.0.1:5000"


def machine(**changes) -> ControllerMachine:
    cfg = TransportConfig(**{"heartbeat_s": 1.0, "missed_beats": 3, "departed_kept_s": 5.0, **changes})
    m = ControllerMachine(cfg, np.zeros(N, np.float32), session=CTRL_SESSION)
    assert m.handle(Started(ADDRESS), 0.0) == [Ready()]
    return m


def session_of(i: int) -> bytes:
    return bytes([i]) * 16


def join(m: ControllerMachine, i: int, now: float, *, rid: bytes | None = None, name: str | None = None):
    """Node ``i`` (its session, token and address follow from i) asks to join; returns (id, actions)."""
    session = session_of(i)
    msg = Message(
        Op.JOIN,
        {"address": f"127.0.0.1:{6000 + i}", "name": name, "token": f"t{i}", "session": session.hex()},
        src=UNJOINED,
    )
    actions = m.handle(Received(msg, link_id(session, 0) if rid is None else rid), now)
    replies = [a for a in actions if isinstance(a, Reply) and a.message.op is Op.JOIN_REPLY]
    return (replies[0].message["node_id"] if replies else None), actions


def rid_of(i: int) -> bytes:
    return link_id(session_of(i), 0)


def update(src: int, origin: int, seq: int, index: int = 0) -> Message:
    vector = np.zeros(N, np.float32)
    vector[index] = 1.0
    fields = {"origin": origin, "seq": seq, "iteration": 0, "epoch": 0, "tau": 0.5, "encoding": "sparse"}
    return Message(Op.UPDATE, fields, [encode(vector, 0.5)], src=src)


def beat(src: int) -> Message:
    return Message(Op.HEARTBEAT, {"mesh_version": 0, "stats": {"x": 1}, "watermark": {}}, src=src)


def rejected(m: ControllerMachine, reason: str) -> int:
    return m.counters.snapshot()["rejected"].get(reason, 0)


def test_a_join_is_answered_with_an_id_the_mesh_and_the_routes_and_opens_a_connection() -> None:
    m = machine()
    node_id, actions = join(m, 1, 0.1)
    assert node_id == 1 and 1 in m.mesh
    connect = [a for a in actions if isinstance(a, Connect)]
    assert connect == [Connect(1, "127.0.0.1:6001", routing_id=link_id(CTRL_SESSION, 1))]
    reply = next(a for a in actions if isinstance(a, Reply))
    assert reply.routing_id == rid_of(1)
    assert reply.message["mesh"]["nodes"][1][0] == 1 and reply.message["token"] == "t1"
    assert reply.message["routes"] == {0: link_id(CTRL_SESSION, 1).hex()}
    # the same join again (a lost reply) gets the same id, nothing new happens
    again, actions = join(m, 1, 0.2)
    assert again == 1 and not any(isinstance(a, Connect) for a in actions)
    assert m.counters["joins"] == 1


def test_a_member_whose_join_was_answered_twice_still_hears_of_the_joins_between() -> None:
    """The node takes the first reply to its token and ignores the repeat (its JOIN went out again while
    the first reply was on its way): the newer mesh in the repeat is not delivered, a MESH must follow."""
    m = machine()
    join(m, 1, 0.1)
    _, first = join(m, 2, 0.2)
    (reply,) = [a for a in first if isinstance(a, Reply)]
    assert [n[0] for n in reply.message["mesh"]["nodes"]] == [0, 1, 2]  # what node 2 installs
    join(m, 3, 0.25)
    join(m, 2, 0.3)  # node 2's JOIN again: answered with the mesh holding node 3, which it ignores
    meshes = [a for a in m.handle(Tick(), 0.5) if isinstance(a, Send) and a.message.op is Op.MESH]
    assert sorted(a.to for a in meshes) == [1, 2]
    assert all(a.message["version"] == m.mesh.version for a in meshes)
    assert not [a for a in m.handle(Tick(), 1.0) if isinstance(a, Send) and a.message.op is Op.MESH]


def test_routes_name_only_the_ids_others_present_to_that_member() -> None:
    m = machine(mesh="mesh", fan_out=1)  # a chain: 1 under the controller, 2 under 1, 3 under 2
    sent: list[tuple[int, dict]] = []
    for i in (1, 2, 3):
        node_id, actions = join(m, i, 0.2 * i)
        actions += m.handle(Tick(), 0.2 * i + 0.1)  # the others hear of it at the next tick
        for a in actions:
            if isinstance(a, Reply) and a.message.op is Op.JOIN_REPLY:
                sent.append((node_id, a.message["routes"]))
            if isinstance(a, Send) and a.message.op is Op.MESH:
                sent.append((a.to, a.message["routes"]))
    assert (2, {0: link_id(CTRL_SESSION, 2).hex(), 1: link_id(session_of(1), 2).hex(),
                3: link_id(session_of(3), 2).hex()}) in sent
    for member, routes in sent:  # every id a member learns is one presented TO IT
        senders = {0: CTRL_SESSION, 1: session_of(1), 2: session_of(2), 3: session_of(3)}
        assert routes == {k: link_id(senders[k], member).hex() for k in routes}


def test_a_join_burst_sends_each_member_a_mesh_per_interval_not_per_join() -> None:
    m = machine(mesh="mesh", fan_out=8, max_pending_joins=1024, join_rate_per_s=5000.0)
    meshes: dict[int, int] = {}
    t = 0.0
    for i in range(1, 201):  # 200 joins within one second, ticks every 50 ms
        t = i * 0.005
        join(m, i, t)
        if i % 10 == 0:
            for a in m.handle(Tick(), t):
                if isinstance(a, Send) and a.message.op is Op.MESH:
                    meshes[a.to] = meshes.get(a.to, 0) + 1
                    assert a.message["version"] == m.mesh.version
    assert len(m.mesh) == 200 and max(meshes.values()) <= 11  # one per 0.1 s at most, not 199
    for a in m.handle(Tick(), t + 1.0):  # everyone ends on the last version, sent once
        if isinstance(a, Send) and a.message.op is Op.MESH:
            meshes[a.to] = meshes.get(a.to, 0) + 1
    assert not any(isinstance(a, Send) and a.message.op is Op.MESH for a in m.handle(Tick(), t + 2.0))
    assert m._announcer.sent == {n: m.mesh.version for n in m.member_ids()}  # noqa: SLF001


def test_a_new_member_is_announced_to_the_others_before_its_catch_up_and_its_updates() -> None:
    m = machine()
    join(m, 1, 0.0)
    m.handle(Tick(), 0.0)  # the first broadcast (member 1 had its mesh in the reply: nothing to send)
    join(m, 2, 0.01)
    ask = Message(Op.PARAMS_REQUEST, {"request_id": 1, "want_updater": False}, src=2)
    assert m.handle(Received(ask, rid_of(2)), 0.02) == []  # member 1 has not heard of 2 yet: it waits
    assert not any(isinstance(a, Download) for a in m.handle(Tick(), 0.05))
    actions = [a for a in m.handle(Tick(), 0.1) if isinstance(a, (Send, Download))]
    kinds = [(type(a).__name__, a.to, a.message.op) for a in actions]
    assert kinds[:2] == [("Send", 1, Op.MESH), ("Download", 2, Op.PARAMS_REPLY)]
    # a member that sends before the others heard of it (no catch-up): the mesh goes out first
    join(m, 3, 0.12)
    actions = m.handle(Received(update(3, 3, 1), rid_of(3)), 0.13)
    ops = [(a.to, a.message.op) for a in actions if isinstance(a, Send)]
    for member in (1, 2):
        assert ops.index((member, Op.MESH)) < ops.index((member, Op.UPDATES))


def test_a_member_is_accepted_only_on_the_connection_it_joined_from() -> None:
    m = machine()
    join(m, 1, 0.0)
    assert m.handle(Received(beat(1), b"\x99" * 16), 0.5) == []
    assert rejected(m, "bad_sender") == 1
    assert m.node_stats()[0]["stats"] == BEAT_BASELINE  # the forged beat changed nothing: what the join set
    m.handle(Received(update(1, 1, 1), b"\x99" * 16), 0.6)
    assert rejected(m, "bad_sender") == 2 and m.counters["updates_applied"] == 0
    # its token from another connection, and a session whose id the connection does not present
    assert join(m, 1, 0.7, rid=b"\x98" * 16) == (None, []) and rejected(m, "bad_sender") == 3
    assert join(m, 5, 0.7, rid=rid_of(6)) == (None, []) and rejected(m, "bad_sender") == 4
    assert 5 not in m.mesh and m.counters["joins"] == 1
    m.handle(Received(beat(1), rid_of(1)), 0.8)
    assert m.node_stats()[0]["stats"] == {"x": 1}


def test_an_update_is_applied_once_and_relayed_to_every_other_member() -> None:
    m = machine()
    for i in (1, 2, 3):
        join(m, i, 0.0)
    msg = update(1, 1, 1, index=5)
    actions = m.handle(Received(msg, rid_of(1)), 0.1)
    relays = [a for a in actions if isinstance(a, Send)]
    assert sorted(a.to for a in relays) == [2, 3] and all(a.droppable for a in relays)
    assert m.params[5] == pytest.approx(0.5) and m.counters["updates_applied"] == 1
    assert m.handle(Received(msg, rid_of(1)), 0.2) == []  # a duplicate: dropped, not applied again
    assert m.counters["duplicates_dropped"] == 1 and m.params[5] == pytest.approx(0.5)
    assert m.counters.snapshot()["applied_by_origin"] == {1: 1}
    # a copy dropped for a full queue is counted, and the member's snapshots are no longer shared
    m.handle(Dropped(2, 1), 0.3)
    assert m.counters["updates_dropped_backpressure"] == 1 and m.counters["updates_relayed"] == 1


def test_an_update_from_a_stranger_is_refused_and_it_is_told_to_rejoin() -> None:
    m = machine()
    join(m, 1, 0.0)
    actions = m.handle(Received(update(7, 7, 1), b"\x97" * 16), 0.1)
    assert [a.message.op for a in actions] == [Op.EVICTED]
    assert rejected(m, "bad_sender") == 1 and m.counters["updates_applied"] == 0
    # a member may not pass another member's update off as its own or relay an unknown origin's
    join(m, 2, 0.0)
    m.handle(Received(update(1, 2, 1), rid_of(1)), 0.2)
    m.handle(Received(update(1, 99, 1), rid_of(1)), 0.2)
    assert rejected(m, "bad_origin") == 2 and m.counters["updates_applied"] == 0


def test_a_silent_member_goes_offline_after_missed_beats_and_the_others_hear_of_it() -> None:
    m = machine()
    join(m, 1, 0.0)
    join(m, 2, 0.0)
    t = 0.0
    removed_at = None
    while t < 5.0:
        t = round(t + 0.25, 2)
        m.handle(Received(beat(2), rid_of(2)), t)  # node 2 beats, node 1 is silent
        actions = m.handle(Tick(), t)
        if Disconnect(1, 0.0) in actions:
            removed_at = t
            assert [a.to for a in actions if isinstance(a, Send) and a.message.op is Op.MESH] == [2]
    assert removed_at is not None and 3.0 < removed_at <= 3.5
    assert 1 not in m.mesh and 2 in m.mesh and m.counters["offline"] == 1


def test_a_tick_after_the_controller_itself_was_frozen_evicts_nobody() -> None:
    m = machine()
    join(m, 1, 0.0)
    m.handle(Tick(), 0.5)
    actions = m.handle(Tick(), 20.0)  # 19.5 s without a tick: this process was frozen, not node 1
    assert not any(isinstance(a, Disconnect) for a in actions) and 1 in m.mesh
    t = 20.0
    while 1 in m.mesh and t < 30.0:  # still silent afterwards: counted from the end of the freeze
        t += 0.5
        m.handle(Tick(), t)
    assert 1 not in m.mesh and 23.0 < t <= 23.5


def test_beats_go_both_ways_liveness_as_a_reply_watermarks_on_the_data_path() -> None:
    m = machine()
    join(m, 1, 0.0)
    m.handle(Received(update(1, 1, 1), rid_of(1)), 0.1)
    actions = m.handle(Tick(), 0.2)
    alive = [a for a in actions if isinstance(a, Reply)]
    data = [a for a in actions if isinstance(a, Send)]
    assert alive[0].routing_id == rid_of(1) and alive[0].message["watermark"] == {}
    assert data[0].to == 1 and data[0].message["watermark"] == {1: 1}
    assert not any(isinstance(a, (Reply, Send)) for a in m.handle(Tick(), 0.7))  # not due yet


def test_admission_control_bounds_pending_joins_the_rate_and_the_members() -> None:
    m = machine(max_pending_joins=2)
    assert join(m, 1, 0.0)[0] == 1 and join(m, 2, 0.0)[0] == 2
    assert join(m, 3, 0.0) == (None, []) and rejected(m, "join_refused") == 1
    m.handle(Received(beat(1), rid_of(1)), 0.1)  # heard: no longer pending
    assert join(m, 3, 0.1)[0] == 3

    m = machine(join_rate_per_s=2.0)
    assert [join(m, i, 0.0)[0] for i in (1, 2, 3)] == [1, 2, None]  # a burst of 2, then 2 per second
    assert join(m, 3, 0.2)[0] is None and join(m, 3, 0.6)[0] == 3
    assert rejected(m, "join_refused") == 2

    m = machine(max_nodes=1)
    assert join(m, 1, 0.0)[0] == 1 and join(m, 2, 0.0)[0] is None


def test_a_departed_origins_state_is_pruned_after_departed_kept_s() -> None:
    m = machine(departed_kept_s=5.0)
    join(m, 1, 0.0)
    join(m, 2, 0.0)
    m.handle(Received(update(1, 1, 1), rid_of(1)), 0.1)
    leave = Message(Op.LEAVE, {"reason": "done"}, src=1)
    assert Disconnect(1, 0.0) in m.handle(Received(leave, rid_of(1)), 0.2)
    m.handle(Received(update(2, 1, 2, index=3), rid_of(2)), 1.0)  # a late copy, relayed: still counts
    assert m.counters["updates_applied"] == 2 and m.retiring() == [1]
    t = 1.0
    while t < 7.0:
        t += 0.5
        m.handle(Received(beat(2), rid_of(2)), t)
        m.handle(Tick(), t)
    assert m.retiring() == [] and 1 not in m.seen.origins()
    beats = [a for a in m.handle(Tick(), 8.0) if isinstance(a, Send)]
    assert beats and 1 not in beats[0].message["watermark"]
    m.handle(Received(update(2, 1, 3), rid_of(2)), 8.1)  # ids are never reused: refused
    assert rejected(m, "bad_origin") == 1 and m.counters["updates_applied"] == 2


def test_a_departed_origins_gaps_are_given_up_so_beats_cover_what_the_master_holds() -> None:
    m = machine(departed_kept_s=30.0)  # beats 1 s x 3 missed: gaps given up 2 x 3 s after it left
    join(m, 1, 0.0)
    join(m, 2, 0.0)
    for seq in (1, 3, 4):  # its update 2 never reached the master
        m.handle(Received(update(1, 1, seq, index=seq), rid_of(1)), 0.1)
    m.handle(Received(Message(Op.LEAVE, {"reason": "done"}, src=1), rid_of(1)), 0.2)
    ask = Message(Op.PARAMS_REQUEST, {"request_id": 1, "want_updater": False}, src=2)
    before = [a for a in m.handle(Received(ask, rid_of(2)), 0.3) if isinstance(a, Download)][0]
    before.token.sent()
    watermarks = []
    t = 0.2
    while t < 8.0:
        t = round(t + 0.5, 2)
        m.handle(Received(beat(2), rid_of(2)), t)
        watermarks += [a.message["watermark"] for a in m.handle(Tick(), t)
                       if isinstance(a, Send) and a.message.op is Op.HEARTBEAT]
    assert watermarks[0] == {1: 1} and watermarks[-1] == {1: 4}  # a node missing 3 or 4 sees it is behind
    assert m.counters["departed_gaps_closed"] == 1 and m.retiring() == [1]
    # the snapshot taken before says {1: 1}: it is not handed out again (its taker would stay behind)
    again = [a for a in m.handle(Received(ask, rid_of(2)), t) if isinstance(a, Download)][0]
    assert before.message["watermark"] == {1: 1} and again.message["watermark"] == {1: 4}
    # a download says which seqs were given up: the process that held id 1 sends those it still has
    # again under its new id (the master never held them and refuses (1, 2) now)
    assert not before.message["given_up"] and again.message["given_up"] == {1: [2]}
    m.handle(Received(update(2, 1, 2), rid_of(2)), t)  # a copy of 2 after all: too late, not applied
    assert m.counters["updates_applied"] == 3
    # node 2 re-sends 1's update 6 it holds (5 never arrived anywhere): applied, and the gap below it is
    # given up at once, so the beats say 6 and a node that lacks 6 (the relay stops at nodes that hold
    # it in MESH mode) sees that it is behind
    m.handle(Received(update(2, 1, 6, index=6), rid_of(2)), t)
    assert m.counters["updates_applied"] == 4 and m.counters["departed_gaps_closed"] == 2
    beats = [a.message["watermark"] for a in m.handle(Tick(), t + 1.0)
             if isinstance(a, Send) and a.message.op is Op.HEARTBEAT]
    assert beats and beats[0] == {1: 6}
    last = [a for a in m.handle(Received(ask, rid_of(2)), t + 1.0) if isinstance(a, Download)][0]
    assert last.message["given_up"] == {1: [2, 5]}


def test_a_rejoined_process_gets_its_old_ids_gaps_kept_open_as_long_again() -> None:
    """The gaps of an id whose process joined again wait two liveness timeouts from the rejoin: its
    catch-up re-sends what the master lacks under the old (origin, seq), accepted until then."""
    m = machine(departed_kept_s=30.0)  # gaps given up 2 x 3 s after a departure
    join(m, 1, 0.0, name="p")
    for seq in (1, 3):  # 2 is lost on its way up
        m.handle(Received(update(1, 1, seq, index=seq), rid_of(1)), 0.1)
    m.handle(Received(Message(Op.LEAVE, {"reason": "cut off"}, src=1), rid_of(1)), 0.2)
    join(m, 2, 5.0, name="p")  # the same process, back under a new id before the gap was given up
    t = 5.0
    while t < 10.5:
        t = round(t + 0.5, 2)
        m.handle(Received(beat(2), rid_of(2)), t)
        m.handle(Tick(), t)
    assert m.counters["departed_gaps_closed"] == 0  # 6.2 s after the departure, 5.5 s after the rejoin
    m.handle(Received(update(2, 1, 2, index=2), rid_of(2)), t)  # its re-send under the old id
    assert m.counters["updates_applied"] == 3 and m.seen.watermark()[1] == 3


def test_a_params_request_is_a_paced_download_of_one_shared_snapshot() -> None:
    m = machine()
    join(m, 1, 0.0)
    join(m, 2, 0.0)
    m.handle(Received(update(1, 1, 1, index=9), rid_of(1)), 0.1)
    ask = Message(Op.PARAMS_REQUEST, {"request_id": 4, "want_updater": False}, src=1)
    downloads = [a for a in m.handle(Received(ask, rid_of(1)), 0.2) if isinstance(a, Download)]
    assert len(downloads) == 1 and downloads[0].to == 1
    reply = downloads[0].message
    assert reply.op is Op.PARAMS_REPLY and reply["request_id"] == 4 and reply["watermark"] == {1: 1}
    assert np.array_equal(reply.buffers[0], m.params) and reply.buffers[0] is not m.params
    ask2 = Message(Op.PARAMS_REQUEST, {"request_id": 1, "want_updater": False}, src=2)
    second = [a for a in m.handle(Received(ask2, rid_of(2)), 0.3) if isinstance(a, Download)][0]
    assert second.message.buffers[0] is reply.buffers[0]  # the master did not change: shared
    assert m.counters["downloads_new_snapshot"] == 1 and m.counters["downloads_shared"] == 1
    downloads[0].token.sent()
    second.token.sent()
    m.handle(Received(update(1, 1, 2), rid_of(1)), 0.4)
    m.handle(Tick(), 0.5)  # read by nobody and the master moved on: the snapshot is freed
    assert m._downloads.current is None  # noqa: SLF001


def test_stopping_says_shutdown_to_every_member_then_stops() -> None:
    m = machine()
    join(m, 1, 0.0)
    join(m, 2, 0.0)
    actions = m.handle(Stopping(), 1.0)
    assert [(a.to, a.message.op) for a in actions[:-1]] == [(1, Op.SHUTDOWN), (2, Op.SHUTDOWN)]
    assert actions[-1] == Stop()


def test_the_same_events_give_the_same_actions() -> None:
    def run() -> list[str]:
        m = machine(mesh="mesh", fan_out=2)
        out = []
        for i in range(1, 8):
            out += [repr(a) for a in join(m, i, 0.1 * i)[1]]
        for t in range(1, 12):
            out += [repr(a) for a in m.handle(Received(update(1, 1, t, t), rid_of(1)), t + 0.01)]
            out += [repr(a) for a in m.handle(Tick(), t + 0.5)]
        return out

    assert run() == run()


def test_a_process_joining_again_keeps_its_former_id_counted_for_its_re_sends() -> None:
    """Node 1 (name "w") is dropped without having had an update applied; its origin is in the
    watermarks while it retires. Its process joins again as 2 at t=4: the old id stays counted
    departed_kept_s from then, so a re-send under it at t=8 (past 5 s from its departure) is applied once."""
    m = machine(departed_kept_s=5.0)
    join(m, 1, 0.0, name="w")
    m.handle(Received(Message(Op.LEAVE, {"reason": "cut off"}, src=1), rid_of(1)), 0.5)
    beats = [a for a in m.handle(Tick(), 1.0) if isinstance(a, Send) and a.message.op is Op.HEARTBEAT]
    assert m.retiring() == [1] and all(b.message["watermark"].get(1) == 0 for b in beats)
    join(m, 2, 4.0, name="w")
    for t in (5.0, 6.0, 7.0, 8.0):
        m.handle(Received(beat(2), rid_of(2)), t)
        m.handle(Tick(), t)
    assert m.retiring() == [1]
    m.handle(Received(update(2, 1, 1), rid_of(2)), 8.0)
    m.handle(Received(update(2, 1, 1), rid_of(2)), 8.1)  # twice: applied once
    assert m.counters["updates_applied"] == 1 and m.seen.watermark()[1] == 1


def test_given_up_seqs_are_kept_per_departed_id_told_to_its_process_only_and_bounded() -> None:
    from psrv.server.departed import GIVEN_UP_MAX, DepartedMembers

    d = DepartedMembers()
    d.add(1, 0.0)
    d.add(2, 1.0)
    d.gave_up(1, [4, 2])
    d.gave_up(1, [2, 9])  # given up again after a late re-send: merged, sorted
    d.gave_up(2, list(range(1, GIVEN_UP_MAX + 10)))
    d.gave_up(7, [1])  # not retiring: nothing kept
    assert d.given_up[1] == [2, 4, 9] and len(d.given_up[2]) == GIVEN_UP_MAX and 7 not in d.given_up
    assert d.given_up_view(lambda i: i == 1) == {1: [2, 4, 9]}
    both = d.given_up_view(lambda i: True)  # newest departure first, GIVEN_UP_MAX seqs in all
    assert list(both) == [2] and len(both[2]) == GIVEN_UP_MAX
    assert d.expired(100.0, 30.0) == [1, 2] and d.given_up == {}
