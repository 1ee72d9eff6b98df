"""Threshold encoding of a residual vector into a sparse or bitmap int32 message, and its decoding.

Wire forms (int32, little-endian); the encoder returns the smaller of the first two (sparse while
count < ceil(N/16)), and ``compact`` turns either into the third where that is smaller still:

* sparse: ``[count, N, float32-bits(tau), 0]`` then ``count`` 1-based signed indices in ascending
  order: ``i + 1`` for +tau, ``-(i + 1)`` for -tau;
* bitmap: ``[N, N, float32-bits(tau), 1]`` then ceil(N/16) words; word k covers elements 16k..16k+15:
  bit b means "has a value", bit b + 16 means "negative";
* packed: ``[count, N, float32-bits(tau), 2]`` then, per element in ascending order, one LEB128
  varint (7 bits per byte, low bits first, the high bit set on every byte but the last) of
  ``(gap << 1) | negative``, where gap is the element's 1-based index minus the previous element's
  (the first element's: minus 0); the bytes are zero-padded to a whole int32 word. An element takes
  1 byte while the gap is below 64 and 2 below 8,192: about 1.5 bytes at 1 % of the elements, where
  the sparse form takes 4 and the bitmap N/4 bytes in all. This is the form updates travel in.

tau is rounded to float32 before it is used, so the sender and every receiver apply the same value.
The header rules (and the fields an update carries beside its message) are defined once, in
``psrv.encoding.update_header``.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
from psrv.encoding import _kernels as k
from psrv.encoding.errors import MalformedMessageError, NonFiniteResidualError
from psrv.encoding.update_header import (  # the wire format's header, defined there once
    BITMAP,
    FORM_NAMES,
    HEADER_WORDS,
    PACKED,
    SPARSE,
    WORD_ELEMENTS,
    bitmap_words,
    check_header,
    check_too_short,
)

#: below this many elements per thread, encode(threads > 1) runs on one thread (threads cost more)
PARALLEL_MIN_ELEMENTS_PER_THREAD = 1 << 21

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
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


def float32_threshold(threshold: float) -> np.float32:
    """The threshold as the float32 the wire carries; it must stay positive and finite."""
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        raise TypeError(f"threshold must be a real number, got {threshold!r}") from None
    with np.errstate(over="ignore"):
        tau = np.float32(value)
    if not (math.isfinite(value) and np.isfinite(tau) and tau > 0):
        raise ValueError(f"threshold must be positive and finite as a float32, got {threshold!r} "
                         f"(float32: {tau!r})")
    return tau


def float32_bits(tau: np.float32) -> np.int32:
    """The float32 bit pattern of tau as the header's int32 word."""
    return np.array([tau], dtype=np.float32).view(np.int32)[0]


def _check_vector(array: np.ndarray, name: str, *, writeable: bool) -> None:
    if not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(array).__name__}")
    if array.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"{name} must be float32 or float64, got dtype {array.dtype}")
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if not array.flags.c_contiguous or not array.flags.aligned:
        raise ValueError(f"{name} must be C-contiguous and aligned (use np.ascontiguousarray)")
    if writeable and not array.flags.writeable:
        raise ValueError(f"{name} must be writeable")


@lru_cache(maxsize=8)
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="psrv-encode")


def _chunks(n: int, threads: int) -> list[tuple[int, int]]:
    """Split [0, n) into at most `threads` ranges whose starts are multiples of the kernels' block."""
    threads = max(1, min(threads, n // PARALLEL_MIN_ELEMENTS_PER_THREAD))
    step = -(-n // threads)
    step = -(-step // k.BLOCK) * k.BLOCK
    return [(start, min(start + step, n)) for start in range(0, n, step)]


def encode(residual: np.ndarray, threshold: float, *, threads: int = 1) -> np.ndarray | None:
    """Threshold-encode `residual` in place; return the int32 message, or None when nothing reached tau.

    Every element with |r| >= tau (tau = float32(threshold)) is emitted as +-tau and tau is subtracted
    from it, once per call. With `threads` > 1 a large vector is split into chunks encoded in parallel;
    the message is identical to the one-thread message. A NaN or inf raises NonFiniteResidualError
    naming the first bad index, with nothing emitted and the residual unchanged.
    """
    return encode_counted(residual, threshold, threads=threads)[0]


def encode_counted(residual: np.ndarray, threshold: float, *,
                   threads: int = 1) -> tuple[np.ndarray | None, int]:
    """encode(), also returning how many elements the message carries (0 with None)."""
    _check_vector(residual, "residual", writeable=True)
    return _encode(residual, threshold, threads, None)


def add_difference_encode_counted(residual: np.ndarray, after: np.ndarray, before: np.ndarray,
                                  threshold: float, *, threads: int = 1) -> tuple[np.ndarray | None, int]:
    """``residual += after - before``, then ``encode_counted(residual, threshold)``, in one pass.

    The message, the count and the residual are bit for bit those of the two steps done apart (an
    optimizer's step taken as the difference of its parameters after and before, without writing the
    difference anywhere). A NaN or inf raises NonFiniteResidualError as ``encode`` does, with the
    difference added and nothing emitted. ``after`` and ``before`` must have the residual's dtype and
    length.
    """
    _check_difference(residual, after, before)
    return _encode(residual, threshold, threads, (after, before))


def encode_gap_counted(step: np.ndarray, live: np.ndarray, threshold: float, *, threads: int = 1,
                       clip: float | None = None) -> tuple[np.ndarray | None, int]:
    """Encode the gap ``step - live`` (an implicit residual, never written) and apply the message to
    ``live`` in the same pass; returns (message or None, count).

    The message is byte for byte ``encode_counted(step - live, threshold)`` and ``live`` ends bit for
    bit as ``decode(message, live)`` leaves it, so the gap afterwards is the residual left after the
    send. ``step`` is only read, unless ``clip`` is given: then the gap left is clipped to +-clip in
    the same pass, bit for bit as ``clip_gap(step, live, clip)`` afterwards. A NaN or inf gap raises
    NonFiniteResidualError as ``encode`` does, with nothing emitted and ``live`` unchanged (``step``
    may be clipped before the bad element).
    """
    _check_pair(step, live, "step", "live")
    if clip is not None and not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip must be positive and finite, got {clip!r}")
    return _encode(live, threshold, threads, None, gap_of=step, clip=clip)


def clip_gap(step: np.ndarray, live: np.ndarray, limit: float) -> None:
    """Clip the gap ``step - live`` to [-limit, limit] by moving ``step`` where it is beyond (one pass;
    ``step`` is written only there): residual clipping of an implicit residual."""
    _check_pair(step, live, "step", "live")
    k.clip_gap(step, live, step.dtype.type(limit))


def _check_pair(first: np.ndarray, second: np.ndarray, first_name: str, second_name: str) -> None:
    _check_vector(first, first_name, writeable=True)
    _check_vector(second, second_name, writeable=True)
    if second.dtype != first.dtype or second.shape != first.shape:
        raise ValueError(f"{second_name} must match {first_name} ({first.dtype}{list(first.shape)}), got "
                         f"{second.dtype}{list(second.shape)}")


def add_difference(residual: np.ndarray, after: np.ndarray, before: np.ndarray) -> None:
    """``residual += after - before`` in one pass, rounded as the two operations apart."""
    _check_difference(residual, after, before)
    k.add_difference_range(residual, after, before, 0, residual.shape[0])


def copy_to_both(source: np.ndarray, first: np.ndarray, second: np.ndarray) -> None:
    """``first[:] = source; second[:] = source`` with one read of ``source``: how a step loads the
    live parameters into its snapshot and its step buffer in one pass."""
    _check_vector(source, "source", writeable=True)
    for name, array in (("first", first), ("second", second)):
        _check_vector(array, name, writeable=True)
        if array.dtype != source.dtype or array.shape != source.shape:
            raise ValueError(f"{name} must match the source ({source.dtype}{list(source.shape)}), "
                             f"got {array.dtype}{list(array.shape)}")
    k.copy_to_both(source, first, second)


def add_to_both(source: np.ndarray, addend: np.ndarray, first: np.ndarray, second: np.ndarray) -> None:
    """``first[:] = second[:] = source + addend`` in one pass: how a step that starts where the worker's
    own unsent updates have taken it loads the live parameters plus its residual into its snapshot and
    its step buffer."""
    _check_vector(source, "source", writeable=True)
    for name, array in (("addend", addend), ("first", first), ("second", second)):
        _check_vector(array, name, writeable=True)
        if array.dtype != source.dtype or array.shape != source.shape:
            raise ValueError(f"{name} must match the source ({source.dtype}{list(source.shape)}), "
                             f"got {array.dtype}{list(array.shape)}")
    k.add_to_both(source, addend, first, second)


def _check_difference(residual: np.ndarray, after: np.ndarray, before: np.ndarray) -> None:
    _check_vector(residual, "residual", writeable=True)
    for name, array in (("after", after), ("before", before)):
        _check_vector(array, name, writeable=True)  # the kernels take writeable arrays (never written)
        if array.dtype != residual.dtype or array.shape != residual.shape:
            raise ValueError(f"{name} must match the residual ({residual.dtype}{list(residual.shape)}), "
                             f"got {array.dtype}{list(array.shape)}")


def _encode(residual: np.ndarray, threshold: float, threads: int,
            difference: tuple[np.ndarray, np.ndarray] | None, *, gap_of: np.ndarray | None = None,
            clip: float | None = None) -> tuple[np.ndarray | None, int]:
    """encode_counted's body; with ``difference`` (after, before) each chunk adds it first; with
    ``gap_of`` the encoded vector is ``gap_of - residual`` and ``residual`` (the live parameters) gets
    the message added instead of subtracted."""
    if not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    tau32 = float32_threshold(threshold)
    n = residual.shape[0]
    if n == 0:
        return None, 0
    if n >= 2**31:
        raise ValueError(f"residual has {n} elements; the wire format holds at most 2**31 - 1")
    tau = residual.dtype.type(tau32)
    bits_dtype, abs_mask, inf_bits = k.BIT_VIEWS[residual.dtype]
    bits = residual.view(bits_dtype)
    tau_bits = np.array([tau]).view(bits_dtype)[0]
    words = bitmap_words(n)
    chunks = _chunks(n, threads)
    indices, originals, bitmap = _scratch(n, residual.dtype)
    word_ranges = [(lo // WORD_ELEMENTS, -(-hi // WORD_ELEMENTS)) for lo, hi in chunks]
    gaps = np.empty((len(chunks), k.BLOCK), dtype=residual.dtype) \
        if gap_of is not None else None
    limit = residual.dtype.type(np.inf if clip is None else clip)
    limit_bits = inf_bits if clip is None else np.array([limit]).view(bits_dtype)[0]

    def run_chunk(c: int) -> tuple[int, int, bool]:
        (lo, hi), (w0, w1) = chunks[c], word_ranges[c]
        if gaps is not None:
            gap = gaps[c]
            return k.encode_gap_range(gap_of, residual, gap, gap.view(bits_dtype), tau, abs_mask,
                                      tau_bits, inf_bits, limit, limit_bits, lo, hi, indices[w0:w1],
                                      originals[lo:hi], bitmap)
        if difference is not None:
            return k.add_difference_encode_range(residual, bits, difference[0], difference[1], tau, abs_mask,
                                                 tau_bits, inf_bits, lo, hi, indices[w0:w1], originals[lo:hi],
                                                 bitmap)
        return k.encode_range(residual, bits, tau, abs_mask, tau_bits, inf_bits, lo, hi, indices[w0:w1],
                              originals[lo:hi], bitmap)

    run = map if len(chunks) == 1 else _pool(len(chunks)).map
    results = list(run(run_chunk, range(len(chunks))))

    bad = [first_bad for _, first_bad, _ in results if first_bad >= 0]
    if bad:
        for c, (count, _, bitmap_mode) in enumerate(results):
            (lo, hi), (w0, w1) = chunks[c], word_ranges[c]
            if bitmap_mode:
                k.restore_bitmap(residual, bitmap, w0, w1, originals[lo:hi])
            else:
                k.restore_sparse(residual, indices[w0:w1], count, originals[lo:hi])
        _clear_bitmap(bitmap, results, word_ranges)
        value = residual[bad[0]] if gap_of is None else gap_of[bad[0]] - residual[bad[0]]
        raise NonFiniteResidualError(int(bad[0]), float(value))

    total = sum(count for count, _, _ in results)
    if total == 0:
        return None, 0
    if total < words:
        message = np.empty(HEADER_WORDS + total, dtype=np.int32)
        message[:HEADER_WORDS] = (total, n, float32_bits(tau32), SPARSE)
        pos = HEADER_WORDS
        for c, (count, _, bitmap_mode) in enumerate(results):
            w0, w1 = word_ranges[c]
            if bitmap_mode:
                pos = k.bitmap_to_indices(bitmap, w0, w1, message, pos)
            else:
                message[pos:pos + count] = indices[w0:w0 + count]
                pos += count
        _clear_bitmap(bitmap, results, word_ranges)
        return message, total
    for c, (count, _, bitmap_mode) in enumerate(results):
        if not bitmap_mode:
            w0, w1 = word_ranges[c]
            k.indices_to_bitmap(indices[w0:w1], count, bitmap)
    message = np.empty(HEADER_WORDS + words, dtype=np.int32)
    message[:HEADER_WORDS] = (n, n, float32_bits(tau32), BITMAP)
    message[HEADER_WORDS:] = bitmap.view(np.int32)
    bitmap[:] = 0
    return message, total


def sparse_message(indices: np.ndarray, negative: np.ndarray, n: int, threshold: float) -> np.ndarray:
    """The sparse-form message carrying +-tau at ``indices`` (strictly ascending, in [0, n)) of a
    vector of ``n`` elements; ``negative[i]`` gives index i the sign -tau. Costs O(len(indices)),
    not O(n): what a generator of synthetic updates (or a sparse producer) uses instead of encoding
    a dense residual. Raises ValueError for indices that are unsorted, repeated or out of range."""
    tau32 = float32_threshold(threshold)
    if not 0 < n < 2**31:
        raise ValueError(f"n must be in [1, 2**31 - 1], got {n}")
    idx = np.asarray(indices)
    neg = np.asarray(negative, dtype=bool)
    if idx.ndim != 1 or neg.shape != idx.shape or idx.dtype.kind not in "iu":
        raise ValueError(f"indices must be a 1-D int array and negative a bool array of the same shape, "
                         f"got {idx.dtype}{list(idx.shape)} and {neg.dtype}{list(neg.shape)}")
    count = idx.shape[0]
    if count and (idx[0] < 0 or idx[-1] >= n or (count > 1 and np.any(idx[1:] <= idx[:-1]))):
        raise ValueError(f"indices must be strictly ascending within [0, {n}), got {idx[:8]}...")
    if count >= bitmap_words(n):
        raise ValueError(f"{count} of {n} elements is denser than the sparse form holds "
                         f"(fewer than {bitmap_words(n)}); encode a dense residual instead")
    message = np.empty(HEADER_WORDS + count, dtype=np.int32)
    message[:HEADER_WORDS] = (count, n, float32_bits(tau32), SPARSE)
    body = message[HEADER_WORDS:]
    np.add(idx, 1, out=body, casting="unsafe")
    np.negative(body, out=body, where=neg)
    return message


_local = threading.local()
_SCRATCH_SIZES_KEPT = 4


def _scratch(n: int, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-thread work buffers for a vector of n elements, reused across calls.

    indices (one slot per bitmap word: a sparse message never needs more), the log of original values
    (n; only the first `count` entries are ever written, so only those pages become resident) and a
    bitmap that is all zero between calls. Reuse spares page faults that cost more than a sparse encode.
    """
    cache = getattr(_local, "scratch", None)
    if cache is None:
        cache = _local.scratch = {}
    key = (n, dtype)
    buffers = cache.pop(key, None)
    if buffers is None:
        words = bitmap_words(n)
        buffers = (np.empty(words, dtype=np.int32), np.empty(n, dtype=dtype),
                   np.zeros(words, dtype=np.uint32))
        while len(cache) >= _SCRATCH_SIZES_KEPT:
            cache.pop(next(iter(cache)))
    cache[key] = buffers  # most recently used last
    return buffers


def _clear_bitmap(bitmap: np.ndarray, results, word_ranges) -> None:
    """Zero the parts of the shared bitmap that chunks in bitmap mode wrote."""
    for (_, _, bitmap_mode), (w0, w1) in zip(results, word_ranges, strict=True):
        if bitmap_mode:
            bitmap[w0:w1] = 0


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
    code, element = k.unpack_packed(array[HEADER_WORDS:].view(np.uint8), count, n, indices)
    if code != k.OK:
        raise MalformedMessageError(packed_problem(code, element, count, n))
    return array


def _unpacked(array: np.ndarray, count: int, n: int) -> np.ndarray:
    """The sparse message of a packed one (header checked), its body validated on the way.

    Packed bodies are applied through this: a varint's length is a branch the CPU cannot predict, and
    applying straight from the varints ties every scattered add to that chain (measured: 2.5x the
    sparse apply at 1 % of 16 M elements); unpacked first, the adds overlap as a sparse message's do."""
    sparse = np.empty(HEADER_WORDS + count, dtype=np.int32)
    sparse[:HEADER_WORDS] = array[:HEADER_WORDS]
    sparse[HEADER_WORDS - 1] = SPARSE
    _check_packed(array, count, n, sparse[HEADER_WORDS:])
    return sparse


def packed_problem(code: int, element: int, count: int, n: int) -> str:
    if code == k.BAD_TRUNCATED:
        return f"packed element #{element} of {count} runs past the body's end or past 5 bytes"
    if code == k.BAD_TRAILING:
        return f"packed body has bytes after its {count} elements beyond the zero padding of its last word"
    if code == k.BAD_ZERO_INDEX:
        return "packed element #0 has index zero; indices are 1-based"
    if code == k.BAD_INDEX_RANGE:
        return f"packed element #{element} is out of range for N={n}"
    return f"packed element #{element} does not follow the previous index in ascending order (gap 0)"


def compact(message: np.ndarray) -> np.ndarray:
    """The message in its smallest wire form: a sparse or bitmap message becomes packed where that
    takes fewer bytes (almost always: 1-2 bytes an element against 4, or against N/4 bytes for a
    bitmap below about a quarter of the elements); anything else is returned as it is.

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
        if count >= 4 * words.shape[0]:  # at least a byte an element: never smaller than the bitmap
            return message
        sparse = np.empty(HEADER_WORDS + count, dtype=np.int32)
        sparse[:HEADER_WORDS] = (count, n, tau_bits, SPARSE)
        k.bitmap_to_indices(np.ascontiguousarray(words).copy(), 0, words.shape[0], sparse, HEADER_WORDS)
    else:
        sparse = array
    size = k.packed_size(sparse)
    body_words = (size + 3) // 4
    if HEADER_WORDS + body_words >= array.shape[0]:
        return message
    packed = np.zeros(HEADER_WORDS + body_words, dtype=np.int32)
    packed[:HEADER_WORDS] = sparse[:HEADER_WORDS]
    packed[HEADER_WORDS - 1] = PACKED
    k.pack_sparse(sparse, packed[HEADER_WORDS:].view(np.uint8))
    return packed


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
    _check_vector(target, "target", writeable=True)
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
    _check_vector(target, "target", writeable=True)
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
    "PARALLEL_MIN_ELEMENTS_PER_THREAD",
    "add_difference",
    "add_difference_encode_counted",
    "copy_to_both",
    "bitmap_problem",
    "clip_gap",
    "compact",
    "decode",
    "decode_validated",
    "encode",
    "encode_counted",
    "encode_gap_counted",
    "float32_bits",
    "float32_threshold",
    "message_info",
    "packed_problem",
    "parse_message",
    "sparse_message",
    "sparse_problem",
]
