"""NodeMachine: who may send what. A forged sender, controller-only ops from a member, our own origin
coming back, relays across subtrees and rows from members the node's mesh does not know yet (driven by
events alone, as in test_node_machine.py), and what it refuses outright: a mesh naming a bad address, an
update of a ragged length."""

from __future__ import annotations

import numpy as np
from psrv.server.node_machine import NodeState
from psrv.transport.errors import ControllerLostError
from psrv.transport.events import Stop, Tick
from psrv.transport.messages import Message, Op
from test_node_machine import Harness, delta, joined, rid, update

# ---------------------------------------------------------------------------------- identity


def test_a_forged_sender_is_refused_and_counted():
    h = joined(others=(2, 3))
    h.from_node(update(2, 1), 3)  # claims node 2 on node 3's connection
    assert h.rejected("bad_sender") == 1 and not h.params.any()


def test_controller_only_ops_count_only_from_the_controller():
    h = joined(others=(2,))
    actions = h.from_node(Message(Op.SHUTDOWN, {"reason": "forged"}, src=2), 2)
    assert actions == [] and h.rejected("bad_sender") == 1
    actions = h.from_node(Message(Op.EVICTED, {"reason": "forged", "node_id": 1}, src=2), 2)
    assert h.machine.state is NodeState.RUNNING and h.rejected("bad_sender") == 2
    # the real one stops the node
    actions = h.from_ctrl(Message(Op.SHUTDOWN, {"reason": "done"}, src=0))
    assert isinstance(actions[-1], Stop) and isinstance(actions[-1].error, ControllerLostError)


def test_an_update_of_our_own_origin_is_refused_at_once():
    h = joined(others=(2,))
    h.from_ctrl(update(1, 5, src=0))
    assert h.rejected("bad_origin") == 1 and not h.params.any()


def test_a_child_may_not_relay_updates_of_another_subtree():
    h = Harness("mesh", fan_out=2)
    h.join(1, others=(2, 3, 4))
    h.catch_up()
    h.from_node(update(2, 1, src=3), 3)  # node 2 is not in node 3's subtree
    assert h.machine.counters_["held_stale_mesh"] == 1  # maybe our view is old: held, not applied
    h.handle(Tick(), dt=5.0)  # no newer mesh within the patience: refused, counted
    assert h.rejected("bad_origin") == 1 and not h.params.any()


def test_updates_from_a_sender_not_announced_yet_wait_for_the_mesh():
    h = joined()
    h.from_node(update(5, 1, index=2), 5)  # node 5 joined; our MESH naming it is late
    assert not h.params.any() and h.machine.counters_["held_unknown_sender"] == 1
    h.mesh_update(5)
    np.testing.assert_array_equal(h.params, delta(2))
    h.from_node(update(6, 1, index=2), 6)  # never announced: refused after the patience
    h.handle(Tick(), dt=5.0)
    assert h.rejected("bad_sender") == 1


def test_a_row_from_a_member_our_older_mesh_lacks_waits_for_the_newer_mesh():
    h = joined(others=(2,))
    # node 9 joined; the controller relays its update before our MESH naming it arrives
    h.from_ctrl(update(9, 1, index=6, src=0))
    assert not h.params.any() and h.machine.counters_["held_stale_mesh"] == 1
    assert h.rejected("bad_origin") == 0
    h.add(8)  # (ids are placed in order; 9 needs 8 first)
    actions = h.mesh_update(9)
    np.testing.assert_array_equal(h.params, delta(6))
    assert not h.sent(actions, Op.UPDATES)  # plain: no neighbour below us to relay to
    # applied once: the same row again is a duplicate
    h.from_ctrl(update(9, 1, index=6, src=0))
    np.testing.assert_array_equal(h.params, delta(6))
    assert h.machine.counters_["duplicates_dropped"] == 1


def test_the_stale_mesh_room_is_bounded():
    h = joined()
    for seq in range(1, 1100):
        h.from_ctrl(update(50, seq, src=0))
    assert h.machine.counters_["held_stale_mesh"] == 1024
    assert h.rejected("bad_origin") == 1099 - 1024
    h.handle(Tick(), dt=5.0)
    assert h.rejected("bad_origin") == 1099


def test_a_mesh_naming_a_bad_address_changes_nothing():
    h = Harness("mesh", fan_out=2)
    h.join(1, others=(2,))
    h.catch_up()
    version, routes = h.machine.mesh.version, dict(h.machine.view.routes.current)
    h.mesh.add_node(3, "not an address")  # node 3 becomes node 1's child
    h.routes[3] = rid(3).hex()
    actions = h.from_ctrl(Message(Op.MESH, {"mesh": h.mesh.to_dict(), "version": h.mesh.version,
                                            "routes": dict(h.routes)}, src=0))
    assert actions == [] and h.rejected("bad_field") == 1
    assert h.machine.mesh.version == version and h.machine.view.routes.current == routes


def test_an_update_of_a_ragged_length_is_a_counted_rejection():
    h = joined(others=(2,))
    ragged = update(2, 1)
    ragged.buffers = [b"\x01\x02\x03"]
    assert h.from_node(ragged, 2) == [] and h.rejected("bad_payload") == 1
    h.from_node(update(2, 1, index=8), 2)  # the real one still counts
    np.testing.assert_array_equal(h.params, delta(8))
