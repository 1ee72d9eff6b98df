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
from psrv.encoding.update_header import HEADER_WORDS, RICE_K_BITS, WORD_ELEMENTS

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
BAD_TRUNCATED = 6  # packed: the body ends before its count of elements
BAD_TRAILING = 7  # packed: bits after the last element, or a whole word of padding

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
# A Golomb-Rice code of the index gaps, as a stream of bits read from the body's int32 words, low bit
# first: 5 bits of the parameter k (0..31), then per element (gap - 1) >> k as that many one bits and
# a zero bit, the low k bits of gap - 1, and the sign bit (1: -tau); zero bits up to the word's end. A
# gap is the element's 1-based index minus the previous element's (the first: minus 0), so it is >= 1
# and the indices ascend by construction. With k near log2 of the mean gap an element takes about
# k + 2.6 bits: 7.6 at 3 % of the elements. The kernels keep at most 63 bits in an int64, so no shift
# ever reaches its sign bit, and move whole 32-bit words in and out.

_WORD_MASK = 0xFFFF_FFFF


@_kernel([types.UniTuple(types.int64, 3)(_i4r, _i8)])
def packed_bits(message, k):
    """Bits the packed stream of a validated sparse message takes with parameter k - 1, k and k + 1
    (k >= 1; the 5 bits of k included), in one pass."""
    count = message.shape[0] - HEADER_WORDS
    below = 0
    at = 0
    above = 0
    previous = 0
    for p in range(HEADER_WORDS, message.shape[0]):
        i = np.int64(message[p])
        a = -i if i < 0 else i
        v = a - previous - 1
        previous = a
        below += v >> (k - 1)
        at += v >> k
        above += v >> (k + 1)
    return (RICE_K_BITS + below + count * (k + 1), RICE_K_BITS + at + count * (k + 2),
            RICE_K_BITS + above + count * (k + 3))


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _put(out, acc, nbits, w, code, length):
    """Append ``length`` (<= 32) bits of ``code`` to the writer's bits; a whole word goes out. Returns
    the writer's (acc, nbits, w)."""
    acc |= code << nbits
    nbits += length
    if nbits >= 32:
        out[w] = np.uint32(acc & _WORD_MASK)
        w += 1
        acc >>= 32
        nbits -= 32
    return acc, nbits, w


@numba.njit(nogil=True, error_model="numpy")
def _put_long(out, acc, nbits, w, q, tail, k):
    """``pack_sparse``'s rare element whose code is over 32 bits: its unary run in pieces, then the
    tail; returns the writer's (acc, nbits, w)."""
    while q >= 32:  # 31 ones at a time
        acc, nbits, w = _put(out, acc, nbits, w, np.int64(0x7FFF_FFFF), 31)
        q -= 31
    acc, nbits, w = _put(out, acc, nbits, w, (np.int64(1) << q) - 1, q + 1)  # the last ones and the zero
    return _put(out, acc, nbits, w, tail, k + 1)


@_kernel([types.void(_i4r, _i8, _u4a)])
def pack_sparse(message, k, out):
    """Write the packed stream of a validated sparse message with parameter k into out, its words
    (ceil(packed_bits / 32) of them; zero bits after the last element)."""
    acc = np.int64(k)  # bits not yet written out, the next one lowest; fewer than 32 between elements
    nbits = np.int64(RICE_K_BITS)
    w = np.int64(0)
    previous = np.int64(0)
    low_mask = (np.int64(1) << k) - 1
    for p in range(HEADER_WORDS, message.shape[0]):
        i = np.int64(message[p])
        negative = i < 0
        a = -i if negative else i
        v = a - previous - 1
        previous = a
        q = v >> k
        tail = (v & low_mask) | (np.int64(negative) << k)  # the remainder, then the sign
        if q + k + 2 > 32:
            acc, nbits, w = _put_long(out, acc, nbits, w, q, tail, k)
            continue
        acc |= (((np.int64(1) << q) - 1) | (tail << (q + 1))) << nbits  # q ones, a zero, the tail
        nbits += q + k + 2
        if nbits >= 32:  # written out inline: _put here measured 4x slower
            out[w] = np.uint32(acc & _WORD_MASK)
            w += 1
            acc >>= 32
            nbits -= 32
    if nbits > 0:
        out[w] = np.uint32(acc & _WORD_MASK)


@numba.njit(nogil=True, error_model="numpy")
def _take_long(body, acc, nbits, wi, k, limit):
    """``unpack_packed``'s element that is not whole in the bits held: its unary run word by word, then
    its tail. Returns (acc, nbits, wi, q, tail); q = limit + 1 where the run passes ``limit``."""
    words = body.shape[0]
    q = np.int64(0)
    while True:
        while nbits <= 31:
            acc |= np.int64(body[wi] if wi < words else 0) << nbits
            wi += 1
            nbits += 32
        ones = np.int64(trailing_zeros(~acc))
        if ones < nbits:
            break
        q += nbits  # every bit held is a one: the run goes on
        acc = np.int64(0)
        nbits = np.int64(0)
        if q > limit:
            return acc, nbits, wi, limit + 1, np.int64(0)
    q += ones
    acc >>= ones + 1
    nbits -= ones + 1
    while nbits <= 31:
        acc |= np.int64(body[wi] if wi < words else 0) << nbits
        wi += 1
        nbits += 32
    tail = acc & ((np.int64(2) << k) - 1)
    acc >>= k + 1
    nbits -= k + 1
    return acc, nbits, wi, min(q, limit + 1), tail


@_kernel([_pair(_u4r, _i8, _i8, _i4a)])
def unpack_packed(body, count, n, out):
    """Check a packed stream (the body's words) of ``count`` elements for a vector of n and write its
    signed 1-based indices into out[:count] (an empty out: only check). Returns (code, element) with the
    element where a problem was found. Words past the body read as zeros; reading into them is a
    truncated body."""
    write = out.shape[0] > 0
    words = body.shape[0]
    total = 32 * words  # bits in the body
    if total < RICE_K_BITS:
        return BAD_TRUNCATED, 0
    acc = np.int64(body[0])  # bits read ahead, the next one lowest (at most 63)
    wi = np.int64(1)  # words read (past the body: zeros); the stream position is 32 * wi - nbits
    k = acc & 31
    acc >>= RICE_K_BITS
    nbits = np.int64(32 - RICE_K_BITS)
    low_mask = (np.int64(1) << k) - 1
    previous = np.int64(0)
    tail_mask = (np.int64(2) << k) - 1
    for e in range(count):
        if nbits <= 31:
            if wi < words:
                acc |= np.int64(body[wi]) << nbits
            wi += 1
            nbits += 32
        ones = np.int64(trailing_zeros(~acc))
        if ones + k + 2 <= nbits:  # the whole element is in the bits held (q <= 61: no overflow below)
            q = ones
            tail = (acc >> (ones + 1)) & tail_mask
            acc >>= ones + k + 2
            nbits -= ones + k + 2
        else:
            limit = (n - previous - 1) >> k  # the largest quotient that stays within n
            acc, nbits, wi, q, tail = _take_long(body, acc, nbits, wi, k, limit)
            if q > limit:
                return BAD_INDEX_RANGE, e
        if wi > words and 32 * wi - nbits > total:  # read into the words past the body
            return BAD_TRUNCATED, e
        a = previous + ((q << k) | (tail & low_mask)) + 1
        if a > n:
            return BAD_INDEX_RANGE, e
        previous = a
        if write:
            out[e] = -a if (tail >> k) & 1 else a
    if acc != 0:  # bits after the last element, in the words read ahead
        return BAD_TRAILING, count
    for r in range(wi, words):
        if body[r] != 0:
            return BAD_TRAILING, count
    if 4 * words - (32 * wi - nbits + 7) // 8 > 3:  # more than the last word's zero padding
        return BAD_TRAILING, count
    return OK, -1


def load_all() -> None:
    """Build every kernel now (e.g. to fill the on-disk cache before workers start)."""
    for kernel in ALL_KERNELS:
        _ = kernel.dispatcher


ALL_KERNELS = (encode_range, add_difference_encode_range, encode_gap_range, clip_gap, add_difference_range,
               copy_to_both, add_to_both, indices_to_bitmap, bitmap_to_indices, restore_sparse,
               restore_bitmap, validate_sparse, validate_bitmap, apply_sparse, apply_bitmap, packed_bits,
               pack_sparse, unpack_packed)
#: per float dtype: (unsigned view dtype, mask clearing the sign bit, bits of +inf)
BIT_VIEWS = {
    np.dtype(np.float32): (np.dtype(np.uint32), np.uint32(0x7FFF_FFFF), np.uint32(0x7F80_0000)),
    np.dtype(np.float64): (np.dtype(np.uint64), np.uint64(0x7FFF_FFFF_FFFF_FFFF),
                           np.uint64(0x7FF0_0000_0000_0000)),
}
