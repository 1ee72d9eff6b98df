"""psrv.encoding.messages: reading a message. decode takes any bytes-like buffer; a malformed message
(header, form, τ, N, body) is refused by decode, message_info and compact with the target untouched."""

from __future__ import annotations

import numpy as np
import pytest
from encoding_reference import reference_decode
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.encoding import MalformedMessageError, compact, decode, encode, message_info
from test_encoding import FLOATS, uint_view

# ---------------------------------------------------------------- decode inputs

@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview, lambda m: np.frombuffer(bytes(m), np.uint8)])
def test_decode_accepts_bytes_like_messages(wrap) -> None:
    x = np.zeros(50, dtype=np.float32)
    x[[1, 7]] = [2.0, -2.0]
    message = encode(x, 1.0)
    target = np.zeros(50, dtype=np.float32)
    decode(wrap(message.tobytes()), target)
    assert target[1] == 1.0 and target[7] == -1.0 and np.count_nonzero(target) == 2
    assert message_info(wrap(message.tobytes())).count == 2


def test_decode_accepts_an_unaligned_buffer() -> None:
    x = np.zeros(40, dtype=np.float32)
    x[5] = 3.0
    raw = bytearray(b"\0" + encode(x, 1.0).tobytes())
    target = np.zeros(40, dtype=np.float32)
    decode(memoryview(raw)[1:], target)
    assert target[5] == 1.0


def test_decode_into_float64_target() -> None:
    message = encode(np.array([0.0, 0.3], dtype=np.float32), 0.1)
    target = np.zeros(2, dtype=np.float64)
    decode(message, target, scale=2.0)
    assert target[1] == np.float64(np.float32(0.1)) * 2.0


# ---------------------------------------------------------------- malformed messages

def _sparse() -> np.ndarray:
    x = np.zeros(64, dtype=np.float32)
    x[[2, 10, 40]] = [1.0, -1.0, 1.0]
    return encode(x, 0.5)  # [3, 64, tau, 0, 3, -11, 41]


def _bitmap(n: int = 40) -> np.ndarray:
    x = np.where(np.arange(n) % 2 == 0, 1.0, -1.0).astype(np.float32)
    return encode(x, 0.5)


def _packed(body: bytes, count: int = 3, n: int = 64) -> np.ndarray:
    """A packed message of this raw body (zero-padded to whole words); _packed(SPARSE_PACKED) is
    _sparse() packed: gaps 3, 8 and 30 (the second negative) with Rice parameter 3, bit by bit from
    the lowest: k = 3 in 5 bits (11000), then per element the quotient of (gap - 1) >> 3 in ones and
    a zero, 3 bits of remainder and the sign: 0 010 0, 0 111 1, 1110 101 0."""
    words = np.frombuffer(body + b"\0" * (-len(body) % 4), dtype="<i4").astype(np.int32)
    return np.concatenate([np.array([count, n, _tau_word(0.5), 2], dtype=np.int32), words])


SPARSE_PACKED = bytes([0x83, 0xF8, 0x2B])
#: k = 31 and one element (gap 1): 38 bits, so a second element runs past the body's 8 bytes
ONE_WIDE_ELEMENT = bytes([0x1F, 0, 0, 0, 0])
#: k = 0, gap 1, then 65 one bits: a second element's quotient past N = 64
RUN_PAST_N = bytes([0x80]) + bytes([0xFF] * 8)


def _with(message: np.ndarray, position: int, value: int) -> np.ndarray:
    changed = message.copy()
    changed[position] = np.int32(value) if -(2**31) <= value < 2**31 else np.uint32(value).view(np.int32)
    return changed


def _tau_word(value: float) -> int:
    return int(np.array([value], dtype=np.float32).view(np.int32)[0])


MALFORMED = {
    "empty": (np.zeros(0, dtype=np.int32), 64, "header"),
    "header only part": (np.array([1, 64, 0], dtype=np.int32), 64, "header"),
    "bytes not whole words": (_sparse().tobytes()[:-1], 64, "whole number"),
    "float array": (_sparse().astype(np.float32), 64, "dtype"),
    "2-D array": (_sparse().reshape(1, -1), 64, "1-D"),
    "not a buffer": (12345, 64, "bytes-like"),
    "unknown form": (_with(_sparse(), 3, 3), 64, "form"),
    "negative form": (_with(_sparse(), 3, -1), 64, "form"),
    "zero tau": (_with(_sparse(), 2, 0), 64, "threshold"),
    "negative tau": (_with(_sparse(), 2, _tau_word(-0.5)), 64, "threshold"),
    "nan tau": (_with(_sparse(), 2, _tau_word(float("nan"))), 64, "threshold"),
    "inf tau": (_with(_sparse(), 2, _tau_word(float("inf"))), 64, "threshold"),
    "negative N": (_with(_sparse(), 1, -64), 64, "N"),
    "N differs from target": (_sparse(), 65, "target"),
    "sparse count too big": (_with(_sparse(), 0, 4), 64, "header says"),
    "sparse count too small": (_with(_sparse(), 0, 2), 64, "header says"),
    "sparse negative count": (_with(_sparse(), 0, -1), 64, "count"),
    "sparse truncated": (_sparse()[:-1], 64, "header says"),
    "sparse zero index": (_with(_sparse(), 5, 0), 64, "zero"),
    "sparse index above N": (_with(_sparse(), 6, 65), 64, "out of range"),
    "sparse index below -N": (_with(_sparse(), 6, -65), 64, "out of range"),
    "sparse int32 min index": (_with(_sparse(), 6, -(2**31)), 64, "out of range"),
    "sparse unordered": (_with(_sparse(), 4, 20), 64, "ascending"),
    "sparse duplicate": (_with(_sparse(), 5, 3), 64, "ascending"),
    "bitmap N mismatch in header": (_with(_bitmap(), 0, 41), 40, "repeat N"),
    "bitmap too few words": (_bitmap()[:-1], 40, "needs"),
    "bitmap too many words": (np.append(_bitmap(), np.int32(0)), 40, "needs"),
    "bitmap sign without value": (_with(_bitmap(), 4, 1 << 16), 40, "sign bit"),
    "bitmap value bit beyond N": (_with(_bitmap(), 6, 0x01FF), 40, "beyond"),
    "bitmap sign+value beyond N": (_with(_bitmap(), 6, 0x0100_0100), 40, "beyond"),
    "packed count above N": (_packed(SPARSE_PACKED, count=65), 64, "count must be in"),
    "packed body too long": (_packed(SPARSE_PACKED + bytes(28)), 64, "body bytes"),
    "packed truncated": (_packed(ONE_WIDE_ELEMENT), 64, "runs past"),
    "packed index above N": (_packed(RUN_PAST_N, count=2), 64, "out of range"),
    "packed trailing bits": (_packed(bytes([0x83, 0xF8, 0xAB])), 64, "bits after"),
    "packed whole word of padding": (_packed(SPARSE_PACKED + bytes(5)), 64, "whole word of padding"),
    "packed N differs from target": (_packed(SPARSE_PACKED), 65, "target"),
}


def test_the_packed_helper_is_the_sparse_message_packed() -> None:
    assert np.array_equal(compact(_sparse()), _packed(SPARSE_PACKED))


@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("dtype", FLOATS)
def test_malformed_message_is_rejected_and_target_untouched(name, dtype) -> None:
    message, n, words = MALFORMED[name]
    target = np.linspace(-1, 1, n).astype(dtype)
    before = target.copy()
    with pytest.raises(MalformedMessageError, match=words):
        decode(message, target)
    np.testing.assert_array_equal(uint_view(target), uint_view(before))
    if name not in TARGET_ONLY:
        with pytest.raises(MalformedMessageError):
            message_info(message)


TARGET_ONLY = {"N differs from target", "packed N differs from target"}  # malformed only for that target


@pytest.mark.parametrize("name", sorted(set(MALFORMED) - TARGET_ONLY))
def test_compact_refuses_every_malformed_message_before_it_reads_the_body(name) -> None:
    """compact walks a sparse body to pack it: a body that is not ascending or in range never gets there."""
    with pytest.raises(MalformedMessageError, match=MALFORMED[name][2]):
        compact(MALFORMED[name][0])


def test_valid_bases_of_the_malformed_cases_decode() -> None:
    target = np.zeros(64, dtype=np.float32)
    decode(_sparse(), target)
    assert np.count_nonzero(target) == 3
    bitmap_target = np.zeros(40, dtype=np.float32)
    decode(_bitmap(), bitmap_target)
    assert np.all(np.abs(bitmap_target) == np.float32(0.5))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(-(2**31), 2**31 - 1), max_size=12), st.integers(0, 40))
def test_random_messages_are_either_valid_or_rejected_cleanly(words, n) -> None:
    message = np.array(words, dtype=np.int32)
    target = np.zeros(n, dtype=np.float32)
    try:
        decode(message, target)
    except MalformedMessageError:
        assert not target.any()
    else:
        reference = np.zeros(n, dtype=np.float32)
        reference_decode(message, reference)
        np.testing.assert_array_equal(target, reference)
