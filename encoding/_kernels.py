"""numba kernels of the threshold codec (private: the checked wrappers live in codec.py).

Every kernel has explicit signatures (compiled, or loaded from the on-disk cache, on first use) and the
same fixed options, set once in ``_kernel``. They trust their arguments: dtypes, contiguity and ranges
are checked by the Python wrappers.

Encoding (``encode_range``) is one pass over an element range: each block of ``BLOCK`` elements is
reduced to its largest |x| with a vectorized integer max over the floats' bits; only blocks that reach
tau are revisited (a vectorized 64-bit hit mask, then one step per hit) while still in cache. NaN/inf
stop the pass before their block is changed, and the original value of every changed element is
logged, so the caller can undo the pass exactly (``x - tau + tau`` would not always give ``x`` back).
A large vector is split into chunks encoded by threads (``nogil``), joined in order: the message is
identical to the one-thread message. ``encode_gap_range`` encodes an implicit residual unstored.
"""

from __future__ import annotations

import threading

from psrv.encoding._numba_cache import apply_cache_dir_from_env, install_content_keyed_locator
from psrv.encoding.update_header import HEADER_WORDS, WORD_ELEMENTS

apply_cache_dir_from_env()  # must run before numba is imported: numba reads NUMBA_CACHE_DIR at import

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import types  # noqa: E402
from numba.cpython.unsafe.numbers import trailing_zeros  # noqa: E402

install_content_keyed_locator()  # every copy of this source (an archive unpacked per executor): one compile

#: elements per block of the scan (one 64-bit hit mask); a multiple of 16, so blocks hold whole bitmap words
BLOCK = 64
# WORD_ELEMENTS: bitmap elements per int32 word (bit b = has a value, bit b + 16 = negative);
# HEADER_WORDS: the payload header. Both are the wire format's, defined in update_header.

# error codes of the validation kernels (0 = valid)
OK = 0
BAD_ZERO_INDEX = 1
BAD_INDEX_RANGE = 2
BAD_INDEX_ORDER = 3
BAD_SIGN_WITHOUT_VALUE = 4
BAD_PADDING = 5
BAD_TRUNCATED = 6  # packed: the body ends before its count of elements (or a varint runs past 5 bytes)
BAD_TRAILING = 7  # packed: bytes after the last element that are not the zero padding of its last word

KERNEL_OPTIONS = {"cache": True, "nogil": True, "fastmath": False, "boundscheck": False,
                  "error_model": "numpy"}


class _LazyKernel:
    """A kernel whose numba dispatcher is built on its first call (compiled, or loaded from the cache).

    Loading is deferred so ``import psrv.encoding`` stays cheap and a process pays only for the kernels
    it uses; the signatures are explicit all the same, so nothing is compiled for unexpected types.
    """

    def __init__(self, function, signatures) -> None:
        self.function = function
        self.signatures = signatures
        self.__name__ = function.__name__
        self.__doc__ = function.__doc__
        self._dispatcher = None
        self._lock = threading.Lock()

    @property
    def dispatcher(self):
        with self._lock:  # the encode threads may all reach a kernel's first call at once
            if self._dispatcher is None:
                self._dispatcher = numba.njit(self.signatures, **KERNEL_OPTIONS)(self.function)
        return self._dispatcher

    @property
    def loaded(self) -> bool:
        return self._dispatcher is not None

    def __call__(self, *args):
        dispatcher = self._dispatcher
        if dispatcher is None:
            dispatcher = self.dispatcher
        return dispatcher(*args)


def _kernel(signatures):
    """The one decorator of every kernel: explicit signatures and the fixed KERNEL_OPTIONS (disk cache,
    GIL released, strict IEEE math), built lazily."""
    return lambda function: _LazyKernel(function, signatures)


_f4a = types.Array(types.float32, 1, "C")
_f8a = types.Array(types.float64, 1, "C")
_i4a = types.Array(types.int32, 1, "C")
_i4r = types.Array(types.int32, 1, "C", readonly=True)  # messages may be read-only views of received bytes
_u4r = types.Array(types.uint32, 1, "C", readonly=True)
_u4a = types.Array(types.uint32, 1, "C")
_u8a = types.Array(types.uint64, 1, "C")
_u1r = types.Array(types.uint8, 1, "C", readonly=True)
_u1a = types.Array(types.uint8, 1, "C")
_i8 = types.int64
_pair = types.UniTuple(types.int64, 2)
_triple = types.Tuple((types.int64, types.int64, types.boolean))


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _block_masks(bits, abs_mask, tau_bits, lo, hi):
    """(value bits, sign bits) of the up to 64 elements of bits[lo:hi], bit j for element lo + j.

    |x| >= tau is (bits & abs_mask) >= tau_bits; x is negative when its sign bit is set, i.e.
    bits > abs_mask. A full block is a fixed 64-step loop, which LLVM vectorizes.
    """
    values = 0
    signs = 0
    block = bits[lo:hi]
    if hi - lo == BLOCK:
        for b in range(BLOCK):
            w = block[b]
            values |= (1 if (w & abs_mask) >= tau_bits else 0) << b
            signs |= (1 if w > abs_mask else 0) << b
    else:
        for b in range(hi - lo):
            w = block[b]
            values |= (1 if (w & abs_mask) >= tau_bits else 0) << b
            signs |= (1 if w > abs_mask else 0) << b
    return values, signs & values


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _write_block_words(words, lo, hi, values, signs):
    """Store the bitmap words of block [lo, hi) from its 64-bit masks."""
    first = lo // WORD_ELEMENTS
    for q in range((hi - lo + WORD_ELEMENTS - 1) // WORD_ELEMENTS):
        shift = q * WORD_ELEMENTS
        words[first + q] = ((values >> shift) & 0xFFFF) | (((signs >> shift) & 0xFFFF) << 16)


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _indices_to_bitmap(indices, count, words):
    for i in range(count):
        index = np.int64(indices[i])
        j = (index if index > 0 else -index) - 1
        bit = j % WORD_ELEMENTS
        words[j // WORD_ELEMENTS] |= (1 << bit) | ((1 if index < 0 else 0) << (bit + 16))


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _visit_block(x, bits, tau, abs_mask, tau_bits, lo, hi, indices, originals, words, count, bitmap_mode):
    """Encode the hits of x[lo:hi] (a block known to hold at least one); return (count, bitmap_mode)."""
    values, signs = _block_masks(bits, abs_mask, tau_bits, lo, hi)
    return _emit_hits(x, True, values, signs, tau, lo, hi, indices, originals, words, count, bitmap_mode)


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _emit_hits(x, subtract, values, signs, tau, lo, hi, indices, originals, words, count, bitmap_mode):
    """Write the hits of block [lo, hi) (its 64-bit masks) into the message and move each hit of ``x``
    by the value sent: ``subtract`` takes it off a residual, otherwise it is added, as decode adds it
    (x - (-tau) is exactly x + tau); return (count, bitmap_mode)."""
    if bitmap_mode:
        _write_block_words(words, lo, hi, values, signs)
    capacity = indices.shape[0]
    remaining = values
    while remaining:
        k = trailing_zeros(remaining)
        remaining &= remaining - 1
        j = lo + k
        negative = (signs >> k) & 1
        if not bitmap_mode:
            if count == capacity:  # a sparse message cannot hold more: switch to the bitmap
                _indices_to_bitmap(indices, count, words)
                _write_block_words(words, lo, hi, values, signs)
                bitmap_mode = True
            else:
                indices[count] = -(j + 1) if negative else j + 1
        v = x[j]
        originals[count] = v
        count += 1
        sent = -tau if negative else tau
        x[j] = v - sent if subtract else v + sent
    return count, bitmap_mode


@numba.njit(nogil=True, error_model="numpy")
def _first_bad(bits, abs_mask, inf_bits, lo, hi):
    for j in range(lo, hi):
        if (bits[j] & abs_mask) >= inf_bits:
            return j
    return -1


@_kernel([_triple(_f4a, _u4a, types.float32, types.uint32, types.uint32, types.uint32, _i8, _i8, _i4a, _f4a,
                  _u4a),
          _triple(_f8a, _u8a, types.float64, types.uint64, types.uint64, types.uint64, _i8, _i8, _i4a, _f8a,
                  _u4a)])
def encode_range(x, bits, tau, abs_mask, tau_bits, inf_bits, start, stop, indices, originals, words):
    """Encode x[start:stop] (start a multiple of 16) in one pass; return (count, first_bad, bitmap_mode).

    bits is x viewed as unsigned ints. Blocks of BLOCK elements are first reduced to their largest
    |x| (a fixed-length loop over a slice, which LLVM vectorizes); only blocks reaching tau are visited,
    while still in cache. A block holding NaN/inf stops the pass before it is touched:
    first_bad is then its first bad index (else -1) and the caller restores what was changed
    (restore_sparse / restore_bitmap).
    Hits go to `indices` (1-based signed, capacity len(indices)) until they would overflow it; then the
    range switches to bitmap mode: the indices so far become bits of `words` (the global bitmap, zero on
    entry) and the rest is written there directly. Every hit's original value is logged in `originals`.
    """
    count = 0
    bitmap_mode = False
    zero = tau_bits ^ tau_bits
    full_blocks = (stop - start) // BLOCK
    for i in range(full_blocks):
        lo = start + i * BLOCK
        block = bits[lo:lo + BLOCK]
        largest = zero
        for j in range(BLOCK):
            largest = max(largest, block[j] & abs_mask)
        if largest >= tau_bits:
            if largest >= inf_bits:
                return count, _first_bad(bits, abs_mask, inf_bits, lo, lo + BLOCK), bitmap_mode
            count, bitmap_mode = _visit_block(x, bits, tau, abs_mask, tau_bits, lo, lo + BLOCK, indices,
                                              originals, words, count, bitmap_mode)
    lo = start + full_blocks * BLOCK
    if lo < stop:
        largest = zero
        for j in range(lo, stop):
            largest = max(largest, bits[j] & abs_mask)
        if largest >= tau_bits:
            if largest >= inf_bits:
                return count, _first_bad(bits, abs_mask, inf_bits, lo, stop), bitmap_mode
            count, bitmap_mode = _visit_block(x, bits, tau, abs_mask, tau_bits, lo, stop, indices,
                                              originals, words, count, bitmap_mode)
    return count, -1, bitmap_mode


@_kernel([_triple(_f4a, _u4a, _f4a, _f4a, types.float32, types.uint32, types.uint32, types.uint32, _i8, _i8,
                  _i4a, _f4a, _u4a),
          _triple(_f8a, _u8a, _f8a, _f8a, types.float64, types.uint64, types.uint64, types.uint64, _i8, _i8,
                  _i4a, _f8a, _u4a)])
def add_difference_encode_range(x, bits, after, before, tau, abs_mask, tau_bits, inf_bits, start, stop,
                                indices, originals, words):
    """``x[start:stop] += after - before``, then encode_range's pass, block by block while in cache.

    Each block gets its sum first (the same rounding as a separate subtraction and addition), then is
    scanned and encoded exactly as encode_range does. A block holding NaN/inf stops the encoding; the
    rest of the range still gets its sum, so after the caller's restore the vector is exactly
    ``x + (after - before)``, as if the sum had been a pass of its own.
    """
    count = 0
    bitmap_mode = False
    zero = tau_bits ^ tau_bits
    lo = start
    while lo < stop:
        hi = min(lo + BLOCK, stop)
        largest = zero
        if hi - lo == BLOCK:  # fixed-length loops over slices, which LLVM vectorizes
            xs, a, b, w = x[lo:hi], after[lo:hi], before[lo:hi], bits[lo:hi]
            for j in range(BLOCK):
                xs[j] = xs[j] + (a[j] - b[j])
            for j in range(BLOCK):
                largest = max(largest, w[j] & abs_mask)
        else:
            for j in range(lo, hi):
                x[j] = x[j] + (after[j] - before[j])
            for j in range(lo, hi):
                largest = max(largest, bits[j] & abs_mask)
        if largest >= tau_bits:
            if largest >= inf_bits:
                for j in range(hi, stop):
                    x[j] = x[j] + (after[j] - before[j])
                return count, _first_bad(bits, abs_mask, inf_bits, lo, hi), bitmap_mode
            count, bitmap_mode = _visit_block(x, bits, tau, abs_mask, tau_bits, lo, hi, indices, originals,
                                              words, count, bitmap_mode)
        lo = hi
    return count, -1, bitmap_mode


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _visit_gap_block(live, gap_bits, tau, abs_mask, tau_bits, lo, hi, indices, originals, words, count,
                     bitmap_mode):
    """Encode the hits of a block whose gap (step - live) sits in gap_bits[0:hi - lo], adding each sent
    +-tau to live[lo:hi] as decode would; return (count, bitmap_mode)."""
    values, signs = _block_masks(gap_bits, abs_mask, tau_bits, 0, hi - lo)
    return _emit_hits(live, False, values, signs, tau, lo, hi, indices, originals, words, count, bitmap_mode)


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _clip_gap_block(step, live, limit, lo, hi):  # where |step - live| > limit: step = live +- limit
    for j in range(lo, hi):
        d = step[j] - live[j]
        if d > limit:
            step[j] = live[j] + limit
        elif d < -limit:
            step[j] = live[j] - limit


@_kernel([_triple(_f4a, _f4a, _f4a, _u4a, types.float32, types.uint32, types.uint32, types.uint32,
                  types.float32, types.uint32, _i8, _i8, _i4a, _f4a, _u4a),
          _triple(_f8a, _f8a, _f8a, _u8a, types.float64, types.uint64, types.uint64, types.uint64,
                  types.float64, types.uint64, _i8, _i8, _i4a, _f8a, _u4a)])
def encode_gap_range(step, live, gap, gap_bits, tau, abs_mask, tau_bits, inf_bits, limit, limit_bits, start,
                     stop, indices, originals, words):
    """Encode the gap ``step - live`` over [start, stop) without storing it, adding every sent +-tau to
    ``live`` in the same pass; return (count, first_bad, bitmap_mode) as encode_range does. Each block's
    gap goes to ``gap`` (BLOCK elements of scratch; ``gap_bits`` its bits); NaN/inf stops the pass before
    live changes there, and live's originals are logged for the caller's restore. With ``limit_bits``
    below ``inf_bits`` the gap left is also clipped to +-limit by moving ``step`` (clip_gap's arithmetic;
    not undone when a later block stops the pass); otherwise ``step`` is only read.
    """
    count = 0
    bitmap_mode = False
    zero = tau_bits ^ tau_bits
    clip = limit_bits < inf_bits
    visit_bits = limit_bits if clip and limit_bits < tau_bits else tau_bits
    lo = start
    while lo < stop:
        hi = min(lo + BLOCK, stop)
        largest = zero
        if hi - lo == BLOCK:  # fixed-length loops over slices, which LLVM vectorizes
            s, v = step[lo:hi], live[lo:hi]
            for j in range(BLOCK):
                gap[j] = s[j] - v[j]
            for j in range(BLOCK):
                largest = max(largest, gap_bits[j] & abs_mask)
        else:
            for j in range(hi - lo):
                gap[j] = step[lo + j] - live[lo + j]
            for j in range(hi - lo):
                largest = max(largest, gap_bits[j] & abs_mask)
        if largest >= visit_bits:
            if largest >= inf_bits:
                return count, lo + _first_bad(gap_bits, abs_mask, inf_bits, 0, hi - lo), bitmap_mode
            if largest >= tau_bits:
                count, bitmap_mode = _visit_gap_block(live, gap_bits, tau, abs_mask, tau_bits, lo, hi,
                                                      indices, originals, words, count, bitmap_mode)
            if clip and limit_bits < tau_bits:  # gaps below tau may exceed the limit too
                _clip_gap_block(step, live, limit, lo, hi)
            elif clip:  # only the sent elements can: the others' gap is below tau, their live unchanged
                hits = _block_masks(gap_bits, abs_mask, tau_bits, 0, hi - lo)[0]
                while hits:
                    j = lo + trailing_zeros(hits)
                    hits &= hits - 1
                    _clip_gap_block(step, live, limit, j, j + 1)
        lo = hi
    return count, -1, bitmap_mode


@_kernel([types.void(_f4a, _f4a, types.float32), types.void(_f8a, _f8a, types.float64)])
def clip_gap(step, live, limit):
    """Clip the gap ``step - live`` to +-limit by moving ``step`` where it is beyond."""
    _clip_gap_block(step, live, limit, 0, step.shape[0])


@_kernel([types.void(_f4a, _f4a, _f4a, _i8, _i8), types.void(_f8a, _f8a, _f8a, _i8, _i8)])
def add_difference_range(x, after, before, start, stop):
    """``x[start:stop] += after - before`` in one pass (no temporary for the difference)."""
    for j in range(start, stop):
        x[j] = x[j] + (after[j] - before[j])


@_kernel([types.void(_f4a, _f4a, _f4a, _f4a), types.void(_f8a, _f8a, _f8a, _f8a)])
def add_to_both(a, b, first, second):
    """``first[:] = second[:] = a + b``: one read of each source for two copies of the sum."""
    for j in range(a.shape[0]):
        v = a[j] + b[j]
        first[j] = v
        second[j] = v


@_kernel([types.void(_f4a, _f4a, _f4a), types.void(_f8a, _f8a, _f8a)])
def copy_to_both(source, first, second):
    """``first[:] = second[:] = source``: one read of the source for two copies."""
    for j in range(source.shape[0]):
        v = source[j]
        first[j] = v
        second[j] = v


@_kernel([types.void(_i4a, _i8, _u4a)])
def indices_to_bitmap(indices, count, words):
    """Set the bitmap bits of the first `count` signed 1-based indices."""
    _indices_to_bitmap(indices, count, words)


@_kernel([_i8(_u4a, _i8, _i8, _i4a, _i8)])
def bitmap_to_indices(words, first_word, stop_word, out, pos):
    """Write the signed 1-based indices of words[first_word:stop_word] into out from pos; return next pos."""
    for w in range(first_word, stop_word):
        v = np.int64(words[w])
        values = v & 0xFFFF
        while values:
            k = trailing_zeros(values)
            values &= values - 1
            j = w * WORD_ELEMENTS + k + 1
            out[pos] = -j if (v >> (k + 16)) & 1 else j
            pos += 1
    return pos


@_kernel([types.void(_f4a, _i4a, _i8, _f4a), types.void(_f8a, _i4a, _i8, _f8a)])
def restore_sparse(x, indices, count, originals):
    """Undo encode_range in sparse mode: put the logged originals back."""
    for i in range(count):
        index = np.int64(indices[i])
        x[(index if index > 0 else -index) - 1] = originals[i]


@_kernel([types.void(_f4a, _u4a, _i8, _i8, _f4a), types.void(_f8a, _u4a, _i8, _i8, _f8a)])
def restore_bitmap(x, words, first_word, stop_word, originals):
    """Undo encode_range in bitmap mode: the set bits, in ascending order, match the logged originals."""
    i = 0
    for w in range(first_word, stop_word):
        values = np.int64(words[w]) & 0xFFFF
        while values:
            k = trailing_zeros(values)
            values &= values - 1
            x[w * WORD_ELEMENTS + k] = originals[i]
            i += 1


@_kernel([_pair(_i4r, _i8)])
def validate_sparse(message, n):
    """Check the indices of a sparse message: nonzero, |i| <= n, strictly ascending |i|. (code, position)."""
    previous = 0
    for p in range(HEADER_WORDS, message.shape[0]):
        i = np.int64(message[p])
        if i == 0:
            return BAD_ZERO_INDEX, p
        a = -i if i < 0 else i
        if a > n:
            return BAD_INDEX_RANGE, p
        if a <= previous:
            return BAD_INDEX_ORDER, p
        previous = a
    return OK, -1


@_kernel([types.UniTuple(types.int64, 3)(_u4r, _i8)])
def validate_bitmap(words, n):
    """Check bitmap words: a sign bit only beside its value bit, no bit beyond element n.

    Returns (code, word, count): count is the number of value bits, valid only when code is OK.
    """
    total = 0
    for w in range(words.shape[0]):
        v = np.int64(words[w])
        if (v >> 16) & ~(v & 0xFFFF):
            return BAD_SIGN_WITHOUT_VALUE, w, 0
        v &= 0xFFFF
        v = v - ((v >> 1) & 0x5555)
        v = (v & 0x3333) + ((v >> 2) & 0x3333)
        v = (v + (v >> 4)) & 0x0F0F
        total += (v + (v >> 8)) & 0x1F
    tail = n % WORD_ELEMENTS
    if tail and words.shape[0] > 0:
        used = (1 << tail) - 1
        v = np.int64(words[words.shape[0] - 1])
        if (v & 0xFFFF) & ~used:
            return BAD_PADDING, words.shape[0] - 1, 0
    return OK, -1, total


@_kernel([types.void(_i4r, _f4a, types.float32), types.void(_i4r, _f8a, types.float64)])
def apply_sparse(message, target, delta):
    """target[|i|-1] += sign(i) * delta for every index of a validated sparse message."""
    for p in range(HEADER_WORDS, message.shape[0]):
        i = np.int64(message[p])
        if i > 0:
            target[i - 1] += delta
        else:
            target[-i - 1] -= delta


@_kernel([types.void(_u4r, _f4a, types.float32), types.void(_u4r, _f8a, types.float64)])
def apply_bitmap(words, target, delta):
    """Add +-delta where a validated bitmap sets a value."""
    for w in range(words.shape[0]):
        v = np.int64(words[w])
        if v == 0:
            continue
        base = w * WORD_ELEMENTS
        for k in range(WORD_ELEMENTS):
            if (v >> k) & 1:
                if (v >> (k + 16)) & 1:
                    target[base + k] -= delta
                else:
                    target[base + k] += delta


# ------------------------------------------------------------------ the packed form
# Each element of a sparse message becomes one LEB128 varint of (gap << 1) | negative, the gap being
# its 1-based index minus the previous element's (the first: minus 0), so a gap is >= 1 and a varint
# takes 1 byte for gaps below 64, 2 below 8192, at most 5.


@_kernel([_i8(_i4r)])
def packed_size(message):
    """Bytes the packed body of a validated sparse message takes (its indices, not its header)."""
    total = 0
    previous = 0
    for p in range(HEADER_WORDS, message.shape[0]):
        i = np.int64(message[p])
        a = -i if i < 0 else i
        v = (a - previous) >> 6
        previous = a
        total += 1
        while v:
            total += 1
            v >>= 7
    return total


@_kernel([types.void(_i4r, _u1a)])
def pack_sparse(message, out):
    """Write the packed body of a validated sparse message into out (packed_size bytes, zero after)."""
    pos = 0
    previous = 0
    for p in range(HEADER_WORDS, message.shape[0]):
        i = np.int64(message[p])
        a = -i if i < 0 else i
        v = ((a - previous) << 1) | (1 if i < 0 else 0)
        previous = a
        while v >= 0x80:
            out[pos] = np.uint8((v & 0x7F) | 0x80)
            pos += 1
            v >>= 7
        out[pos] = np.uint8(v)
        pos += 1


@_kernel([_pair(_u1r, _i8, _i8, _i4a)])
def unpack_packed(body, count, n, out):
    """Check a packed body of ``count`` elements for a vector of n and write its signed 1-based
    indices into out[:count] (an empty out: only check). Returns (code, element) with the element where
    a problem was found."""
    write = out.shape[0] > 0
    pos = 0
    size = body.shape[0]
    previous = 0
    for e in range(count):
        v = 0
        shift = 0
        while True:
            if pos >= size or shift > 28:
                return BAD_TRUNCATED, e
            b = np.int64(body[pos])
            pos += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        gap = v >> 1
        if gap == 0:
            return (BAD_ZERO_INDEX if e == 0 else BAD_INDEX_ORDER), e
        a = previous + gap
        if a > n:
            return BAD_INDEX_RANGE, e
        previous = a
        if write:
            out[e] = -a if v & 1 else a
    if size - pos > 3:
        return BAD_TRAILING, count
    for q in range(pos, size):
        if body[q] != 0:
            return BAD_TRAILING, count
    return OK, -1


def load_all() -> None:
    """Build every kernel now (e.g. to fill the on-disk cache before workers start)."""
    for kernel in ALL_KERNELS:
        _ = kernel.dispatcher


ALL_KERNELS = (encode_range, add_difference_encode_range, encode_gap_range, clip_gap, add_difference_range,
               copy_to_both, add_to_both, indices_to_bitmap, bitmap_to_indices, restore_sparse,
               restore_bitmap, validate_sparse, validate_bitmap, apply_sparse, apply_bitmap, packed_size,
               pack_sparse, unpack_packed)
#: per float dtype: (unsigned view dtype, mask clearing the sign bit, bits of +inf)
BIT_VIEWS = {
    np.dtype(np.float32): (np.dtype(np.uint32), np.uint32(0x7FFF_FFFF), np.uint32(0x7F80_0000)),
    np.dtype(np.float64): (np.dtype(np.uint64), np.uint64(0x7FFF_FFFF_FFFF_FFFF),
                           np.uint64(0x7FF0_0000_0000_0000)),
}
