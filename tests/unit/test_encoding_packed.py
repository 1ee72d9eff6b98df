"""The packed wire form: the same elements as a sparse or bitmap message in a Golomb-Rice bit stream
(about a byte each at 3 % of the elements), applied exactly as the message it was made from, and every
malformed body refused before a target is touched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.encoding import (
    MalformedMessageError,
    _kernels,
    compact,
    decode,
    decode_validated,
    encode,
    message_info,
)
from psrv.encoding.codec import sparse_message
from psrv.encoding.messages import parse_message, rice_parameter
from psrv.encoding.update_header import HEADER_WORDS, PACKED, payload_header

TAU_BITS = int(np.float32(0.5).view(np.int32))


def packed(n: int, count: int, body: bytes) -> np.ndarray:
    """A packed message with this header and raw body (zero-padded to a whole word)."""
    padded = body + b"\0" * (-len(body) % 4)
    words = np.frombuffer(padded, dtype="<i4").astype(np.int32)
    return np.concatenate([np.array([count, n, TAU_BITS, PACKED], dtype=np.int32), words])


def stream(elements: list[tuple[int, bool]], k: int, extra_bits: list[int] = ()) -> bytes:
    """The documented bit stream, written bit by bit (an oracle apart from the kernels): k in 5 bits,
    then per (1-based index, negative) the quotient of (gap - 1) >> k in ones and a zero, the k low bits
    of gap - 1 and the sign; low bit of each byte first, unpadded."""
    bits = [(k >> b) & 1 for b in range(5)]
    previous = 0
    for index, negative in elements:
        v = index - previous - 1
        previous = index
        bits += [1] * (v >> k) + [0] + [(v >> b) & 1 for b in range(k)] + [int(negative)]
    bits += list(extra_bits)
    bits += [0] * (-len(bits) % 8)
    return bytes(sum(bit << j for j, bit in enumerate(bits[i:i + 8])) for i in range(0, len(bits), 8))


def residual_with(n: int, positions: np.ndarray, signs: np.ndarray, dtype=np.float32) -> np.ndarray:
    residual = np.zeros(n, dtype=dtype)
    residual[positions] = signs
    return residual


def test_the_bytes_are_the_documented_rice_stream_of_gaps_and_signs() -> None:
    # +tau at 1-based 1, -tau at 3, +tau at 100, -tau at 300: gaps 1, 2, 97, 200
    elements = [(1, False), (3, True), (100, False), (300, True)]
    message = sparse_message(np.array([0, 2, 99, 299]), np.array([False, True, False, True]), 1000, 0.5)
    wire = compact(message)
    assert wire.tolist()[:HEADER_WORDS] == [4, 1000, TAU_BITS, PACKED]
    rice, bits = rice_parameter(message)
    expected = stream(elements, rice)
    assert wire[HEADER_WORDS:].view(np.uint8).tobytes() == expected + bytes(-len(expected) % 4)
    assert bits == 5 + sum(((g - 1) >> rice) + rice + 2 for g in (1, 2, 97, 200))
    info = message_info(wire)
    assert (info.form, info.count, info.n, info.tau) == ("packed", 4, 1000, 0.5)
    assert parse_message(wire)[0].tolist() == message.tolist()  # unpacked: the sparse message itself
    for k in (0, 1, 5, 17, 31):  # any parameter reads back: the kernels against the oracle
        words = np.zeros((_kernels.packed_bits(message, max(1, k))[min(k, 1)] + 31) // 32, dtype=np.uint32)
        _kernels.pack_sparse(message, k, words)
        body = stream(elements, k)
        assert words.view(np.uint8).tobytes() == body + bytes(-len(body) % 4)
        assert parse_message(packed(1000, 4, body))[0].tolist() == message.tolist()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 2**20), min_size=1, max_size=60), st.integers(0, 2**32 - 1))
def test_the_parameter_chosen_takes_the_fewest_bits_of_all_32(gaps: list[int], seed: int) -> None:
    indices = np.cumsum(gaps)
    n = int(indices[-1]) + int(np.random.default_rng(seed).integers(0, 1000))
    signs = np.random.default_rng(seed).random(len(gaps)) < 0.5
    signed = np.where(signs, -indices, indices)
    message = np.array([len(gaps), n, TAU_BITS, 0, *signed.tolist()], dtype=np.int32)  # any density
    every = [5 + sum(((g - 1) >> k) + k + 2 for g in gaps) for k in range(32)]
    rice, bits = rice_parameter(message)
    assert bits == min(every) == every[rice]
    words = np.zeros((bits + 31) // 32, dtype=np.uint32)
    _kernels.pack_sparse(message, rice, words)
    assert parse_message(packed(n, len(gaps), words.view(np.uint8).tobytes()))[0].tolist() == message.tolist()


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


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5000), st.booleans()), min_size=0, max_size=40), st.integers(0, 31))
def test_every_parameter_writes_the_documented_stream_and_reads_it_back(elements: list, k: int) -> None:
    """The kernels against the bit-by-bit oracle for any k, long unary runs (k = 0) included."""
    indices = np.cumsum([gap for gap, _ in elements]).astype(np.int64)
    n = int(indices[-1]) if elements else 1
    signed = [-i if neg else i for i, (_, neg) in zip(indices.tolist(), elements, strict=True)]
    message = np.array([len(elements), n, TAU_BITS, 0, *signed], dtype=np.int32)  # any density
    body = stream(list(zip(indices.tolist(), [neg for _, neg in elements], strict=True)), k)
    bits = 5 + sum(((gap - 1) >> k) + k + 2 for gap, _ in elements)
    assert (bits + 7) // 8 == len(body)
    if 1 <= k <= 30:
        assert _kernels.packed_bits(message, k)[1] == bits
    words = np.zeros((bits + 31) // 32, dtype=np.uint32)
    _kernels.pack_sparse(message, k, words)
    assert words.view(np.uint8).tobytes() == body + bytes(-len(body) % 4)
    assert parse_message(packed(n, len(elements), body))[0].tolist() == message.tolist()


def test_a_bitmap_is_packed_while_that_is_smaller_and_kept_when_it_is_not() -> None:
    n = 16_000
    # every other element takes 3 bits (1.5 per element of N, under the bitmap's 2); all of them take 2
    for step, form in [(10, "packed"), (5, "packed"), (2, "packed"), (1, "bitmap")]:
        positions = np.arange(0, n, step)
        message = encode(residual_with(n, positions, np.ones(positions.size)), 0.5)
        assert message_info(message).form == "bitmap"
        assert message_info(compact(message)).form == form
    # at one in ten an element is 6 bits (gap - 1 = 9 with k = 2: 2 ones, a zero, 2 bits, the sign),
    # 2.7x smaller than the bitmap's N/4 bytes
    message = encode(residual_with(n, np.arange(0, n, 10), np.ones(n // 10)), 0.5)
    assert compact(message).nbytes == 4 * HEADER_WORDS + 4 * ((5 + 6 * (n // 10) + 31) // 32)


@pytest.mark.parametrize("body, count, n, expected", [
    # zero padding reads as elements (gap 1, +tau), so a body is cut short only where bits run out
    (stream([(1, False)], 31), 2, 100, "packed element #1 of 2 runs past the body's end"),
    (stream([(5, False)], 0, [1] * 100), 2, 100, "packed element #1 is out of range for N=100"),
    (stream([(1, False), (5, True)], 1), 2, 3, "packed element #1 is out of range for N=3"),
    (stream([(1, False), (2, True)], 0, [1]), 2, 100, "bits after its 2 elements"),
    (stream([(7, True)], 2) + bytes(4), 1, 100, "a whole word of padding"),
    (stream([(7, True)], 2) + bytes(23), 1, 100, "28 body bytes; 1 elements of N=100 take 1 to 18"),
    (stream([(1, False), (2, False)], 0), 2, 1, "count must be in"),
    (b"", 1, 100, "0 body bytes"),
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


def test_a_long_unary_run_is_read_across_words_and_bounded_by_n() -> None:
    n = 2**31 - 1
    for gap in (64, 1000, 100_000):  # with k = 0 the whole gap is ones, over many words
        message = sparse_message(np.array([gap - 1]), np.array([True]), n, 0.5)
        body = stream([(gap, True)], 0)
        assert parse_message(packed(n, 1, body))[0].tolist() == message.tolist()
    with pytest.raises(MalformedMessageError, match="out of range for N=1000"):
        message_info(packed(1000, 1, stream([(1001, False)], 0)))


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
