"""A message header's field names and its op as small integers on the wire.

A control message is a msgpack map whose keys are its field names and whose ``op`` is a name too:
a PARAMS_REQUEST spent 28 of its 53 bytes on ``op``, ``src``, ``request_id`` and
``want_updater``, and ``params_request`` another 14. A node sends a join, a master-copy request,
its heartbeats and a leave in every fit (every epoch on Spark), which on a small model weighs as
much as several of its updates. On the wire each name listed here travels as its position in
``FIELD_NAMES`` (a positive fixint, one byte) and the op as its position in ``OP_NAMES``; ``v``
stays a name, so any protocol version reads the version of any other and refuses it by name. The
receiver puts the names back before the catalogue checks the message (a header that names its
fields is accepted as well), so every handler sees the same fields as before. Codes are
positions: append new names, never reorder or remove one (that is a new protocol version).
"""

from __future__ import annotations

from typing import Any

from psrv.transport.errors import FrameRejectedError

__all__ = ["FIELD_NAMES", "OP_NAMES", "compact_header", "expand_header"]

#: every header field of the catalogue (psrv.transport.messages), the reserved ``op`` and ``src``
#: first and a heartbeat's ``known``; append only
FIELD_NAMES: tuple[str, ...] = (
    "op", "src", "address", "name", "token", "session", "node_id", "mesh", "restart", "heartbeat_s",
    "missed_beats", "routes", "version", "origin", "seq", "iteration", "epoch", "tau", "encoding",
    "updates", "request_id", "want_updater", "dtype", "size", "updater_dtype", "updater_size",
    "watermark", "extra_seen", "given_up", "msg_id", "index", "count", "offset", "total", "inner",
    "lengths", "mesh_version", "stats", "delta", "reason", "status", "known",
)
#: every op (psrv.transport.messages.Op's values); append only
OP_NAMES: tuple[str, ...] = (
    "join", "join_reply", "mesh", "update", "updates", "params_request", "params_reply", "chunk",
    "heartbeat", "leave", "evicted", "shutdown", "status_request", "status_reply",
)
_FIELD_CODES = {name: code for code, name in enumerate(FIELD_NAMES)}
_OP_CODES = {name: code for code, name in enumerate(OP_NAMES)}


def compact_header(header: dict[str, Any]) -> dict[Any, Any]:
    """The header with its well-known field names and its op as codes (``v`` and other names kept)."""
    out: dict[Any, Any] = {}
    for name, value in header.items():
        if name == "op":
            value = _OP_CODES.get(value, value)
        out[_FIELD_CODES.get(name, name)] = value
    return out


def expand_header(header: dict[Any, Any]) -> dict[str, Any]:
    """The header with every field code and the op code put back as names.

    Raises FrameRejectedError: ``bad_header`` for a key that is neither a name nor a known code, or a
    field given twice (by name and by code); ``unknown_type`` for an op code out of range."""
    out: dict[str, Any] = {}
    for key, value in header.items():
        if type(key) is int:
            if not 0 <= key < len(FIELD_NAMES):
                raise FrameRejectedError(
                    "bad_header", f"unknown field code {key} (known: 0..{len(FIELD_NAMES) - 1})")
            name = FIELD_NAMES[key]
        elif type(key) is str:
            name = key
        else:
            raise FrameRejectedError("bad_header", f"a field is named by a string or a code, got {key!r:.40}")
        if name in out:
            raise FrameRejectedError("bad_header", f"field {name!r} given twice (by name and by code)")
        out[name] = value
    op = out.get("op")
    if type(op) is int:
        if not 0 <= op < len(OP_NAMES):
            raise FrameRejectedError(
                "unknown_type", f"unknown message type code {op} (known: 0..{len(OP_NAMES) - 1})")
        out["op"] = OP_NAMES[op]
    return out
