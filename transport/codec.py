"""Messages <-> ZeroMQ frames, kept out of the sockets: a msgpack header frame + raw buffers.

``encode_frames`` never copies a large buffer (numpy arrays, memoryviews and received zmq.Frames are
passed through for a ``copy=False`` send); small updates travel in one compact frame
(``psrv.encoding.update_frame``), their header fields and payloads copied together; a header's field
names and op travel as codes (``psrv.transport.header_codes``). ``decode_frames``
validates everything the catalogue promises and raises FrameRejectedError whose ``reason`` is the
counter to bump:

empty, header_too_large, message_too_large, bad_header, unknown_version, unknown_type,
bad_field, bad_buffers, bad_payload.
"""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np
import zmq
from psrv.encoding import update_frame
from psrv.encoding.errors import MalformedMessageError
from psrv.encoding.update_header import check_payload_nbytes
from psrv.transport.errors import FrameRejectedError
from psrv.transport.header_codes import compact_header, expand_header
from psrv.transport.messages import CATALOGUE, INT64_MAX, PROTOCOL_VERSION, RESERVED, Message, Op
from psrv.transport.stat_codes import compact_stats, expand_stats

__all__ = [
    "REJECT_REASONS", "as_buffer", "decode_frames", "decode_header", "encode_frames", "frame_size",
    "pack_header", "PackedDict", "update_payload",
]

REJECT_REASONS = (
    "empty",
    "header_too_large",
    "message_too_large",
    "bad_header",
    "unknown_version",
    "unknown_type",
    "bad_field",
    "bad_buffers",
    "bad_payload",
    "bad_chunk",
    "chunk_expired",
    "unauthenticated_op",
    "bad_sender",
    "bad_message",
    "handler_error",
    "bad_origin",
    "bad_sequence",
    "join_refused",
)

_OPS = {op.value: op for op in Op}


def pack_header(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


class PackedDict(dict):
    """A header value packed once and sent in many messages (the mesh in every member's MESH): a
    plain dict to whoever reads it, and its msgpack bytes to ``encode_frames``. Do not modify it."""

    __slots__ = ("packed",)

    def __init__(self, value: dict) -> None:
        super().__init__(value)
        self.packed = msgpack.packb(value, use_bin_type=True)


def _pack_with_packed(header: dict[Any, Any]) -> bytes:
    """A msgpack map (a concatenation of its pairs) where PackedDict values are spliced in as is."""
    count = len(header)
    parts = [bytes([0x80 | count]) if count < 16 else b"\xde" + count.to_bytes(2, "big")]
    for key, value in header.items():
        parts.append(msgpack.packb(key, use_bin_type=True))
        parts.append(value.packed if type(value) is PackedDict else msgpack.packb(value, use_bin_type=True))
    return b"".join(parts)


def encode_frames(message: Message) -> list[Any]:
    """The frames of one message: [header bytes, *buffers] (buffers untouched, zero-copy), or small
    updates in the one compact frame of ``psrv.encoding.update_frame``."""
    op = message.op
    if op is Op.UPDATES:
        compact = _compact_updates(message)
        if compact is not None:
            return [compact]
    elif op is Op.MESH:
        return [_pack_with_packed(compact_header(message.header())), *message.buffers]
    elif op is Op.HEARTBEAT:
        return [pack_header(compact_header(_compact_heartbeat(message.header()))), *message.buffers]
    return [pack_header(compact_header(message.header())), *message.buffers]


def _compact_heartbeat(header: dict[str, Any]) -> dict[str, Any]:
    """A heartbeat's well-known stat names as codes (``psrv.transport.stat_codes``)."""
    stats = header.get("stats")
    if not isinstance(stats, dict) or not stats:
        return header
    known, rest = compact_stats(stats)
    return {**header, "stats": rest, "known": known} if known else header


def _compact_updates(message: Message) -> bytes | None:
    rows = message.fields.get("updates")
    buffers = message.buffers
    if not isinstance(rows, list | tuple) or len(rows) != len(buffers):
        return None
    payloads = []
    total = 0
    for buffer in buffers:
        if type(buffer) is not np.ndarray:  # a relayed frame: small ones are cheap to view
            size = frame_size(buffer)
            total += size
            if total > update_frame.MAX_PAYLOAD_BYTES or size % 4:
                return None
            buffer = np.frombuffer(as_buffer(buffer), np.int32)
        payloads.append(buffer)
    return update_frame.pack(message.src, rows, payloads, PROTOCOL_VERSION)


def frame_size(frame: Any) -> int:
    kind = type(frame)
    if kind is zmq.Frame or kind is bytes:  # the hot cases; len(zmq.Frame) is its size in bytes
        return len(frame)
    if isinstance(frame, bytes | bytearray):
        return len(frame)
    if isinstance(frame, np.ndarray):
        return frame.nbytes
    if isinstance(frame, memoryview):
        return frame.nbytes
    buffer = getattr(frame, "buffer", None)  # zmq.Frame
    if buffer is not None:
        return buffer.nbytes
    return len(frame)


def as_buffer(frame: Any) -> memoryview:
    """A read-only byte view of a received frame without copying it."""
    if isinstance(frame, memoryview):
        return frame.cast("B") if frame.format != "B" or frame.ndim != 1 else frame
    if isinstance(frame, bytes | bytearray):
        return memoryview(frame)
    if isinstance(frame, np.ndarray):
        return memoryview(frame).cast("B")
    return frame.buffer  # zmq.Frame


def _header_bytes(frame: Any) -> bytes:
    if isinstance(frame, bytes):
        return frame
    if isinstance(frame, bytearray | memoryview):
        return bytes(frame)
    return frame.bytes  # zmq.Frame


def decode_frames(
    frames: list[Any], *, max_message_bytes: int = 64 * 1024 * 1024, max_header_bytes: int = 4 * 1024 * 1024
) -> Message:
    """Validate and decode the frames of one message (the ROUTER identity already removed)."""
    if not frames:
        raise FrameRejectedError("empty", "a message needs at least a header frame, got 0 frames")
    header_size = frame_size(frames[0])
    compact = header_size > 0 and update_frame.is_update_frame(as_buffer(frames[0])[0])
    if header_size > max_header_bytes and not compact:  # a compact update's frame is its payload too
        raise FrameRejectedError(
            "header_too_large", f"header of {header_size} bytes > limit {max_header_bytes}"
        )
    total = sum(frame_size(f) for f in frames)
    if total > max_message_bytes:
        raise FrameRejectedError("message_too_large", f"message of {total} bytes > limit {max_message_bytes}")
    if compact:
        return _decode_compact_updates(_header_bytes(frames[0]), len(frames))
    try:
        header = msgpack.unpackb(_header_bytes(frames[0]), raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise FrameRejectedError(
            "bad_header", f"header is not msgpack: {type(exc).__name__}: {exc}"
        ) from None
    return decode_header(header, list(frames[1:]))


def _decode_compact_updates(frame: bytes, frames: int) -> Message:
    """Updates in a compact frame, through the same catalogue checks as their msgpack form."""
    version = update_frame.version_of(frame)
    if version != PROTOCOL_VERSION:
        raise FrameRejectedError(
            "unknown_version", f"compact updates of protocol version {version!r}, expected {PROTOCOL_VERSION}"
        )
    if frames != 1:
        raise FrameRejectedError("bad_buffers", f"compact updates are one frame, got {frames}")
    try:
        src, rows, payloads = update_frame.unpack(frame)
    except MalformedMessageError as exc:
        raise FrameRejectedError("bad_header", str(exc)) from None
    return decode_header({"v": PROTOCOL_VERSION, "op": Op.UPDATES.value, "src": src, "updates": rows},
                         payloads)


def decode_header(header: Any, buffers: list[Any]) -> Message:
    """Validate a decoded header map against the catalogue and build the Message."""
    if not isinstance(header, dict):
        raise FrameRejectedError("bad_header", f"header must be a map, got {type(header).__name__}")
    header = expand_header(header)  # field names and the op sent as codes (psrv.transport.header_codes)
    version = header.get("v")
    if version != PROTOCOL_VERSION:
        raise FrameRejectedError(
            "unknown_version", f"protocol version {version!r}, expected {PROTOCOL_VERSION}"
        )
    op = _OPS.get(header.get("op")) if isinstance(header.get("op"), str) else None
    if op is None:
        raise FrameRejectedError("unknown_type", f"unknown message type {header.get('op')!r}")
    if op is Op.HEARTBEAT and "known" in header:  # the stat names sent as codes, put back
        header = {**header, "stats": expand_stats(header["known"], header.get("stats"))}
        del header["known"]
    src = header.get("src")
    if type(src) is not int or not -1 <= src <= INT64_MAX:
        raise FrameRejectedError("bad_field", f"{op}: src must be an int >= -1, got {src!r}")
    schema = CATALOGUE[op]
    fields: dict[str, Any] = {}
    absent = 0
    for name, types in schema.fields.items():
        if name not in header:
            if name in schema.optional:
                fields[name] = None
                absent += 1
                continue
            raise FrameRejectedError("bad_field", f"{op}: missing field {name!r}")
        value = header[name]
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            expected = "/".join(t.__name__ for t in types)
            raise FrameRejectedError(
                "bad_field", f"{op}: field {name!r} must be {expected}, got {value!r:.80}"
            )
        fields[name] = value
    present = len(fields) - absent
    extra = () if len(header) == present + len(RESERVED) else set(header) - set(fields) - set(RESERVED)
    if extra:
        raise FrameRejectedError("bad_field", f"{op}: unexpected fields {sorted(extra)}")
    if not schema.min_buffers <= len(buffers) <= schema.max_buffers:
        raise FrameRejectedError(
            "bad_buffers",
            f"{op}: expected {schema.min_buffers}..{schema.max_buffers} buffers, got {len(buffers)}",
        )
    if schema.check is not None:
        schema.check(fields)
    message = Message(op, fields, buffers, src)
    _check_payload(message)
    return message


def _check_payload(message: Message) -> None:
    if message.op is Op.UPDATE or message.op is Op.UPDATES:
        if message.op is Op.UPDATES and len(message["updates"]) != len(message.buffers):
            raise FrameRejectedError(
                "bad_buffers", f"updates: {len(message['updates'])} rows but {len(message.buffers)} buffers"
            )
        try:  # the payload's own header is checked against the model where the model is known
            for buffer in message.buffers:
                check_payload_nbytes(frame_size(buffer))
        except MalformedMessageError as exc:
            raise FrameRejectedError("bad_payload", str(exc)) from None
    elif message.op is Op.PARAMS_REPLY:
        expected = [_nbytes(message["dtype"], message["size"])]
        if message["updater_dtype"] is not None:
            expected.append(_nbytes(message["updater_dtype"], message["updater_size"]))
        got = [frame_size(b) for b in message.buffers]
        if got != expected:
            raise FrameRejectedError(
                "bad_payload", f"params reply buffers of {got} bytes, header says {expected}"
            )
    elif message.op is Op.CHUNK:
        f = message.fields
        size = frame_size(message.buffers[0])
        if not (
            0 <= f["index"] < f["count"]
            and f["offset"] >= 0
            and f["offset"] + size <= f["total"]
            and all(isinstance(n, int) and n >= 0 for n in f["lengths"])
            and sum(f["lengths"]) == f["total"]
        ):
            raise FrameRejectedError(
                "bad_chunk",
                f"inconsistent chunk {f['index']}/{f['count']} "
                f"offset {f['offset']} size {size} total {f['total']}",
            )


def _nbytes(dtype: str, size: int) -> int:
    try:  # the catalogue admits only float dtype names; numpy raises several types on anything else
        item = np.dtype(dtype)
    except Exception:
        raise FrameRejectedError("bad_payload", f"unknown dtype {dtype!r:.40}") from None
    if item.kind != "f" or size < 0:
        raise FrameRejectedError("bad_payload", f"params must be a float array, got {dtype!r} x {size}")
    return item.itemsize * size


def update_payload(message: Message) -> np.ndarray:
    """The int32 message of an UPDATE as a numpy view of the received frame (no copy)."""
    return np.frombuffer(as_buffer(message.buffers[0]), dtype=np.int32)
