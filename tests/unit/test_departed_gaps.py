"""A departed id's gaps wait for its process's catch-up: the controller driven by events alone.

Beats of 1 s x 3 missed: a gap is given up 2 x 3 s after its id departed, or after its process joined
again; while that process catches up (no heartbeat saying ``running`` yet) the gap is held, at most
half of ``departed_kept_s`` (30 s here) from the rejoin."""

from __future__ import annotations

from psrv.server.departed import DepartedMembers
from psrv.transport.events import Received, Tick
from psrv.transport.messages import Message, Op
from test_controller_machine import join, machine, rid_of, update


def heartbeat(src: int, state: str) -> Message:
    return Message(Op.HEARTBEAT, {"mesh_version": 0, "stats": {"state": state}, "watermark": {}}, src=src)


def lost_update_then_left(m, name: str = "p") -> None:
    """Node 1 (``name``) sends updates 1 and 3 (2 is lost on its way up), then leaves at 0.2 s."""
    join(m, 1, 0.0, name=name)
    for seq in (1, 3):
        m.handle(Received(update(1, 1, seq, index=seq), rid_of(1)), 0.1)
    m.handle(Received(Message(Op.LEAVE, {"reason": "cut off"}, src=1), rid_of(1)), 0.2)


def run_until(m, member: int, start: float, end: float, state: str) -> float:
    t = start
    while t < end:
        t = round(t + 0.5, 2)
        m.handle(Received(heartbeat(member, state), rid_of(member)), t)
        m.handle(Tick(), t)
    return t


def test_a_gap_waits_for_the_slow_catch_up_of_its_process_then_its_re_send_is_applied() -> None:
    m = machine(departed_kept_s=30.0)
    lost_update_then_left(m)
    join(m, 2, 1.0, name="p")  # back before the gap was given up; its download takes long
    t = run_until(m, 2, 1.0, 12.0, "syncing")  # 11 s after the rejoin: over twice the 6 s
    assert m.counters["departed_gaps_closed"] == 0 and m.seen.watermark()[1] == 1
    t = run_until(m, 2, t, t + 1.0, "running")  # installed: the re-send is on its way
    m.handle(Received(update(2, 1, 2, index=2), rid_of(2)), t)  # under the old (origin, seq)
    assert m.counters["updates_applied"] == 3 and m.seen.watermark()[1] == 3
    assert m.params[1] == m.params[2] == m.params[3] != 0.0  # each once


def test_after_the_catch_up_the_gap_waits_twice_the_timeout_again_then_is_given_up() -> None:
    m = machine(departed_kept_s=30.0)
    lost_update_then_left(m)
    join(m, 2, 1.0, name="p")
    t = run_until(m, 2, 1.0, 10.0, "syncing")
    t = run_until(m, 2, t, t + 5.0, "running")  # 5 s after it reported running: still held open
    assert m.counters["departed_gaps_closed"] == 0
    run_until(m, 2, t, t + 2.0, "running")  # past 6 s: nobody re-sent it, given up
    assert m.counters["departed_gaps_closed"] == 1 and m.seen.watermark()[1] == 3


def test_a_process_that_never_catches_up_holds_the_gap_at_most_half_of_departed_kept_s() -> None:
    m = machine(departed_kept_s=30.0)
    lost_update_then_left(m)
    join(m, 2, 1.0, name="p")
    t = run_until(m, 2, 1.0, 15.5, "syncing")
    assert m.counters["departed_gaps_closed"] == 0
    run_until(m, 2, t, 17.0, "syncing")
    assert m.counters["departed_gaps_closed"] == 1


def test_a_process_back_before_its_old_id_was_noticed_gone_holds_that_id_gap_too() -> None:
    """The new id joined while the old one was still a member: the gap left when the old id goes
    offline waits for the new id's catch-up as well."""
    m = machine(departed_kept_s=30.0)
    join(m, 1, 0.0, name="p")
    for seq in (1, 3):
        m.handle(Received(update(1, 1, seq, index=seq), rid_of(1)), 0.1)
    join(m, 2, 0.5, name="p")
    t = run_until(m, 2, 0.5, 12.0, "syncing")  # node 1 goes offline after 3 s of silence
    assert 1 not in m.member_ids() and m.counters["departed_gaps_closed"] == 0
    run_until(m, 2, t, t + 1.0, "running")
    m.handle(Received(update(2, 1, 2, index=2), rid_of(2)), t + 1.0)
    assert m.counters["updates_applied"] == 3 and m.seen.watermark()[1] == 3


def test_a_gap_of_another_name_or_left_by_a_catching_up_process_is_not_held() -> None:
    m = machine(departed_kept_s=30.0)
    lost_update_then_left(m, name="p")
    join(m, 2, 1.0, name="q")  # another process: 1's gap is given up 6 s after it left
    run_until(m, 2, 1.0, 7.0, "syncing")
    assert m.counters["departed_gaps_closed"] == 1
    m = machine(departed_kept_s=30.0)
    lost_update_then_left(m, name="p")
    join(m, 2, 1.0, name="p")
    m.handle(Received(Message(Op.LEAVE, {"reason": "gone"}, src=2), rid_of(2)), 2.0)
    m.handle(Tick(), 7.5)  # it left before catching up: 1's gap waits no longer for it
    assert m.counters["departed_gaps_closed"] == 1


def test_held_gaps_are_bounded_and_forgotten_with_their_id() -> None:
    d = DepartedMembers()
    d.add(1, 0.0)
    d.add(2, 0.0)
    d.refresh(1.0, lambda i: i == 1, holder=5)
    assert d.held == {1: 5} and d.holds(5) and not d.holds(6)
    assert d.gaps_due(8.0, 6.0, 15.0) == [2]  # 1 is held, 2 is due
    assert d.gaps_due(16.5, 6.0, 15.0) == [1] and d.held == {}
    d.add(3, 20.0, holder=7)
    d.released(7)
    assert d.held == {} and d.gaps_due(26.5, 6.0, 15.0) == [3]
    d.add(4, 30.0, holder=8)
    d.caught_up(8, 40.0)  # waits 6 s from the catch-up
    assert d.held == {} and d.gaps_due(45.0, 6.0, 15.0) == [] and d.gaps_due(46.5, 6.0, 15.0) == [4]
    d.add(9, 50.0, holder=8)
    assert sorted(d.expired(200.0, 30.0)) == [1, 2, 3, 4, 9] and d.held == {}
