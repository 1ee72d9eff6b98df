"""numba kernels of the threshold codec (private: the checked wrappers live in codec.py).

Every kernel has explicit signatures (compiled, or loaded from the on-disk cache, at import) and the
same fixed options, set once in ``_kernel``. They trust their arguments: dtypes, contiguity and ranges
are checked by the Python wrappers.

Encoding is two passes that together read the vector about once:
1. ``count_blocks`` (read only, vectorizable): per block of ``BLOCK`` elements, how many reach tau,
   and whether any value is NaN/inf; it stops at the first block holding a non-finite value.
2. ``emit_sparse`` / ``emit_bitmap`` revisit only the blocks that hold a hit: they write the message
   and subtract tau. Blocks without hits are never touched again.
Both passes take an element range, so a large vector can be split into chunks handled by threads
(``nogil``) with output identical to one thread: the chunk offsets come from the per-chunk counts.
"""

from __future__ import annotations

from psrv.encoding._numba_cache import apply_cache_dir_from_env

apply_cache_dir_from_env()  # must run before numba is imported: numba reads NUMBA_CACHE_DIR at import

import numba  # noqa: E402
import numpy as np  # noqa: E402
from numba import types  # noqa: E402
from numba.cpython.unsafe.numbers import trailing_zeros  # noqa: E402

#: elements per block of the counting pass; a multiple of 16 so a block covers whole bitmap words
BLOCK = 64
#: bitmap: elements per int32 word (bit b = has a value, bit b + 16 = negative)
WORD_ELEMENTS = 16
HEADER_WORDS = 4

# error codes of the validation kernels (0 = valid)
OK = 0
BAD_ZERO_INDEX = 1
BAD_INDEX_RANGE = 2
BAD_INDEX_ORDER = 3
BAD_SIGN_WITHOUT_VALUE = 4
BAD_PADDING = 5



def _kernel(signatures):
    """The one decorator of every kernel: explicit signatures, disk cache, GIL released, strict IEEE math."""
    return numba.njit(signatures, cache=True, nogil=True, fastmath=False, boundscheck=False,
                      error_model="numpy")


_f4a = types.Array(types.float32, 1, "C")
_f8a = types.Array(types.float64, 1, "C")
_i4a = types.Array(types.int32, 1, "C")
_i4r = types.Array(types.int32, 1, "C", readonly=True)  # messages may be read-only views of received bytes
_u4r = types.Array(types.uint32, 1, "C", readonly=True)
_u4a = types.Array(types.uint32, 1, "C")
_u8a = types.Array(types.uint64, 1, "C")
_u1a = types.Array(types.uint8, 1, "C")
_i8 = types.int64
_pair = types.UniTuple(types.int64, 2)


@_kernel([_pair(_u4a, types.uint32, types.uint32, types.uint32, _i8, _i8, _u1a),
          _pair(_u8a, types.uint64, types.uint64, types.uint64, _i8, _i8, _u1a)])
def count_blocks(bits, abs_mask, tau_bits, inf_bits, start, stop, block_counts):
    """Count |x| >= tau per block of [start, stop) into block_counts (start is a multiple of BLOCK).

    Works on the float's bits (x viewed as uint32/uint64): with the sign masked off, the integer order
    is the float order, and NaN/inf are the values >= inf_bits. A block is first reduced to its
    largest |x| (a vectorized integer max); only blocks reaching tau are counted element by element.
    Returns (count, first_bad): first_bad is -1, or the first index holding NaN/inf (then the count
    is partial and must not be used).
    """
    total = 0
    zero = tau_bits ^ tau_bits
    full_blocks = (stop - start) // BLOCK
    for i in range(full_blocks + 1):
        lo = start + i * BLOCK
        hi = min(lo + BLOCK, stop)
        if lo >= stop:
            break
        block = bits[lo:hi]
        largest = zero
        if i < full_blocks:  # a fixed trip count: vectorized
            for j in range(BLOCK):
                largest = max(largest, block[j] & abs_mask)
        else:
            for j in range(hi - lo):
                largest = max(largest, block[j] & abs_mask)
        hits = 0
        if largest >= tau_bits:
            if largest >= inf_bits:
                for j in range(hi - lo):
                    if (block[j] & abs_mask) >= inf_bits:
                        return total, lo + j
            if i < full_blocks:
                for j in range(BLOCK):
                    hits += 1 if (block[j] & abs_mask) >= tau_bits else 0
            else:
                for j in range(hi - lo):
                    hits += 1 if (block[j] & abs_mask) >= tau_bits else 0
        block_counts[lo // BLOCK] = hits
        total += hits
    return total, -1


@numba.njit(inline="always", nogil=True, error_model="numpy")
def _word_masks(bits, abs_mask, tau_bits, g, stop):
    """(value bits, sign bits) of the up to 16 elements from g, computed on the floats' bits.

    |x| >= tau is (bits & abs_mask) >= tau_bits; x is negative when its sign bit is set, i.e. bits > abs_mask.
    """
    values = 0
    signs = 0
    if g + WORD_ELEMENTS <= stop:
        seg = bits[g:g + WORD_ELEMENTS]
        for b in range(WORD_ELEMENTS):
            w = seg[b]
            values |= (1 if (w & abs_mask) >= tau_bits else 0) << b
            signs |= (1 if w > abs_mask else 0) << b
    else:
        for b in range(stop - g):
            w = bits[g + b]
            values |= (1 if (w & abs_mask) >= tau_bits else 0) << b
            signs |= (1 if w > abs_mask else 0) << b
    return values, signs & values


@_kernel([_i8(_f4a, _u4a, types.float32, types.uint32, types.uint32, _i8, _i8, _u1a, _u8a, _i4a, _i8),
          _i8(_f8a, _u8a, types.float64, types.uint64, types.uint64, _i8, _i8, _u1a, _u8a, _i4a, _i8)])
def emit_sparse(x, bits, tau, abs_mask, tau_bits, start, stop, block_counts, block_groups, out, pos):
    """Write 1-based signed indices of [start, stop) into out from pos, subtract tau; return the next pos.

    bits is x viewed as unsigned ints. block_groups is block_counts viewed 8 blocks to a word, to skip
    empty stretches quickly (start is a multiple of 8 * BLOCK).
    """
    for group in range(start // (8 * BLOCK), (stop + 8 * BLOCK - 1) // (8 * BLOCK)):
        if block_groups[group] == 0:
            continue
        for b in range(group * 8, min(group * 8 + 8, (stop + BLOCK - 1) // BLOCK)):
            if block_counts[b] == 0:
                continue
            lo = b * BLOCK
            hi = min(lo + BLOCK, stop)
            for g in range(lo, hi, WORD_ELEMENTS):
                values, signs = _word_masks(bits, abs_mask, tau_bits, g, hi)
                while values:
                    k = trailing_zeros(values)
                    values &= values - 1
                    negative = (signs >> k) & 1
                    out[pos] = -(g + k + 1) if negative else g + k + 1
                    pos += 1
                    x[g + k] -= -tau if negative else tau  # x - (-tau) is exactly x + tau
    return pos


@_kernel([types.void(_f4a, _u4a, types.float32, types.uint32, types.uint32, _i8, _i8, _u1a, _u8a, _u4a),
          types.void(_f8a, _u8a, types.float64, types.uint64, types.uint64, _i8, _i8, _u1a, _u8a, _u4a)])
def emit_bitmap(x, bits, tau, abs_mask, tau_bits, start, stop, block_counts, block_groups, words):
    """Set the bitmap words of [start, stop) (zero on entry) and subtract tau from every hit."""
    for group in range(start // (8 * BLOCK), (stop + 8 * BLOCK - 1) // (8 * BLOCK)):
        if block_groups[group] == 0:
            continue
        for b in range(group * 8, min(group * 8 + 8, (stop + BLOCK - 1) // BLOCK)):
            if block_counts[b] == 0:
                continue
            lo = b * BLOCK
            hi = min(lo + BLOCK, stop)
            for g in range(lo, hi, WORD_ELEMENTS):
                values, signs = _word_masks(bits, abs_mask, tau_bits, g, hi)
                words[g // WORD_ELEMENTS] = values | (signs << 16)
                while values:
                    k = trailing_zeros(values)
                    values &= values - 1
                    x[g + k] -= -tau if (signs >> k) & 1 else tau


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


@_kernel([_pair(_u4r, _i8)])
def validate_bitmap(words, n):
    """Check bitmap words: a sign bit only beside its value bit, no bit beyond element n. (code, word)."""
    for w in range(words.shape[0]):
        v = np.int64(words[w])
        if (v >> 16) & ~(v & 0xFFFF):
            return BAD_SIGN_WITHOUT_VALUE, w
    tail = n % WORD_ELEMENTS
    if tail and words.shape[0] > 0:
        used = (1 << tail) - 1
        v = np.int64(words[words.shape[0] - 1])
        if (v & 0xFFFF) & ~used:
            return BAD_PADDING, words.shape[0] - 1
    return OK, -1


@_kernel([_i8(_u4r)])
def bitmap_count(words):
    """How many elements a bitmap sets (popcount of the value bits)."""
    total = 0
    for w in range(words.shape[0]):
        v = np.int64(words[w]) & 0xFFFF
        v = v - ((v >> 1) & 0x5555)
        v = (v & 0x3333) + ((v >> 2) & 0x3333)
        v = (v + (v >> 4)) & 0x0F0F
        total += (v + (v >> 8)) & 0x1F
    return total


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


ALL_KERNELS = (count_blocks, emit_sparse, emit_bitmap, validate_sparse, validate_bitmap, bitmap_count,
               apply_sparse, apply_bitmap)
#: per float dtype: (unsigned view dtype, mask clearing the sign bit, bits of +inf)
BIT_VIEWS = {
    np.dtype(np.float32): (np.dtype(np.uint32), np.uint32(0x7FFF_FFFF), np.uint32(0x7F80_0000)),
    np.dtype(np.float64): (np.dtype(np.uint64), np.uint64(0x7FFF_FFFF_FFFF_FFFF),
                           np.uint64(0x7FF0_0000_0000_0000)),
}
