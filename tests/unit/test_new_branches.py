"""A member placed under a new parent (MESH) misses nothing its parent handled before it knew the member:
the controller's direct copies for a few beats (server/new_branches.py), the member forwarding them only
downwards (MeshOrganizer.relay_targets), and the updates that raced its join reply held, not dropped
(NodeMachine). The simulation (tests/sim/test_real.py) checks that such joins no longer re-sync."""

from __future__ import annotations

import numpy as np
from psrv.server.mesh import MeshOrganizer
from psrv.server.new_branches import NewBranches
from psrv.server.node_machine import NodeState
from psrv.server.updates import unbatch
from psrv.transport.events import Received, Send, Tick
from psrv.transport.messages import Message, Op

from tests.unit.test_controller_machine import join, machine, rid_of
from tests.unit.test_controller_machine import update as ctrl_update
from tests.unit.test_node_machine import CTRL_RID, Harness, delta, rid, update


def chain(n: int) -> MeshOrganizer:
    """1 under the controller, 2 under 1, ... (fan-out 1)."""
    mesh = MeshOrganizer("mesh", 1)
    for node_id in range(1, n + 1):
        mesh.add_node(node_id, f"127.0.0.1:{7000 + node_id}")
    return mesh


def test_a_member_under_a_node_gets_copies_for_its_window_and_not_of_its_own_subtree() -> None:
    mesh = chain(3)
    branches = NewBranches(window_s=3.0)
    branches.placed([1, 2], mesh, now=10.0)
    assert branches.until == {2: 13.0}  # 1 is the controller's child: it gets every relay anyway
    # origins 1 and 3 (3 is below 2: it passed through 2 on its way up), from node 1
    assert branches.targets([1, 3, 7], came_from=1, mesh=mesh, now=12.0) == [(2, [0, 2])]
    assert branches.targets([2], came_from=1, mesh=mesh, now=12.0) == []  # its own
    assert branches.targets([3], came_from=2, mesh=mesh, now=12.0) == []  # from the member itself
    assert branches.targets([1], came_from=1, mesh=mesh, now=13.5) == []  # the window ended
    assert branches.until == {}
    branches.placed([3], mesh, now=20.0)
    branches.forget(3)
    assert branches.targets([1], came_from=1, mesh=mesh, now=20.5) == []


def test_a_copy_from_the_controller_to_a_node_below_the_top_goes_only_down() -> None:
    mesh = chain(3)
    assert mesh.relay_targets(2, came_from=0) == (3,)  # not back up to 1: everything above holds it
    assert mesh.relay_targets(3, came_from=0) == ()
    assert mesh.relay_targets(1, came_from=0) == (2,)  # the controller's child: as before
    assert mesh.relay_targets(2, came_from=1) == (3,) and mesh.relay_targets(2, came_from=3) == (1,)


def sends_to(actions: list, target: int) -> list[tuple[int, int]]:
    return [(f["origin"], f["seq"]) for a in actions if isinstance(a, Send) and a.to == target
            and a.message.op in (Op.UPDATE, Op.UPDATES) for f, _ in unbatch(a.message)]


def test_the_controller_sends_a_new_member_what_it_applies_for_a_few_beats() -> None:
    m = machine(mesh="mesh", fan_out=1)  # 1 beat = 1 s, 3 missed beats: a 3 s window
    assert join(m, 1, 0.1)[0] == 1
    assert join(m, 2, 0.2)[0] == 2 and m.mesh.parent(2) == 1
    # node 1's own update, applied after node 2's download: the controller relays it to nobody (1 is
    # its only child, and sent it), so node 2 gets it straight from here
    actions = m.handle(Received(ctrl_update(1, 1, 1), rid_of(1)), 1.0)
    assert sends_to(actions, 2) == [(1, 1)]
    assert m.counters.snapshot()["updates_to_new_branches"] == 1
    # node 2's own update, up through node 1: not sent back to it
    assert sends_to(m.handle(Received(ctrl_update(1, 2, 1), rid_of(1)), 1.5), 2) == []
    # after the window: only the tree carries it
    assert sends_to(m.handle(Received(ctrl_update(1, 1, 2), rid_of(1)), 3.5), 2) == []


def test_a_member_moved_under_another_node_gets_copies_too() -> None:
    m = machine(mesh="mesh", fan_out=1)
    for i in (1, 2, 3):
        join(m, i, 0.1 * i)
    late = 10.0  # every join window is over
    assert sends_to(m.handle(Received(ctrl_update(1, 1, 1), rid_of(1)), late), 3) == []
    m.handle(Received(Message(Op.LEAVE, {"reason": "done"}, src=2), rid_of(2)), late + 0.1)
    assert m.mesh.parent(3) == 1  # 2's child moved under 1
    assert sends_to(m.handle(Received(ctrl_update(1, 1, 2), rid_of(1)), late + 0.5), 3) == [(1, 2)]


def test_an_update_that_raced_the_join_reply_is_held_and_applied_once() -> None:
    h = Harness("mesh", fan_out=1)
    h.start()
    h.add(1)  # node 1 under the controller, the new node 2 under node 1
    h.routes[1] = rid(1).hex()
    # the controller's copy of node 1's update reaches the new node 2 before its join reply does
    h.handle(Received(update(1, 1, index=5, src=0), routing_id=CTRL_RID))
    counters = h.machine.counters_.snapshot()
    assert counters["held_while_joining"] == 1 and counters.get("ignored_while_joining", 0) == 0
    h.join(2)
    assert h.machine.state is NodeState.SYNCING and h.mesh.parent(2) == 1
    h.catch_up(watermark={})  # the master copy does not hold it yet
    assert h.machine.state is NodeState.RUNNING
    assert np.array_equal(h.params, delta(5))  # applied once, after the download
    h.from_node(update(1, 1, index=5), 1)  # the parent's copy, late: a duplicate
    assert np.array_equal(h.params, delta(5))
    assert h.machine.counters_.snapshot()["duplicates_dropped"] == 1


def test_an_update_held_while_joining_from_a_sender_never_announced_is_dropped_quietly() -> None:
    h = Harness("mesh", fan_out=1, heartbeat_s=0.1)
    h.start()
    h.add(1)
    h.handle(Received(update(9, 1, src=9), routing_id=rid(9)))
    h.join(2)
    h.catch_up()
    h.handle(Tick(), dt=5.0)  # longer than the waiting room's patience
    counters = h.machine.counters_.snapshot()
    assert counters["ignored_while_joining"] == 1 and h.rejected("bad_sender") == 0
    assert not h.params.any()
