"""The liveness rules both roles share (server/liveness.py), told the time on every call: no sockets,
no sleeping, no clock."""

from __future__ import annotations

import pytest
from psrv.server.liveness import FROZEN_BEATS, BeatTimer, FreezeGuard, Members, MemberState, PeerWatch

T0 = 1000.0


def test_offline_after_three_missed_beats_not_before_and_exactly_once():
    m = Members(heartbeat_s=1.0, missed_beats=3)
    now = T0
    m.joined(1, now)
    m.joined(2, now)
    for _ in range(24):  # 2 keeps beating every 0.125 s (exact in binary), 1 is silent
        now += 0.125
        m.heard(2, now)
        assert m.expire(now) == []
        assert m.state(1) is MemberState.ONLINE
    now += 0.05  # 1 silent for 3.05 s > 3 beats
    m.heard(2, now)
    assert m.expire(now) == [1]
    assert m.state(1) is MemberState.OFFLINE and m.state(2) is MemberState.ONLINE
    now += 10
    assert m.expire(now) == [2]  # 2 went silent too; 1 is not reported again
    assert m.expire(now) == []
    assert m.online() == []


def test_exactly_at_the_limit_is_still_online():
    m = Members(heartbeat_s=0.5, missed_beats=4)
    m.joined(7, T0)
    assert m.expire(T0 + 2.0) == []  # exactly 4 beats of 0.5 s
    assert m.expire(T0 + 2.0 + 1e-6) == [7]


def test_any_message_keeps_a_member_alive_and_heard_revives_an_offline_one():
    m = Members()
    now = T0
    m.joined(1, now)
    for _ in range(100):
        now += 2.9
        m.heard(1, now)
        assert m.expire(now) == []
    assert m.silent_for(1, now) == 0.0
    assert m.expire(now + 3.5) == [1]
    m.heard(1, now + 3.5)  # a rejoin or a late message: online again, and can expire again, once
    assert m.state(1) is MemberState.ONLINE and m.online() == [1]
    assert m.expire(now + 6.5) == [] and m.expire(now + 7.0) == [1] and m.expire(now + 9.0) == []


def test_left_is_offline_and_never_expired_forget_drops_it():
    m = Members()
    m.joined(1, T0)
    m.joined(2, T0)
    m.left(1)
    assert m.state(1) is MemberState.OFFLINE
    assert m.expire(T0 + 100) == [2]
    assert m.known() == [1, 2] and 1 in m
    m.forget(1)
    assert m.known() == [2] and 1 not in m
    assert m.state(1) is MemberState.OFFLINE  # unknown ids are offline


def test_a_frozen_controller_excuses_every_online_member():
    m = Members(heartbeat_s=1.0, missed_beats=3)
    m.joined(1, T0)
    m.joined(2, T0)
    m.left(2)
    guard = FreezeGuard(heartbeat_s=1.0, now=T0)
    later = T0 + 10.0  # our own ticks stopped for 10 s: the members' beats wait unread in the sockets
    frozen = guard.frozen_for(later)
    assert frozen == 10.0
    m.excuse(later)
    assert m.expire(later) == [] and m.state(2) is MemberState.OFFLINE
    assert guard.frozen_for(later + FROZEN_BEATS * 1.0) == 0.0  # a gap of exactly two beats is not a freeze
    assert FreezeGuard(1.0).frozen_for(T0) == 0.0  # the first call only starts the count


def test_settings_are_checked():
    with pytest.raises(ValueError, match="heartbeat_s"):
        Members(heartbeat_s=0)
    with pytest.raises(ValueError, match="missed_beats"):
        Members(missed_beats=0)
    with pytest.raises(ValueError, match="timeout_s"):
        PeerWatch(timeout_s=-1, now=T0)
    assert Members(heartbeat_s=2, missed_beats=3).timeout_s == 6.0


def test_peer_watch():
    w = PeerWatch(timeout_s=5.0, now=T0)
    assert not w.lost(T0) and w.remaining(T0) == 5.0
    w.heard(T0 + 4.0)
    assert not w.lost(T0 + 9.0) and w.silent_for(T0 + 9.0) == 5.0
    assert w.lost(T0 + 9.01) and w.remaining(T0 + 9.01) == 0.0
    w.heard(T0 + 9.01)
    assert not w.lost(T0 + 9.01)


def test_beat_timer_due_at_most_once_per_interval():
    t = BeatTimer(interval_s=1.0)
    now = T0
    assert t.due(now)  # the first beat at once
    assert not t.due(now)
    fired = 0
    for _ in range(100):  # 10 s in steps of 0.1 s
        now += 0.1
        fired += t.due(now)
    assert fired in (9, 10)  # float steps may land just before the boundary
    now += 7.0  # a long stall gives one beat, not a burst of seven, and says how late it was
    assert t.due(now) and t.lateness_s == pytest.approx(6.0) and not t.due(now)
    assert t.remaining(now) == 1.0
    t.reset(now)
    assert not t.due(now + 0.5) and t.remaining(now + 0.5) == 0.5
