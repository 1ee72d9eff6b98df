"""Reading threshold-encoded messages: validate one, say what it holds, compact it to its smallest wire
form, and decode it into a vector.

The wire forms (sparse, bitmap, packed) are described in ``psrv.encoding.codec``, which writes them,
and their header in ``psrv.encoding.update_header``. Every reader here validates the whole message
before it touches a target, so a malformed frame raises MalformedMessageError naming what is wrong and
changes nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from psrv.encoding import _kernels as k
from psrv.encoding.codec import check_vector
from psrv.encoding.errors import MalformedMessageError
from psrv.encoding.update_header import (  # the wire format's header, defined there once
    BITMAP,
    FORM_NAMES,
    HEADER_WORDS,
    MAX_RICE_K,
    PACKED,
    RICE_K_BITS,
    SPARSE,
    WORD_ELEMENTS,
    check_header,
    check_too_short,
)

_WIRE_INT32 = np.dtype("<i4")


@dataclass(frozen=True)
class MessageInfo:
    """What the header of a valid message says."""

    form: Literal["sparse", "bitmap", "packed"]
    count: int  # elements carrying +-tau
    n: int  # length of the vector the message applies to
    tau: float  # the float32 threshold, as a Python float

    @property
    def sparsity(self) -> float:
        return self.count / self.n if self.n else 0.0


def _as_message_array(message: np.ndarray | bytes | bytearray | memoryview) -> np.ndarray:
    """View (or, if unaligned, copy) a message as a 1-D native int32 array."""
    if isinstance(message, np.ndarray):
        if message.ndim != 1:
            raise MalformedMessageError(f"message must be 1-D, got shape {message.shape}")
        if message.dtype.kind in "iu" and message.dtype.itemsize == 4:
            array = message.view(np.int32) if message.dtype.isnative else message.astype(np.int32)
        elif message.dtype == np.uint8:
            array = _from_bytes(message)
        else:
            raise MalformedMessageError(f"message must be an int32 array or bytes, got dtype {message.dtype}")
    else:
        try:
            array = _from_bytes(memoryview(message))
        except TypeError:
            raise MalformedMessageError(
                f"message must be an int32 array or a bytes-like object, got {type(message).__name__}"
            ) from None
    if not (array.flags.c_contiguous and array.flags.aligned):
        array = np.ascontiguousarray(array).copy()
    return array


def _from_bytes(buffer) -> np.ndarray:
    raw = np.frombuffer(buffer, dtype=np.uint8) if not isinstance(buffer, np.ndarray) else buffer
    if raw.size % 4:
        raise MalformedMessageError(f"message is {raw.size} bytes, not a whole number of int32 words")
    if not (raw.flags.c_contiguous and raw.flags.aligned and raw.ctypes.data % 4 == 0):
        raw = raw.copy()
    return raw.view(_WIRE_INT32).astype(np.int32, copy=False)


def bitmap_problem(code: int, position: int, n: int) -> str:
    if code == k.BAD_SIGN_WITHOUT_VALUE:
        return f"bitmap word {position} sets a sign bit without its value bit"
    return f"bitmap word {position} sets bits beyond element N={n}"


def parse_message(message, *, unpack: bool = True) -> tuple[np.ndarray, MessageInfo]:
    """Fully validate a message (header, length, body); return it as int32 and its header info.

    A packed message comes back unpacked, as the sparse message of the same elements (its info still
    says "packed"), so a caller reads the body of either in one way; ``unpack=False`` returns it as it
    is (validated all the same)."""
    array = _as_message_array(message)
    check_too_short(array.shape[0])
    first, n, tau_bits, form = header = array[:HEADER_WORDS].tolist()
    tau = check_header(header, array.shape[0])
    if form == SPARSE:
        count = first
        code, position = k.validate_sparse(array, n)
        if code != k.OK:
            raise MalformedMessageError(sparse_problem(code, position, int(array[position]), n))
    elif form == PACKED:
        count = first
        array = _unpacked(array, count, n) if unpack else _check_packed(array, count, n, _NO_INDICES)
    else:
        bitmap = array[HEADER_WORDS:].view(np.uint32)
        code, position, count = k.validate_bitmap(bitmap, n)
        if code != k.OK:
            raise MalformedMessageError(bitmap_problem(code, position, n))
    return array, MessageInfo(form=FORM_NAMES[form], count=count, n=n, tau=tau)


_NO_INDICES = np.empty(0, dtype=np.int32)


def _check_packed(array: np.ndarray, count: int, n: int, indices: np.ndarray) -> np.ndarray:
    """Validate the body of a packed message (header checked), writing its indices into ``indices``
    unless that is empty; returns the message."""
    code, element = k.unpack_packed(array[HEADER_WORDS:].view(np.uint32), count, n, indices)
    if code != k.OK:
        raise MalformedMessageError(packed_problem(code, element, count, n))
    return array


def _unpacked(array: np.ndarray, count: int, n: int) -> np.ndarray:
    """The sparse message of a packed one (header checked), its body validated on the way.

    Packed bodies are applied through this: an element's length in bits is a branch the CPU cannot
    predict, and applying straight from the bit stream would tie every scattered add to that chain;
    unpacked first, the adds overlap as a sparse message's do."""
    sparse = np.empty(HEADER_WORDS + count, dtype=np.int32)
    sparse[:HEADER_WORDS] = array[:HEADER_WORDS]
    sparse[HEADER_WORDS - 1] = SPARSE
    _check_packed(array, count, n, sparse[HEADER_WORDS:])
    return sparse


def packed_problem(code: int, element: int, count: int, n: int) -> str:
    if code == k.BAD_TRUNCATED:
        return f"packed element #{element} of {count} runs past the body's end"
    if code == k.BAD_TRAILING:
        return (f"packed body has bits after its {count} elements, or a whole word of padding after "
                "them")
    return f"packed element #{element} is out of range for N={n}"  # BAD_INDEX_RANGE: gaps are >= 1


def compact(message: np.ndarray) -> np.ndarray:
    """The message in its smallest wire form: a sparse or bitmap message becomes packed where that
    takes fewer bytes (almost always: about a byte an element at 1-3 % of the elements against 4, and
    less than the bitmap's 2 bits per element of N up to about half of them); anything else is
    returned as it is.

    It applies exactly as the message it came from (the same elements, signs and tau), so it may be
    sent in its place. The whole message is validated first (MalformedMessageError as ``decode``
    raises it). Costs O(count), plus one pass over a bitmap's words. Nodes compact every update they
    send; a worker that counts its bytes compacts before it submits.
    """
    array = _as_message_array(message)
    check_too_short(array.shape[0])
    first, n, tau_bits, form = header = array[:HEADER_WORDS].tolist()
    check_header(header, array.shape[0])
    if form == PACKED:
        _check_packed(array, first, n, _NO_INDICES)
        return message
    if form == SPARSE:
        code, position = k.validate_sparse(array, n)
        if code != k.OK:
            raise MalformedMessageError(sparse_problem(code, position, int(array[position]), n))
    if form == BITMAP:
        words = array[HEADER_WORDS:].view(np.uint32)
        code, position, count = k.validate_bitmap(words, n)
        if code != k.OK:
            raise MalformedMessageError(bitmap_problem(code, position, n))
        if count >= WORD_ELEMENTS * words.shape[0]:  # at least 2 bits an element: never below the bitmap
            return message
        sparse = np.empty(HEADER_WORDS + count, dtype=np.int32)
        sparse[:HEADER_WORDS] = (count, n, tau_bits, SPARSE)
        k.bitmap_to_indices(np.ascontiguousarray(words).copy(), 0, words.shape[0], sparse, HEADER_WORDS)
    else:
        sparse = array
    rice, bits = rice_parameter(sparse)
    body_words = (bits + 31) // 32
    if HEADER_WORDS + body_words >= array.shape[0]:
        return message
    packed = np.zeros(HEADER_WORDS + body_words, dtype=np.int32)
    packed[:HEADER_WORDS] = sparse[:HEADER_WORDS]
    packed[HEADER_WORDS - 1] = PACKED
    k.pack_sparse(sparse, rice, packed[HEADER_WORDS:].view(np.uint32))
    return packed


def rice_parameter(sparse: np.ndarray) -> tuple[int, int]:
    """The Rice parameter k that packs a validated sparse message into the fewest bits, and those
    bits (the stream's, k's 5 included): a first guess from the mean gap (an element takes about
    k + 2.6 bits there), then its neighbours, moving on while one of them takes fewer (the size is
    convex in k). One pass over the message per three values of k, as a rule one in all."""
    count = sparse.shape[0] - HEADER_WORDS
    if count <= 0:
        return 0, RICE_K_BITS
    mean_gap = abs(int(sparse[-1])) / count
    centre = min(MAX_RICE_K - 1, max(1, int(math.log2(max(1.0, mean_gap * math.log(2))))))
    while True:
        below, at, above = k.packed_bits(sparse, centre)
        if below < at and centre > 1:
            centre -= 1
        elif above < at and centre < MAX_RICE_K - 1:
            centre += 1
        else:
            return min((below, centre - 1), (at, centre), (above, centre + 1))[::-1]


def sparse_problem(code: int, position: int, value: int, n: int) -> str:
    where = f"index #{position - HEADER_WORDS} (value {value})"
    if code == k.BAD_ZERO_INDEX:
        return f"sparse {where} is zero; indices are 1-based"
    if code == k.BAD_INDEX_RANGE:
        return f"sparse {where} is out of range for N={n}"
    return f"sparse {where} does not follow the previous index in ascending order"


def message_info(message: np.ndarray | bytes | bytearray | memoryview) -> MessageInfo:
    """Validate a whole message (header, length and body) and return its header fields.

    Raises MalformedMessageError naming what is wrong.
    """
    return parse_message(message, unpack=False)[1]


def decode(message: np.ndarray | bytes | bytearray | memoryview, target: np.ndarray,
           scale: float = 1.0) -> None:
    """Add +-tau * scale into `target` where the message says so.

    The whole message is validated first (length vs header, form, N vs target size, index range and
    order, no zero index, bitmap padding); a malformed one raises MalformedMessageError and `target`
    is left untouched. Sparse messages cost time proportional to their count, not to N.
    """
    check_vector(target, "target", writeable=True)
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    array, info = parse_message(message)
    if info.n != target.shape[0]:
        raise MalformedMessageError(
            f"message is for N={info.n} elements but the target has {target.shape[0]}")
    delta = target.dtype.type(info.tau * scale)  # info.tau is the float32 value, exactly
    if info.form != "bitmap":  # sparse, or packed (parsed into its sparse form: see _unpacked)
        k.apply_sparse(array, target, delta)
    else:
        k.apply_bitmap(array[HEADER_WORDS:].view(np.uint32), target, delta)


def decode_validated(message: np.ndarray, target: np.ndarray) -> None:
    """``decode`` for an int32 message whose body ``message_info`` already validated (the update
    intake checks each row once, as it arrives): the header is read again, the body is not walked a
    second time. Raises MalformedMessageError for a header that does not fit ``target``."""
    check_vector(target, "target", writeable=True)
    array = _as_message_array(message)
    check_too_short(array.shape[0])
    header = array[:HEADER_WORDS].tolist()
    tau = check_header(header, array.shape[0])
    if header[1] != target.shape[0]:
        raise MalformedMessageError(
            f"message is for N={header[1]} elements but the target has {target.shape[0]}")
    delta = target.dtype.type(tau)
    if header[3] == SPARSE:
        k.apply_sparse(array, target, delta)
    elif header[3] == PACKED:
        k.apply_sparse(_unpacked(array, header[0], header[1]), target, delta)
    else:
        k.apply_bitmap(array[HEADER_WORDS:].view(np.uint32), target, delta)


__all__ = [
    "MessageInfo",
    "bitmap_problem",
    "compact",
    "decode",
    "decode_validated",
    "message_info",
    "packed_problem",
    "parse_message",
    "rice_parameter",
    "sparse_problem",
]
