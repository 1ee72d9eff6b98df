"""A departed member's updates that reached this node but never the master (MESH): the node re-sends
them to the controller (server/node_repairs.py), driven by events only like test_node_machine.py."""

from __future__ import annotations

import numpy as np
from psrv.server.node_machine import NodeState
from psrv.transport.messages import Message, Op
from test_node_machine import Harness, delta, joined, rows, update


def _leaves(h: Harness, node_id: int) -> None:
    """The controller removes ``node_id`` and announces the new mesh."""
    h.mesh.remove_node(node_id)
    h.routes.pop(node_id, None)
    h.from_ctrl(Message(Op.MESH, {"mesh": h.mesh.to_dict(), "version": h.mesh.version,
                                  "routes": dict(h.routes)}, src=0))


def test_a_departed_members_updates_the_master_lacks_are_sent_to_the_controller():
    """MESH: node 2's updates reached this node but died on their way up, and 2 departed before it could
    re-send them (simulation seed 400041): this node sends what it holds above the controller's stuck
    watermark for 2 straight to the controller, once per quiet period, and stops once it moved."""
    h = joined("mesh", others=(2, 3, 4))
    for seq in (1, 2, 3):
        h.from_node(update(2, seq, index=seq), 2)
    assert np.allclose(h.params, delta(1) + delta(2) + delta(3))
    _leaves(h, 2)
    actions = []
    for _ in range(3):  # the controller heard nothing of 2 at all: its watermark has no entry for it
        actions += h.beat({1: 0})
    again = h.sent(actions, Op.UPDATES, 0) + h.sent(actions, Op.UPDATE, 0)
    assert sorted(r for s in again for r in rows(s)) == [(2, 1), (2, 2), (2, 3)]
    assert h.machine.counters_["departed_resent"] == 3
    actions = h.beat({1: 0, 2: 1}) + h.beat({1: 0, 2: 1})  # it applied 1 only: within the quiet period
    assert not h.sent(actions, Op.UPDATES, 0) + h.sent(actions, Op.UPDATE, 0)
    actions = h.beat({1: 0, 2: 1}, dt=3.1)  # still stuck after the quiet period: what it lacks, again
    again = h.sent(actions, Op.UPDATES, 0) + h.sent(actions, Op.UPDATE, 0)
    assert sorted(r for s in again for r in rows(s)) == [(2, 2), (2, 3)]
    actions = [a for _ in range(4) for a in h.beat({1: 0, 2: 3}, dt=3.1)]  # the master holds them all
    assert not h.sent(actions, Op.UPDATES, 0) + h.sent(actions, Op.UPDATE, 0)
    assert h.machine.state is NodeState.RUNNING


def test_a_live_members_updates_are_left_to_it():
    h = joined("mesh", others=(2, 3, 4))
    for seq in (1, 2):
        h.from_node(update(2, seq, index=seq), 2)
    actions = [a for _ in range(4) for a in h.beat({1: 0}, dt=3.1)]  # 2 is a member: it re-sends its own
    assert not h.sent(actions, Op.UPDATES, 0) + h.sent(actions, Op.UPDATE, 0)
