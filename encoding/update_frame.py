"""Small updates in one compact frame: what an update costs on the wire beside its payload.

An UPDATES message otherwise travels as a msgpack header (the map's key names, the op's name, per row
τ as a float64 and the form's name: about 50 bytes for one row, 20 more a row) plus each payload with
its own 16-byte header. For a small model that is most of what a step sends: on a model of 788
parameters a message of 9 elements has 12 bytes of body. This form carries the same updates, exactly,
in one frame:

* byte 0: ``TAG`` = 0xC1, the one byte msgpack never uses, so no msgpack header (or garbage that
  repeats a byte) is ever taken for a compact frame;
* byte 1: ``version << 3 | ORIGIN_IS_SRC | form`` for a lone update, ``version << 3 | BATCH`` for
  several: the transport's protocol version (its own check, as a msgpack header's ``v``) and the
  payload's form, or BATCH (form bits 3, which no form has);
* ``src + 1`` (an unsigned LEB128 varint); a batch then holds the count of its updates (a varint)
  and, for each, a byte ``ORIGIN_IS_SRC | form``;
* per update: ``origin`` unless it is ``src``, ``seq`` (varints), ``iteration`` and ``epoch`` (zigzag
  varints), the payload's first two header words (count or N, then N) as unsigned varints of their
  32 bits, its τ as 4 bytes (float32, little-endian); in a batch the body's length (a varint); then
  the payload's body words as bytes, less the zero bytes that end its last word (at most 3: the
  receiver pads the body back to whole words, so the payload comes back bit for bit). A lone
  update's body runs to the frame's end.

The rows' ``tau`` and ``encoding`` are not sent: they are the payload's float32 τ and its form, as a
node makes them (``psrv.server.Node.submit``). ``pack`` gives None for anything it cannot carry
exactly (another τ, another form name, payloads over ``MAX_PAYLOAD_BYTES``, 2 KiB, in all, where the
header is a few per cent of them and their copy into one frame costs more than it saves), and the
transport sends those as before. ``unpack`` checks the frame's own layout and raises
MalformedMessageError; the catalogue's checks of the rows and the payloads follow in the transport,
as for every other update.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from psrv.encoding.errors import MalformedMessageError
from psrv.encoding.update_header import FORM_NAMES, HEADER_WORDS, INT64_MAX, MalformedHeaderError, check_row

__all__ = [
    "BATCH", "MAX_PAYLOAD_BYTES", "MAX_UPDATES", "MAX_VERSION", "ORIGIN_IS_SRC", "TAG", "is_update_frame",
    "pack", "unpack", "version_of",
]

TAG = 0xC1
FORM_BITS = 0x03
BATCH = 0x03  # byte 1's form bits for a frame of several updates
ORIGIN_IS_SRC = 0x04
VERSION_SHIFT = 3
MAX_VERSION = 0xFF >> VERSION_SHIFT
#: payloads larger than this in all travel as a msgpack header frame and their buffers: there the header
#: is under 3 % of the payload (0.03 % of a dense update at 3 % of the elements), less than the copy
#: into one frame is worth
MAX_PAYLOAD_BYTES = 2048
#: the most updates one frame carries (UPDATES' own limit is checked after the frame's)
MAX_UPDATES = 4096
_HEAD_BYTES = HEADER_WORDS * 4
_MAX_VARINT_BYTES = 10  # 64 bits in 7-bit groups
_U32 = struct.Struct("<I")
_F32 = struct.Struct("<f")
_U32_HEAD = struct.Struct("<4I")
_UINT64_LIMIT = 1 << 64


def is_update_frame(first_byte: int) -> bool:
    """Whether a frame starting with this byte is a compact frame of updates (not a msgpack header)."""
    return first_byte == TAG


def _uvarint(value: int, out: bytearray) -> None:
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _zigzag(value: int) -> int:
    return value * 2 if value >= 0 else -value * 2 - 1


def _carried(src: int, row: Sequence[Any], payload: Any) -> tuple[bytes, int, bool] | None:
    """``(payload bytes, form, origin is src)`` where the frame carries this update exactly, else None."""
    if type(payload) is not np.ndarray or payload.dtype != np.int32 or payload.ndim != 1:
        return None
    if payload.nbytes < _HEAD_BYTES:
        return None
    try:  # a row the wire refuses travels as msgpack, to be refused by its receiver as before
        check_row(row)
    except MalformedHeaderError:
        return None
    data = payload.tobytes()  # at most MAX_PAYLOAD_BYTES: cheaper than views of it
    form = _U32_HEAD.unpack_from(data)[3]
    if form not in FORM_NAMES or row[5] != FORM_NAMES[form] or row[4] != _F32.unpack_from(data, 8)[0]:
        return None
    return data, form, row[0] == src


def _put_update(out: bytearray, row: Sequence[Any], data: bytes, own: bool, sized: bool) -> None:
    origin, seq, iteration, epoch = row[0], row[1], row[2], row[3]
    first, n = _U32_HEAD.unpack_from(data)[:2]
    if not own:
        _uvarint(origin, out)
    for value in (seq, _zigzag(iteration), _zigzag(epoch), first, n):
        _uvarint(value, out)
    out += data[8:12]
    end = len(data)  # the body less the zero bytes ending its last word (at most 3)
    low = max(_HEAD_BYTES, end - 3)
    while end > low and data[end - 1] == 0:
        end -= 1
    if sized:
        _uvarint(end - _HEAD_BYTES, out)
    out += data[_HEAD_BYTES:end]


def pack(src: int, rows: Sequence[Sequence[Any]], payloads: Sequence[Any], version: int) -> bytes | None:
    """The compact frame of these updates from ``src`` (``rows`` in ``FIELD_NAMES`` order, ``payloads``
    their int32 messages) for protocol ``version``, or None where this form cannot carry them exactly."""
    if not 0 <= version <= MAX_VERSION:
        raise ValueError(f"a compact update frame carries versions 0 to {MAX_VERSION}, got {version}")
    count = len(rows)
    if not (0 < count <= MAX_UPDATES and count == len(payloads) and type(src) is int
            and -1 <= src < INT64_MAX):
        return None
    total = 0
    carried = []
    for row, payload in zip(rows, payloads, strict=True):
        item = _carried(src, row, payload)
        if item is None:
            return None
        total += len(item[0])
        if total > MAX_PAYLOAD_BYTES:
            return None
        carried.append(item)
    if count == 1:
        data, form, own = carried[0]
        out = bytearray((TAG, version << VERSION_SHIFT | (ORIGIN_IS_SRC if own else 0) | form))
        _uvarint(src + 1, out)
        _put_update(out, rows[0], data, own, sized=False)
        return bytes(out)
    out = bytearray((TAG, version << VERSION_SHIFT | BATCH))
    _uvarint(src + 1, out)
    _uvarint(count, out)
    out += bytes((ORIGIN_IS_SRC if own else 0) | form for _, form, own in carried)
    for row, (data, _, own) in zip(rows, carried, strict=True):
        _put_update(out, row, data, own, sized=True)
    return bytes(out)


def _varint_at(frame: bytes, pos: int, what: str) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it, bounded by the frame's end."""
    value = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(frame):
            raise MalformedMessageError(f"compact update frame ends inside its {what} ({len(frame)} bytes)")
        byte = frame[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value >= _UINT64_LIMIT or (i and not byte):
                raise MalformedMessageError(f"compact update frame: {what} is not a minimal 64-bit varint")
            return value, pos + i + 1
        shift += 7
    raise MalformedMessageError(f"compact update frame: {what} runs over {_MAX_VARINT_BYTES} bytes")


def _get(frame: bytes, pos: int, what: str) -> tuple[int, int]:
    if pos < len(frame) and frame[pos] < 0x80:  # the usual case: one byte
        return frame[pos], pos + 1
    return _varint_at(frame, pos, what)


def _get_update(frame: bytes, pos: int, src: int, flags: int, sized: bool
                ) -> tuple[list[Any], np.ndarray, int]:
    form = flags & FORM_BITS
    if form not in FORM_NAMES:
        raise MalformedMessageError(f"compact update frame names form {form} "
                                    f"(expected 0 = sparse, 1 = bitmap or 2 = packed)")
    if flags & ORIGIN_IS_SRC:
        origin = src
    else:
        origin, pos = _get(frame, pos, "origin")
    seq, pos = _get(frame, pos, "seq")
    iteration, pos = _get(frame, pos, "iteration")
    epoch, pos = _get(frame, pos, "epoch")
    first, pos = _get(frame, pos, "first header word")
    n, pos = _get(frame, pos, "N")
    if first > 0xFFFFFFFF or n > 0xFFFFFFFF:
        raise MalformedMessageError(f"compact update frame: header words {first} and {n} must fit 32 bits")
    size = len(frame)
    if pos + 4 > size:
        raise MalformedMessageError(f"compact update frame ends inside its threshold ({size} bytes)")
    tau_at = pos
    pos += 4
    if sized:
        length, pos = _get(frame, pos, "body length")
        if pos + length > size:
            raise MalformedMessageError(f"compact update frame: a body of {length} bytes at {pos} runs past "
                                        f"its end ({size} bytes)")
        end = pos + length
    else:
        end = size
    pad = -(end - pos) % 4
    head = _U32_HEAD.pack(first, n, _U32.unpack_from(frame, tau_at)[0], form)
    payload = np.frombuffer(head + frame[pos:end] + bytes(pad) if pad else head + frame[pos:end], np.int32)
    row = [origin, seq, (iteration >> 1) ^ -(iteration & 1), (epoch >> 1) ^ -(epoch & 1),
           _F32.unpack_from(frame, tau_at)[0], FORM_NAMES[form]]
    return row, payload, end


def version_of(frame: bytes) -> int | None:
    """The protocol version a compact frame names (None for a frame too short to name one)."""
    return frame[1] >> VERSION_SHIFT if len(frame) >= 2 else None


def unpack(frame: bytes) -> tuple[int, list[list[Any]], list[np.ndarray]]:
    """``(src, rows, payloads)`` of a compact frame (its version checked by the caller, ``version_of``),
    each payload a read-only int32 array with its 4-word header; MalformedMessageError where the frame's
    own layout is broken (a truncated or overlong varint, an unknown form, a body past the end, bytes
    after the last update). The rows and payloads are checked by their usual checks after this."""
    if len(frame) < 2 or frame[0] != TAG:
        raise MalformedMessageError("not a compact update frame")
    flags = frame[1]
    src1, pos = _get(frame, 2, "src")
    src = src1 - 1
    if flags & FORM_BITS != BATCH:
        row, payload, _ = _get_update(frame, pos, src, flags, sized=False)
        return src, [row], [payload]
    count, pos = _get(frame, pos, "count")
    if not 2 <= count <= MAX_UPDATES or pos + count > len(frame):
        raise MalformedMessageError(f"compact update frame: a batch of {count} updates "
                                    f"(2 to {MAX_UPDATES}, a byte each first) in {len(frame)} bytes")
    each = frame[pos:pos + count]
    pos += count
    rows, payloads = [], []
    for item_flags in each:
        if item_flags & ~(ORIGIN_IS_SRC | FORM_BITS):
            raise MalformedMessageError(f"compact update frame: an update's flags {item_flags:#04x} hold "
                                        f"more than its form and ORIGIN_IS_SRC")
        row, payload, pos = _get_update(frame, pos, src, item_flags, sized=True)
        rows.append(row)
        payloads.append(payload)
    if pos != len(frame):
        raise MalformedMessageError(f"compact update frame: {len(frame) - pos} bytes after its last update")
    return src, rows, payloads
