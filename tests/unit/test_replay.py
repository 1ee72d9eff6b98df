"""ReplayLog: the bounded ring of applied updates and the held list, without sockets."""

from __future__ import annotations

import numpy as np
from psrv.server.replay import ReplayLog


def payload(nbytes: int) -> np.ndarray:
    return np.zeros(nbytes // 4, np.int32)


def test_ring_is_bounded_by_count_and_remembers_what_fell_out() -> None:
    log = ReplayLog(max_messages=3, max_bytes=1 << 20)
    for seq in range(1, 6):
        log.remember(1, seq, payload(16), {})
    assert [e[1] for e in log.ring] == [3, 4, 5]
    assert log.evicted == {1: 2}
    # a download whose watermark already covers the evicted seqs loses nothing; one below does
    assert log.incomplete({1: 2}) == []
    assert log.incomplete({1: 1}) == [1]


def test_ring_is_bounded_by_bytes() -> None:
    log = ReplayLog(max_messages=100, max_bytes=100)
    for seq in range(1, 5):
        log.remember(7, seq, payload(40), {})
    assert log.ring_bytes <= 100
    assert [e[1] for e in log.ring] == [3, 4]
    assert log.evicted == {7: 2}


def test_missing_from_lists_only_what_the_download_lacks() -> None:
    log = ReplayLog(max_messages=10, max_bytes=1 << 20)
    for origin, seq in [(1, 1), (1, 2), (2, 1), (1, 3), (2, 2)]:
        log.remember(origin, seq, payload(8), {"o": origin})
    missing = [(o, s) for o, s, _, _ in log.missing_from({1: 2, 2: 0}, {2: {2}})]
    assert missing == [(2, 1), (1, 3)]


def test_own_returns_an_origins_range_in_order() -> None:
    log = ReplayLog(max_messages=10, max_bytes=1 << 20)
    for origin, seq in [(1, 1), (2, 1), (1, 2), (1, 3), (1, 4)]:
        log.remember(origin, seq, payload(8), {})
    assert [s for s, _, _ in log.own(1, after=1, upto=3)] == [2, 3]


def test_held_is_bounded_and_taken_once() -> None:
    log = ReplayLog(max_messages=2, max_bytes=1 << 20)
    assert log.hold(1, 1, payload(8), {})
    assert log.hold(1, 2, payload(8), {})
    assert not log.hold(1, 3, payload(8), {}), "full: a later re-sync covers it"
    assert [e[1] for e in log.take_held()] == [1, 2]
    assert log.take_held() == []


def test_clear_forgets_everything() -> None:
    log = ReplayLog(max_messages=1, max_bytes=1 << 20)
    log.remember(1, 1, payload(8), {})
    log.remember(1, 2, payload(8), {})
    log.hold(1, 3, payload(8), {})
    log.clear()
    assert not log.ring and not log.held and log.ring_bytes == 0 and log.evicted == {}
