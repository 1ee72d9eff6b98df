"""A node that loses the controller keeps the own updates it had not acknowledged and, after its
catch-up under a new id, re-applies and re-sends those the master copy lacks under their old
(origin, seq): driven by events only, like test_node_machine.py."""

from __future__ import annotations

import numpy as np
from psrv.server.mesh import MeshOrganizer
from psrv.server.node_machine import NodeState
from psrv.transport.events import Tick
from psrv.transport.messages import Op
from test_node_machine import CTRL_RID, Harness, delta, joined, rows


def _cut_off(h: Harness) -> None:
    """The controller goes silent past its timeout: the node rejoins (a new JOIN)."""
    for _ in range(50):
        h.handle(Tick(), dt=0.1)
    assert h.machine.state is NodeState.JOINING


def _rejoin_as(h: Harness, node_id: int) -> None:
    h.mesh = MeshOrganizer("plain", controller_address="127.0.0.1:5000")
    h.routes = {0: CTRL_RID.hex()}
    h.join(node_id)


def test_unacknowledged_own_updates_are_resent_under_their_old_id_after_the_catch_up():
    h = joined()
    for index in (1, 2, 3, 4):
        h.submit(index)
    h.beat({1: 1})  # the controller holds 1/1; 1/2..1/4 died with the partition (or are in flight)
    _cut_off(h)
    _rejoin_as(h, 5)
    # the master copy holds 1/1 and 1/3 (a late copy arrived): 1/2 and 1/4 are re-applied and re-sent
    master = delta(1) + delta(3)
    reply = h.snapshot(master, {1: 1}, h.machine.download.request_id, extra={1: [3]})
    actions = h.from_ctrl(reply, own_connection=True)
    assert h.machine.state is NodeState.RUNNING
    assert np.array_equal(h.params, master + delta(2) + delta(4)), "re-applied on top of the download"
    sent = h.sent(actions, Op.UPDATES, 0) + h.sent(actions, Op.UPDATE, 0)
    assert sorted(r for s in sent for r in rows(s)) == [(1, 2), (1, 4)]
    assert h.machine.counters_["updates_resent_after_rejoin"] == 2
    assert not h.machine.all_acknowledged()
    h.beat({1: 4, 5: 0})  # the controller applied them: acknowledged
    assert h.machine.all_acknowledged()


def test_what_the_master_already_holds_is_not_resent_or_reapplied():
    h = joined()
    for index in (1, 2, 3):
        h.submit(index)
    _cut_off(h)
    _rejoin_as(h, 5)
    master = delta(1) + delta(2) + delta(3)
    actions = h.catch_up(master, watermark={1: 3})
    assert np.array_equal(h.params, master)
    assert not h.sent(actions, Op.UPDATES, 0) and not h.sent(actions, Op.UPDATE, 0)
    assert h.machine.all_acknowledged()


def test_an_old_id_the_controller_forgot_is_counted_lost_not_applied():
    h = joined()
    for index in (1, 2):
        h.submit(index)
    _cut_off(h)
    _rejoin_as(h, 5)
    actions = h.catch_up(np.zeros_like(h.params), watermark={})  # origin 1 no longer counted
    assert np.array_equal(h.params, np.zeros_like(h.params)), "the replica stays equal to the master"
    assert not h.sent(actions, Op.UPDATES, 0) and not h.sent(actions, Op.UPDATE, 0)
    assert h.machine.counters_["own_updates_lost"] == 2


def test_own_updates_the_controller_gave_up_are_sent_again_under_the_new_id_once():
    h = joined()
    for index in (1, 2, 3):
        h.submit(index)
    h.beat({1: 1})  # 1/2 was lost on its way up, 1/3 arrived after the node was cut off
    _cut_off(h)
    _rejoin_as(h, 5)
    # the controller gave 1/2 up (its watermark covers it; the master never held it)
    master = delta(1) + delta(3)
    reply = h.snapshot(master, {1: 3}, h.machine.download.request_id, given_up={1: [2]})
    actions = h.from_ctrl(reply, own_connection=True)
    assert h.machine.state is NodeState.RUNNING
    assert np.array_equal(h.params, master + delta(2)), "applied once on top of the download"
    sent = [r for s in h.sent(actions, Op.UPDATES, 0) + h.sent(actions, Op.UPDATE, 0) for r in rows(s)]
    assert len(sent) == 1 and sent[0][0] == 5, sent  # a new update of the new id, not (1, 2)
    assert h.machine.counters_["updates_renumbered_after_rejoin"] == 1
    assert h.machine.counters_["own_updates_lost"] == 0
    # a later re-sync (the same given-up list) sends nothing again and counts nothing lost
    h.machine.sync.begin("test")
    again = h.from_ctrl(h.snapshot(master + delta(2), {1: 3, 5: sent[0][1]}, h.machine.download.request_id,
                                   given_up={1: [2]}), own_connection=True)
    assert not h.sent(again, Op.UPDATES, 0) and not h.sent(again, Op.UPDATE, 0)
    assert np.array_equal(h.params, master + delta(2))
    assert h.machine.counters_["updates_renumbered_after_rejoin"] == 1
    assert h.machine.counters_["own_updates_lost"] == 0
