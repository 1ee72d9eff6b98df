"""SeenUpdates: exactly-once apply with bounded memory, and the catch-up watermark rule."""

from __future__ import annotations

import random

import pytest
from psrv.server.dedup import SeenUpdates
from psrv.transport.errors import InvalidSequenceError


def test_in_order_each_update_once():
    s = SeenUpdates()
    assert [s.first_time(1, q) for q in range(1, 101)] == [True] * 100
    assert [s.first_time(1, q) for q in range(1, 101)] == [False] * 100
    assert s.watermark() == {1: 100}
    assert s.pending(1) == 0 and s.duplicates == 100


def test_origins_are_independent():
    s = SeenUpdates()
    assert s.first_time(1, 1) and s.first_time(2, 1) and s.first_time(0, 1)
    assert not s.first_time(2, 1)
    assert s.watermark() == {0: 1, 1: 1, 2: 1}
    assert s.origins() == [0, 1, 2]
    assert [s.watermark_of(o) for o in (0, 1, 2, 7)] == [1, 1, 1, 0]  # 7: never seen


def test_out_of_order_and_duplicates_exactly_once():
    rng = random.Random(3)
    s = SeenUpdates(window=1000)
    deliveries = [(o, q) for o in (1, 2, 3) for q in range(1, 301)] * 3  # everything three times
    rng.shuffle(deliveries)
    applied = [d for d in deliveries if s.first_time(*d)]
    assert sorted(applied) == sorted(set(deliveries))  # each exactly once
    assert s.watermark() == {1: 300, 2: 300, 3: 300}
    assert all(s.pending(o) == 0 for o in (1, 2, 3))  # memory back to the watermark only


def test_gap_holds_watermark_and_memory_stays_bounded():
    s = SeenUpdates(window=64)
    assert s.first_time(5, 1)
    for q in range(3, 60):  # seq 2 is late
        assert s.first_time(5, q)
    assert s.watermark() == {5: 1} and s.pending(5) == 57
    assert s.seen(5, 40) and not s.seen(5, 2)
    assert s.above_watermark() == {5: list(range(3, 60))}
    assert s.first_time(5, 2)
    assert s.watermark() == {5: 59} and s.pending(5) == 0
    assert s.above_watermark() == {}


def test_window_slides_and_skipped_seqs_are_too_old():
    s = SeenUpdates(window=4)
    assert [s.first_time(1, q) for q in (1, 3, 2)] == [True, True, True]
    assert s.first_time(1, 10)  # 10 > 3 + 4: the window slides to 6; 4, 5, 6 are given up
    assert s.watermark() == {1: 6} and s.skipped == 3
    assert not s.first_time(1, 5)  # too old
    assert not s.first_time(1, 10)  # duplicate
    assert [s.first_time(1, q) for q in (7, 8, 9)] == [True, True, True]
    assert s.watermark() == {1: 10} and s.pending(1) == 0
    for q in range(11, 2000, 3):  # a lossy stream never holds more than the window
        s.first_time(1, q)
        assert s.pending(1) <= 4


def test_catch_up_rule_nothing_twice_nothing_lost():
    """After a download with watermark W, updates <= W are not applied again, those > W once."""
    controller = SeenUpdates()
    for q in range(1, 51):
        controller.first_time(1, q)
    for q in range(1, 31):
        controller.first_time(2, q)
    download = controller.watermark()  # {1: 50, 2: 30}

    node = SeenUpdates()
    # The new node subscribes first and holds what arrives while it downloads (applying it to
    # parameters that the download then replaces would lose it); after the download it marks
    # the watermark covered and feeds the held updates, then the live stream, through first_time.
    held = [(1, 49), (1, 51), (2, 31), (2, 5), (1, 51)]
    node.mark_covered(download)
    later = [(1, q) for q in range(40, 56)] + [(2, q) for q in range(25, 36)] + [(3, 1), (2, 33)]
    applied = [u for u in held + later if node.first_time(*u)]
    expected = [(1, 51), (2, 31)] + [(1, q) for q in range(52, 56)]
    expected += [(2, q) for q in range(32, 36)] + [(3, 1)]
    assert applied == expected  # nothing at or below W, everything above W exactly once
    assert node.watermark() == {1: 55, 2: 35, 3: 1}
    assert node.duplicates == len(held) + len(later) - len(expected)


def test_mark_covered_never_lowers_and_handles_new_origins():
    s = SeenUpdates()
    for q in range(1, 11):
        s.first_time(1, q)
    s.mark_covered({1: 4, 2: 7})
    assert s.watermark() == {1: 10, 2: 7}
    assert not s.first_time(2, 7) and s.first_time(2, 8)
    s.mark_covered({})
    assert s.watermark() == {1: 10, 2: 8}


def test_invalid_origin_or_seq_is_a_clear_error():
    s = SeenUpdates()
    for origin, seq in ((1, 0), (1, -3), (-1, 1), (1, 1.5), ("1", 1), (True, 1)):
        with pytest.raises(InvalidSequenceError):
            s.first_time(origin, seq)
    with pytest.raises(InvalidSequenceError, match="watermark"):
        s.mark_covered({1: -1})
    with pytest.raises(ValueError, match="window"):
        SeenUpdates(window=0)


def test_closing_an_origin_gives_up_its_gaps_and_refuses_them_later() -> None:
    s = SeenUpdates(window=100)
    for seq in (1, 2, 5, 7):
        assert s.first_time(3, seq)
    assert s.gaps(3) == [3, 4, 6] and s.gaps(3, limit=2) == [3, 4] and s.gaps(99) == []
    assert s.close(3) == 3 and s.gaps(3) == [] and s.watermark() == {3: 7} and s.above_watermark() == {}
    assert not s.first_time(3, 4) and s.first_time(3, 8) and s.skipped == 3
    assert s.close(3) == 0 and s.close(99) == 0  # nothing open, or an unknown origin
