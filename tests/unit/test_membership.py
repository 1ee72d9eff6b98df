"""Heartbeat and offline policy stepped with a fake clock (no sockets, no sleeping)."""

from __future__ import annotations

import pytest
from psrv.transport.membership import ControllerWatch, HeartbeatTimer, Membership, NodeState


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def step(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_offline_after_three_missed_beats_not_before_and_exactly_once(clock):
    m = Membership(heartbeat_s=1.0, missed_beats=3, clock=clock)
    m.joined(1)
    m.joined(2)
    for _ in range(24):  # 2 keeps beating every 0.125 s (exact in binary), 1 is silent
        clock.step(0.125)
        m.heard(2)
        assert m.expire() == []
        assert m.state(1) is NodeState.ONLINE
    clock.step(0.05)  # 1 silent for 3.05 s > 3 beats
    m.heard(2)
    assert m.expire() == [1]
    assert m.state(1) is NodeState.OFFLINE and m.state(2) is NodeState.ONLINE
    clock.step(10)
    assert m.expire() == [2]  # 2 went silent too; 1 is not reported again
    assert m.expire() == []
    assert m.online() == []


def test_exactly_at_the_limit_is_still_online(clock):
    m = Membership(heartbeat_s=0.5, missed_beats=4, clock=clock)
    m.joined(7)
    clock.step(2.0)  # exactly 4 beats of 0.5 s
    assert m.expire() == []
    clock.step(1e-6)
    assert m.expire() == [7]


def test_any_message_keeps_a_node_alive(clock):
    m = Membership(clock=clock)
    m.joined(1)
    for _ in range(100):
        clock.step(2.9)
        m.heard(1)
        assert m.expire() == []
    assert m.silent_for(1) == 0.0


def test_heard_revives_an_offline_node_and_tracking_restarts(clock):
    m = Membership(clock=clock)
    m.joined(3)
    clock.step(3.5)
    assert m.expire() == [3]
    m.heard(3)  # rejoin (or a late message): online again
    assert m.state(3) is NodeState.ONLINE and m.online() == [3]
    clock.step(3.0)
    assert m.expire() == []
    clock.step(0.5)
    assert m.expire() == [3]  # and can be reported offline again, once


def test_left_is_offline_and_never_expired(clock):
    m = Membership(clock=clock)
    m.joined(1)
    m.joined(2)
    m.left(1)
    assert m.state(1) is NodeState.OFFLINE
    clock.step(100)
    assert m.expire() == [2]
    assert m.known() == [1, 2]
    m.forget(1)
    assert m.known() == [2]
    assert m.state(1) is NodeState.OFFLINE  # unknown ids are offline


def test_unknown_node_heard_is_tracked(clock):
    m = Membership(clock=clock)
    assert m.state(9) is NodeState.OFFLINE
    m.heard(9)
    assert m.online() == [9]


def test_membership_rejects_bad_settings():
    with pytest.raises(ValueError, match="heartbeat_s"):
        Membership(heartbeat_s=0)
    with pytest.raises(ValueError, match="missed_beats"):
        Membership(missed_beats=0)
    assert Membership(heartbeat_s=2, missed_beats=3).timeout_s == 6.0


def test_controller_watch(clock):
    w = ControllerWatch(timeout_s=5.0, clock=clock)
    assert not w.lost() and w.remaining() == 5.0
    clock.step(4.0)
    w.heard()
    clock.step(5.0)
    assert not w.lost() and w.silent_for() == 5.0
    clock.step(0.01)
    assert w.lost() and w.remaining() == 0.0
    w.heard()
    assert not w.lost()
    with pytest.raises(ValueError, match="timeout_s"):
        ControllerWatch(timeout_s=-1)


def test_heartbeat_timer_due_at_most_once_per_interval(clock):
    t = HeartbeatTimer(interval_s=1.0, clock=clock)
    assert t.due()  # first beat at once
    assert not t.due()
    fired = 0
    for _ in range(100):  # 10 s in steps of 0.1 s
        clock.step(0.1)
        fired += t.due()
    assert fired in (9, 10)  # float steps may land just before the boundary
    clock.step(7.0)  # a long stall gives one beat, not a burst of seven
    assert t.due() and not t.due()
    assert t.remaining() == 1.0
    t.reset()
    clock.step(0.5)
    assert not t.due() and t.remaining() == 0.5
