"""The threshold codec written with torch tensor ops, so it runs where the tensors live (CUDA or CPU).

It produces and reads exactly the wire format of ``psrv.encoding.codec`` (header, sparse/bitmap choice,
ascending indices, float32-rounded tau, residual afterwards, errors): the header rules and error texts
are that module's and ``psrv.encoding.messages``'s, only the element work is done here. A GPU worker
encodes its residual on the device and only the small int32 message crosses to the host; received
messages are decoded into the device parameters. On CPU tensors it gives the same bytes as the numba
codec (tests check it), which is faster there.

Host synchronizations per call: ``encode`` reads the number of hits (the size of their index list)
and whether any hit is non-finite (inf and NaN are always hits, so that check looks at the hits alone;
the whole vector is read by the magnitude test and the index list only); ``decode`` reads the 4 header
words of a device message (a host message is validated on the host by the numba validator and only
its body is copied over).
torch is imported lazily by the callers of this module (``import psrv.encoding`` does not need it).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from psrv.encoding import _kernels as k
from psrv.encoding import codec, update_header
from psrv.encoding.errors import MalformedMessageError, NonFiniteResidualError
from psrv.encoding.messages import bitmap_problem, parse_message, sparse_problem
from psrv.encoding.update_header import HEADER_WORDS, SPARSE

_FLOATS = {torch.float32: (torch.int32, 0x7FFF_FFFF, 0x7F80_0000, np.float32, np.int32),
           torch.float64: (torch.int64, 0x7FFF_FFFF_FFFF_FFFF, 0x7FF0_0000_0000_0000, np.float64, np.int64)}
_WORD = update_header.WORD_ELEMENTS


def _check_vector(tensor: Any, name: str) -> None:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__} "
                        "(use psrv.encoding.encode/decode for NumPy arrays)")
    if tensor.dtype not in _FLOATS:
        raise TypeError(f"{name} must be float32 or float64, got dtype {tensor.dtype}")
    if tensor.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name} must be contiguous (use .contiguous())")


def _bits_of(value: float, dtype: torch.dtype) -> int:
    """The bit pattern of ``value`` in the float dtype, as a Python int (for integer comparisons)."""
    _, _, _, np_float, np_int = _FLOATS[dtype]
    return int(np.array([value], dtype=np_float).view(np_int)[0])


def encode(residual: torch.Tensor, threshold: float) -> torch.Tensor | None:
    """Threshold-encode ``residual`` in place; return the int32 message on its device, or None.

    Same rule, message and residual as ``psrv.encoding.encode`` (see psrv.encoding.codec). A NaN or inf
    raises NonFiniteResidualError naming the first bad index, with the residual unchanged.
    """
    return encode_counted(residual, threshold)[0]


def encode_counted(residual: torch.Tensor, threshold: float) -> tuple[torch.Tensor | None, int]:
    """encode(), also returning how many elements the message carries (0 with None)."""
    _check_vector(residual, "residual")
    tau32 = codec.float32_threshold(threshold)
    n = int(residual.shape[0])
    if n == 0:
        return None, 0
    if n >= 2**31:
        raise ValueError(f"residual has {n} elements; the wire format holds at most 2**31 - 1")
    int_dtype, abs_mask, inf_bits, _, _ = _FLOATS[residual.dtype]
    tau = float(tau32)  # exact in float32 and float64
    with torch.no_grad():
        magnitude = residual.view(int_dtype) & abs_mask  # |x| as bits: ordered like |x| for every float
        hit = magnitude >= _bits_of(tau, residual.dtype)
        where = torch.nonzero(hit).squeeze(1)  # ascending; its size is the one host synchronization
        count = int(where.shape[0])
        if count == 0:
            return None, 0
        # inf and NaN are hits (their magnitude bits are above any finite tau's), so only the hits
        # need the finiteness check: a pass over the few, not over all n
        hit_bits = magnitude[where]
        bad = hit_bits >= inf_bits
        if bool(bad.any()):
            first = int(where[bad.to(torch.uint8).argmax()])
            raise NonFiniteResidualError(first, float(residual[first]))
        values = residual[where]
        negative = values < 0  # hits are never zero, so the sign bit is the sign
        signed_tau = torch.where(negative, -tau, tau).to(residual.dtype)
        residual[where] = values - signed_tau  # x - (-tau) is exactly x + tau
        words = update_header.bitmap_words(n)
        tau_bits = int(codec.float32_bits(tau32))
        on = residual.device
        if count < words:
            header = torch.tensor([count, n, tau_bits, SPARSE], dtype=torch.int32, device=on)
            indices = where + 1
            body = torch.where(negative, -indices, indices).to(torch.int32)
            return torch.cat([header, body]), count
        header = torch.tensor([n, n, tau_bits, update_header.BITMAP], dtype=torch.int32, device=on)
        return torch.cat([header, _bitmap(hit, where, negative, words)]), count


def _bitmap(hit: torch.Tensor, where: torch.Tensor, negative: torch.Tensor, words: int) -> torch.Tensor:
    """The bitmap words (int32) of the hits: bit b = has a value, bit b + 16 = negative."""
    n = hit.shape[0]
    padded = torch.zeros((2, words * _WORD), dtype=torch.int32, device=hit.device)
    padded[0, :n] = hit
    padded[1, where] = negative.to(torch.int32)
    weights = torch.ones(_WORD, dtype=torch.int64, device=hit.device) << torch.arange(
        _WORD, dtype=torch.int64, device=hit.device)
    values, signs = (padded.view(2, words, _WORD) * weights).sum(dim=2)
    word = values | (signs << 16)  # in [0, 2**32): wrap into int32 two's complement explicitly
    return (word - ((word >> 31) << 32)).to(torch.int32)


def _bits_set(words: torch.Tensor) -> torch.Tensor:
    """(words, 32) int32 0/1 of every bit of int32 words (bit 31 too: an arithmetic shift keeps it)."""
    words = words.to(torch.int32)
    return (words[:, None] >> torch.arange(32, dtype=torch.int32, device=words.device)) & 1


def _message_tensor(message: torch.Tensor) -> torch.Tensor:
    if message.ndim != 1:
        raise MalformedMessageError(f"message must be 1-D, got shape {tuple(message.shape)}")
    if message.dtype == torch.uint8:
        if message.shape[0] % 4:
            raise MalformedMessageError(
                f"message is {message.shape[0]} bytes, not a whole number of int32 words")
        return message.contiguous().view(torch.int32)  # torch tensors are native (little-endian) order
    if message.dtype != torch.int32:
        raise MalformedMessageError(f"message must be an int32 tensor or bytes, got dtype {message.dtype}")
    return message


def _validate_device(message: torch.Tensor) -> tuple[int, int, float, int, torch.Tensor]:
    """Fully validate a torch message; return (form, n, tau, count, body). Reads the header on the host.
    A packed message (the form between hosts) is unpacked on the host: its body is then the sparse one."""
    message = _message_tensor(message)
    length = int(message.shape[0])
    update_header.check_too_short(length)
    header = message[:HEADER_WORDS].tolist()
    first, n, _, form = header
    tau = update_header.check_header(header, length)
    body = message[HEADER_WORDS:]
    if form == update_header.PACKED:
        array, info = parse_message(message.cpu().numpy())
        return SPARSE, n, tau, info.count, torch.from_numpy(array[HEADER_WORDS:])
    if form == SPARSE:
        if first == 0:
            return form, n, tau, 0, body
        body = body.to(torch.int64)  # |int32 min| needs 64 bits
        magnitude = body.abs()
        previous = torch.cat([magnitude.new_zeros(1), magnitude[:-1]])
        zero, out_of_range, unordered = body == 0, magnitude > n, magnitude <= previous
        bad = zero | out_of_range | unordered
        if bool(bad.any()):
            p = int(bad.to(torch.uint8).argmax())
            code = (k.BAD_ZERO_INDEX if bool(zero[p]) else k.BAD_INDEX_RANGE if bool(out_of_range[p])
                    else k.BAD_INDEX_ORDER)
            raise MalformedMessageError(sparse_problem(code, p + HEADER_WORDS, int(body[p]), n))
        return form, n, tau, first, message[HEADER_WORDS:]
    bits = _bits_set(body)
    values, signs = bits[:, :_WORD], bits[:, _WORD:]
    sign_alone = (signs & (1 - values)).any(dim=1)
    if bool(sign_alone.any()):
        raise MalformedMessageError(bitmap_problem(k.BAD_SIGN_WITHOUT_VALUE,
                                                         int(sign_alone.to(torch.uint8).argmax()), n))
    tail = n % _WORD
    if tail and body.shape[0] > 0 and bool(values[-1, tail:].any()):
        raise MalformedMessageError(bitmap_problem(k.BAD_PADDING, int(body.shape[0]) - 1, n))
    return form, n, tau, int(values.sum(dtype=torch.int64)), body


def decode(message: Any, target: torch.Tensor, scale: float = 1.0, device_copy: Any = None) -> None:
    """Add +-tau * scale into ``target`` (a torch tensor on any device) where the message says so.

    ``message`` may be a torch int32 (or uint8) tensor on any device, or what ``psrv.encoding.decode``
    takes (an int32 array, bytes): a host message is validated on the host, then only its body moves.
    The whole message is validated before ``target`` is touched; a malformed one raises
    MalformedMessageError (the same text as psrv.encoding.decode) and ``target`` is unchanged.

    ``device_copy``: the same message already on ``target``'s device (a worker's own update, encoded
    there and copied to the host to be sent): the host ``message`` is validated, with no device
    synchronization, and the body is read from the copy, so nothing crosses to the device.
    """
    _check_vector(target, "target")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    if isinstance(message, torch.Tensor):
        form, n, tau, count, body = _validate_device(message)
    else:
        array, info = parse_message(message)  # a packed message comes back as its sparse form
        form, n, tau, count = update_header.BITMAP if info.form == "bitmap" else SPARSE, info.n, info.tau, \
            info.count
        body = array[HEADER_WORDS:]
    if n != target.shape[0]:
        raise MalformedMessageError(f"message is for N={n} elements but the target has {target.shape[0]}")
    if count == 0:
        return
    if device_copy is not None and not isinstance(message, torch.Tensor):
        if not isinstance(device_copy, torch.Tensor) or device_copy.dtype != torch.int32 \
                or tuple(device_copy.shape) != (HEADER_WORDS + int(body.shape[0]),):
            raise ValueError("device_copy must be the message itself as an int32 tensor of "
                             f"{HEADER_WORDS + int(body.shape[0])} words")
        body = device_copy[HEADER_WORDS:]
    if not isinstance(body, torch.Tensor):
        body = torch.from_numpy(np.array(body, copy=True))  # received buffers may be read-only
    body = body.to(target.device, non_blocking=True)
    delta = torch.tensor(tau * scale, dtype=target.dtype, device=target.device)  # as numpy's dtype.type()
    with torch.no_grad():
        if form == SPARSE:
            indices = body.to(torch.int64)
            where = indices.abs() - 1
            negative = indices < 0
        else:
            bits = _bits_set(body)
            flat_values = bits[:, :_WORD].reshape(-1)[:n].bool()
            where = torch.nonzero(flat_values).squeeze(1)
            negative = bits[:, _WORD:].reshape(-1)[:n][where].bool()
        target[where] = target[where] + torch.where(negative, -delta, delta)  # t + (-d) is exactly t - d


def decode_many(messages: list[Any], target: torch.Tensor, scale: float = 1.0) -> list[Exception | None]:
    """Decode several host messages into ``target`` with one transfer and one device kernel.

    A node that receives a batch of updates (an UPDATES frame) pays one host-to-device copy and one
    ``index_add_`` for all of them instead of one each: on a GPU the per-message launch and copy costs
    dominate a sparse update. Each message is validated on the host first; a malformed one (or one for
    another N) is skipped and its error returned in its slot (None where it was applied), so one bad
    update never stops the others. The result is the sequential ``decode`` of the valid messages in
    order: exactly so on the CPU (``index_add_`` adds duplicates in index order there); on CUDA the
    adds of one element by several messages may happen in any order (float rounding only).
    """
    _check_vector(target, "target")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale!r}")
    results: list[Exception | None] = []
    bodies: list[np.ndarray] = []
    taus: list[float] = []
    lengths: list[int] = []
    for message in messages:
        if isinstance(message, torch.Tensor):  # a device message: its own path (read on the device)
            try:
                _flush_sparse(bodies, taus, lengths, target, scale)
                decode(message, target, scale)
                results.append(None)
            except MalformedMessageError as exc:
                results.append(exc)
            continue
        try:
            array, info = parse_message(message)
            if info.n != target.shape[0]:
                raise MalformedMessageError(
                    f"message is for N={info.n} elements but the target has {target.shape[0]}")
        except MalformedMessageError as exc:
            results.append(exc)
            continue
        results.append(None)
        if info.count == 0:
            continue
        if info.form == "bitmap":  # bitmaps are dense work anyway: decoded alone, in order
            _flush_sparse(bodies, taus, lengths, target, scale)
            decode(array, target, scale)
            continue
        bodies.append(array[HEADER_WORDS:])
        taus.append(info.tau)
        lengths.append(info.count)
    _flush_sparse(bodies, taus, lengths, target, scale)
    return results


def _flush_sparse(bodies: list[np.ndarray], taus: list[float], lengths: list[int], target: torch.Tensor,
                  scale: float) -> None:
    """Apply the gathered sparse bodies with one copy and one index_add_; empties the lists."""
    if not bodies:
        return
    body = np.concatenate(bodies).astype(np.int64)  # |int32 min| needs 64 bits
    _, _, _, np_float, _ = _FLOATS[target.dtype]
    magnitudes = np.repeat(np.array([tau * scale for tau in taus], dtype=np_float), lengths)  # dtype.type()
    # the signs and 0-based positions are worked out on the host (a few small vectors; elementwise torch
    # ops of this size on a busy CPU pay for their thread pool), then cross in one copy each
    signed = np.where(body < 0, -magnitudes, magnitudes)
    values = torch.from_numpy(signed).to(target.device, non_blocking=True)
    where = torch.from_numpy(np.abs(body) - 1).to(target.device, non_blocking=True)
    with torch.no_grad():
        target.index_add_(0, where, values)
    bodies.clear()
    taus.clear()
    lengths.clear()


__all__ = ["decode", "decode_many", "encode", "encode_counted"]
