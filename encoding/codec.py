"""Threshold encoding of a residual vector into a sparse or bitmap int32 message.

Wire forms (int32, little-endian); the encoder returns the smaller of the first two (sparse while
count < ceil(N/16)), and ``psrv.encoding.messages.compact`` turns either into the third where that is
smaller still:

* sparse: ``[count, N, float32-bits(tau), 0]`` then ``count`` 1-based signed indices in ascending
  order: ``i + 1`` for +tau, ``-(i + 1)`` for -tau;
* bitmap: ``[N, N, float32-bits(tau), 1]`` then ceil(N/16) words; word k covers elements 16k..16k+15:
  bit b means "has a value", bit b + 16 means "negative";
* packed: ``[count, N, float32-bits(tau), 2]`` then a Golomb-Rice code of the elements, a stream of
  bits read from the body's int32 words, low bit first: the parameter k in 5 bits (0..31), then per
  element in ascending order ``(gap - 1) >> k`` one bits and a zero bit, the low k bits of
  ``gap - 1``, and the sign bit (1 for -tau), where gap is the element's 1-based index minus the
  previous element's (the first element's: minus 0); zero bits up to the end of the last word. The
  writer takes the k that gives the fewest bits (near log2 of the mean gap): an element takes about
  k + 2.6 bits, 7.6 at 3 % of the elements and 12.5 at 0.1 %, where the sparse form takes 32 and the
  bitmap 2N bits in all (a packed message is smaller than the bitmap up to about half the elements).
  This is the form updates travel in.

tau is rounded to float32 before it is used, so the sender and every receiver apply the same value.
Reading a message (validating, describing, compacting to the packed form, decoding) is
``psrv.encoding.messages``. The header rules (and the fields an update carries beside its message)
are defined once, in ``psrv.encoding.update_header``.
"""

from __future__ import annotations

import math
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np
from psrv.encoding import _kernels as k
from psrv.encoding.errors import NonFiniteResidualError
from psrv.encoding.update_header import (  # the wire format's header, defined there once
    BITMAP,
    HEADER_WORDS,
    SPARSE,
    WORD_ELEMENTS,
    bitmap_words,
)

#: below this many elements per thread, encode(threads > 1) runs on one thread (threads cost more)
PARALLEL_MIN_ELEMENTS_PER_THREAD = 1 << 21

_FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


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


def check_vector(array: np.ndarray, name: str, *, writeable: bool) -> None:
    """A float32/float64, 1-D, C-contiguous, aligned array (writeable if asked), or a clear error."""
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
    check_vector(residual, "residual", writeable=True)
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
    check_vector(first, first_name, writeable=True)
    check_vector(second, second_name, writeable=True)
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
    check_vector(source, "source", writeable=True)
    for name, array in (("first", first), ("second", second)):
        check_vector(array, name, writeable=True)
        if array.dtype != source.dtype or array.shape != source.shape:
            raise ValueError(f"{name} must match the source ({source.dtype}{list(source.shape)}), "
                             f"got {array.dtype}{list(array.shape)}")
    k.copy_to_both(source, first, second)


def add_to_both(source: np.ndarray, addend: np.ndarray, first: np.ndarray, second: np.ndarray) -> None:
    """``first[:] = second[:] = source + addend`` in one pass: how a step that starts where the worker's
    own unsent updates have taken it loads the live parameters plus its residual into its snapshot and
    its step buffer."""
    check_vector(source, "source", writeable=True)
    for name, array in (("addend", addend), ("first", first), ("second", second)):
        check_vector(array, name, writeable=True)
        if array.dtype != source.dtype or array.shape != source.shape:
            raise ValueError(f"{name} must match the source ({source.dtype}{list(source.shape)}), "
                             f"got {array.dtype}{list(array.shape)}")
    k.add_to_both(source, addend, first, second)


def _check_difference(residual: np.ndarray, after: np.ndarray, before: np.ndarray) -> None:
    check_vector(residual, "residual", writeable=True)
    for name, array in (("after", after), ("before", before)):
        check_vector(array, name, writeable=True)  # the kernels take writeable arrays (never written)
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


__all__ = [
    "PARALLEL_MIN_ELEMENTS_PER_THREAD",
    "add_difference",
    "add_difference_encode_counted",
    "check_vector",
    "copy_to_both",
    "clip_gap",
    "encode",
    "encode_counted",
    "encode_gap_counted",
    "float32_bits",
    "float32_threshold",
    "sparse_message",
]
