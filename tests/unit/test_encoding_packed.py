"""The packed wire form: the same elements as a sparse or bitmap message in 1-5 bytes each, applied
exactly as the message it was made from, and every malformed body refused before a target is touched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.encoding import MalformedMessageError, compact, decode, decode_validated, encode, message_info
from psrv.encoding.codec import sparse_message
from psrv.encoding.messages import parse_message
from psrv.encoding.update_header import HEADER_WORDS, PACKED, payload_header

TAU_BITS = int(np.float32(0.5).view(np.int32))


def packed(n: int, count: int, body: bytes) -> np.ndarray:
    """A packed message with this header and raw body (zero-padded to a whole word)."""
    padded = body + b"\0" * (-len(body) % 4)
    words = np.frombuffer(padded, dtype="<i4").astype(np.int32)
    return np.concatenate([np.array([count, n, TAU_BITS, PACKED], dtype=np.int32), words])


def residual_with(n: int, positions: np.ndarray, signs: np.ndarray, dtype=np.float32) -> np.ndarray:
    residual = np.zeros(n, dtype=dtype)
    residual[positions] = signs
    return residual


def test_the_bytes_are_the_documented_varints_of_gap_and_sign() -> None:
    # +tau at 1-based 1, -tau at 3, +tau at 100: (1 << 1 | 0) = 2, (2 << 1 | 1) = 5, 97 << 1 = 194
    message = sparse_message(np.array([0, 2, 99]), np.array([False, True, False]), 1000, 0.5)
    wire = compact(message)
    assert wire.tolist()[:HEADER_WORDS] == [3, 1000, TAU_BITS, PACKED]
    assert wire[HEADER_WORDS:].view(np.uint8).tobytes() == bytes([0x02, 0x05, 0xC2, 0x01])
    info = message_info(wire)
    assert (info.form, info.count, info.n, info.tau) == ("packed", 3, 1000, 0.5)
    assert parse_message(wire)[0].tolist() == message.tolist()  # unpacked: the sparse message itself


@pytest.mark.parametrize("gap, size", [(63, 1), (64, 2), (8191, 2), (8192, 3), (2**20 - 1, 3), (2**20, 4),
                                       (2**27, 5), (2**31 - 1, 5)])
def test_an_element_takes_one_byte_per_seven_bits_of_its_gap_and_sign(gap: int, size: int) -> None:
    n = 2**31 - 1
    message = sparse_message(np.array([gap - 1]), np.array([True]), n, 0.5)
    body = packed_body(message)
    assert len(body) == size
    wire = packed(n, 1, body)
    assert parse_message(wire)[0].tolist() == message.tolist()
    assert compact(message) is message  # one element: a word either way, so the sparse form stays


def packed_body(message: np.ndarray) -> bytes:
    """The packed body of a sparse message, unpadded."""
    from psrv.encoding import _kernels

    size = _kernels.packed_size(message)
    out = np.zeros(size, dtype=np.uint8)
    _kernels.pack_sparse(message, out)
    return out.tobytes()


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 5000), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1), st.sampled_from(["f4", "f8"]))
def test_compact_applies_exactly_as_the_message_it_came_from(n: int, density: float, seed: int,
                                                             dtype: str) -> None:
    rng = np.random.default_rng(seed)
    positions = np.flatnonzero(rng.random(n) < density)
    residual = residual_with(n, positions, rng.choice([-2.0, 2.0], positions.size), np.dtype(dtype))
    message = encode(residual, 1.0)
    if message is None:
        return
    wire = compact(message)
    assert wire.nbytes <= message.nbytes
    original, small = message_info(message), message_info(wire)
    assert (small.count, small.n, small.tau) == (original.count, original.n, original.tau)
    assert small.form == ("packed" if wire.nbytes < message.nbytes else original.form)
    start = rng.standard_normal(n).astype(dtype)
    expected, got, validated = start.copy(), start.copy(), start.copy()
    decode(message, expected)
    decode(wire, got)
    decode_validated(wire, validated)
    assert np.array_equal(expected, got) and np.array_equal(expected, validated)
    assert compact(wire) is wire  # already the smallest: nothing to do


def test_a_bitmap_is_packed_while_that_is_smaller_and_kept_when_it_is_not() -> None:
    n = 16_000
    for fraction, form in [(0.1, "packed"), (0.2, "packed"), (0.5, "bitmap")]:
        positions = np.arange(0, n, int(round(1 / fraction)))
        message = encode(residual_with(n, positions, np.ones(positions.size)), 0.5)
        assert message_info(message).form == "bitmap"
        assert message_info(compact(message)).form == form
    # at one in ten an element is one byte: 2.5x smaller than the bitmap's N/4 bytes
    message = encode(residual_with(n, np.arange(0, n, 10), np.ones(n // 10)), 0.5)
    assert compact(message).nbytes == 4 * HEADER_WORDS + n // 10


@pytest.mark.parametrize("body, count, n, expected", [
    (bytes([0x02, 0x80, 0x80, 0x80]), 2, 100, "runs past the body's end"),
    (bytes([0x80, 0x80, 0x80, 0x80, 0x80, 0x02]), 1, 100, "runs past the body's end or past 5 bytes"),
    (bytes([0x00]), 1, 100, "index zero"),
    (bytes([0x04, 0x00]), 2, 100, "does not follow the previous index"),
    (bytes([0x04, 0x05]), 2, 3, "packed element #1 is out of range for N=3"),
    (bytes([0x02, 0x02, 0x07]), 2, 100, "beyond the zero padding"),
    (bytes([0x02, 0x00, 0x00, 0x00, 0x00]), 1, 100, "beyond the zero padding"),
    (bytes([0x02]) + bytes(11), 1, 100, "12 body bytes; 1 elements take 1 to 5"),
    (bytes([0x02, 0x02]), 2, 1, "count must be in"),
    (b"", 1, 100, "body bytes"),
])
def test_a_malformed_packed_body_is_refused_and_leaves_the_target_untouched(body: bytes, count: int, n: int,
                                                                          expected: str) -> None:
    message = packed(n, count, body)
    target = np.arange(n, dtype=np.float32)
    with pytest.raises(MalformedMessageError, match=expected):
        message_info(message)
    with pytest.raises(MalformedMessageError, match=expected):
        decode(message, target)
    assert np.array_equal(target, np.arange(n, dtype=np.float32))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=40), st.integers(0, 12), st.integers(1, 300))
def test_random_packed_bodies_are_applied_or_refused_never_anything_else(body: bytes, count: int,
                                                                         n: int) -> None:
    message = packed(n, count, body)
    target = np.zeros(n, dtype=np.float64)
    try:
        info = message_info(message)
    except MalformedMessageError:
        with pytest.raises(MalformedMessageError):
            decode(message, target)
        assert not target.any()
        return
    decode(message, target)
    assert info.count == count and np.count_nonzero(target) == count  # indices strictly ascending
    again = np.zeros(n, dtype=np.float64)
    decode_validated(message, again)
    assert np.array_equal(target, again)


def test_the_transport_header_check_knows_the_packed_count() -> None:
    message = compact(sparse_message(np.arange(0, 900, 9), np.zeros(100, dtype=bool), 10_000, 0.5))
    header = payload_header(message, 10_000)
    assert (header.form, header.count, header.n) == ("packed", 100, 10_000)
