"""Chunked messages: zero-copy split, reassembly in any order, bounded memory, expiry."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.transport.chunking import Reassembler, needs_chunking, split_message
from psrv.transport.codec import decode_header
from psrv.transport.counters import RateLimitedLog
from psrv.transport.errors import FrameRejectedError
from psrv.transport.messages import Message, Op


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reply(size: int = 1000) -> Message:
    params = np.arange(size, dtype=np.float32)
    updater = np.arange(size // 2, dtype=np.float64)
    return Message(
        Op.PARAMS_REPLY,
        {
            "request_id": 1,
            "dtype": "<f4",
            "size": size,
            "updater_dtype": "<f8",
            "updater_size": size // 2,
            "watermark": {1: 3},
            "extra_seen": {},
        },
        [params, updater],
        src=0,
    )


def test_split_is_zero_copy_and_reassembles_in_any_order() -> None:
    message = reply()
    assert needs_chunking(message, 512) and not needs_chunking(message, 10_000)
    chunks = split_message(message, 512, msg_id=7)
    assert np.shares_memory(np.frombuffer(chunks[0].buffers[0], np.uint8), message.buffers[0])
    r = Reassembler(limit_bytes=1 << 20, expiry_s=5)
    done = None
    for chunk in reversed(chunks):
        assert done is None
        done = r.add("peer", chunk)
    inner, buffers = done
    whole = decode_header(inner, buffers)
    assert whole.op is Op.PARAMS_REPLY and whole["watermark"] == {1: 3}
    assert np.array_equal(np.frombuffer(whole.buffers[0], np.float32), message.buffers[0])
    assert np.array_equal(np.frombuffer(whole.buffers[1], np.float64), message.buffers[1])
    assert r.in_flight_bytes == 0 and len(r) == 0


def test_a_repeated_chunk_changes_nothing() -> None:
    chunks = split_message(reply(), 1024, msg_id=1)
    r = Reassembler(1 << 20, 5)
    assert r.add("p", chunks[0]) is None
    assert r.add("p", chunks[0]) is None
    results = [r.add("p", c) for c in chunks[1:]]
    assert results[-1] is not None and all(x is None for x in results[:-1])


def test_memory_bound_refuses_what_does_not_fit() -> None:
    chunks = split_message(reply(), 1024, msg_id=1)
    r = Reassembler(limit_bytes=1000, expiry_s=5)
    with pytest.raises(FrameRejectedError) as info:
        r.add("p", chunks[0])
    assert info.value.reason == "bad_chunk" and r.in_flight_bytes == 0


def test_incomplete_messages_expire() -> None:
    clock = Clock()
    r = Reassembler(1 << 20, expiry_s=5, clock=clock)
    r.add("p", split_message(reply(), 1024, msg_id=1)[0])
    r.add("q", split_message(reply(), 1024, msg_id=1)[0])
    assert len(r) == 2 and r.in_flight_bytes > 0
    clock.now += 4
    assert r.expire() == 0
    clock.now += 2
    assert r.expire() == 2
    assert len(r) == 0 and r.in_flight_bytes == 0


def test_a_chunk_disagreeing_with_earlier_ones_drops_the_message() -> None:
    chunks = split_message(reply(), 1024, msg_id=1)
    other = split_message(reply(2000), 1024, msg_id=1)
    r = Reassembler(1 << 20, 5)
    r.add("p", chunks[0])
    with pytest.raises(FrameRejectedError):
        r.add("p", other[1])
    assert len(r) == 0 and r.in_flight_bytes == 0


def test_rate_limited_log_says_how_many_it_suppressed(caplog) -> None:
    import logging

    clock = Clock()
    log = RateLimitedLog(logging.getLogger("psrv.test.ratelimit"), interval_s=5, clock=clock)
    with caplog.at_level(logging.WARNING, logger="psrv.test.ratelimit"):
        assert log.warning("k", "bad frame")
        assert not any(log.warning("k", "bad frame") for _ in range(99))
        clock.now += 6
        assert log.warning("k", "bad frame")
    assert len(caplog.records) == 2
    assert "99 more like this suppressed" in caplog.records[1].getMessage()


def test_each_sender_has_its_own_reassembly_budget() -> None:
    """One sender cannot hold more than its budget, and its refusal leaves room for the others."""
    def first_chunk(msg_id: int, total: int) -> Message:
        fields = {
            "msg_id": msg_id,
            "index": 0,
            "count": 2,
            "offset": 0,
            "total": total,
            "inner": {},
            "lengths": [total],
        }
        return Message(Op.CHUNK, fields, [b"\0" * 8], 1)

    r = Reassembler(1000, 30.0, peer_limit_bytes=300)
    assert r.add("a", first_chunk(1, 200)) is None
    with pytest.raises(FrameRejectedError, match="sender's reassembly budget"):
        r.add("a", first_chunk(2, 200))
    assert r.add("b", first_chunk(1, 300)) is None
    assert r.in_flight_bytes == 500
    assert r.add("a", first_chunk(3, 100)) is None  # exactly the rest of a's budget
    with pytest.raises(FrameRejectedError, match="exceeds the reassembly budget"):
        r.add("c", first_chunk(1, 600))
