"""The one versioned catalogue of psrv transport messages, and op -> handler dispatch.

Every message on the wire is a small msgpack header (a map) followed by zero or more raw
buffers. The header always holds ``v`` (PROTOCOL_VERSION), ``op`` (an Op value) and ``src``
(the sender's node id: 0 the controller, -1 a process that has not joined). The other header
fields and the number of buffers of each op are listed in CATALOGUE; the codec checks them on
receipt, so a handler only ever sees a well-formed message.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from psrv.encoding import update_header
from psrv.encoding.errors import MalformedMessageError
from psrv.transport.errors import FrameRejectedError

__all__ = [
    "BOOL", "CATALOGUE", "DICT", "DTYPES", "ENCODINGS", "INT", "INT64_MAX", "LIST", "MAX_BATCH",
    "MAX_ORIGINS", "MAX_STATS", "MAX_TEXT", "NUM", "OPT_STR", "PROTOCOL_VERSION", "RESERVED", "STR",
    "UNJOINED", "check_int_map", "check_routes", "check_text", "handler_table", "is_int", "Message", "Op",
    "Schema",
]

#: 2: packed update bodies are a Golomb-Rice bit stream (1: LEB128 varints), and a lone update
#: travels as an UPDATES of one row; 3: updates of up to 2 KiB in all travel in one compact frame
#: (``psrv.encoding.update_frame``) instead of a msgpack header and their payloads; 4: a heartbeat's
#: well-known stat names travel as codes (``psrv.transport.stat_codes``), and a node's beat may carry
#: only the stats that changed since its previous one (``delta``); 5: a header's field names and its
#: op travel as codes (``psrv.transport.header_codes``); 6: the loop's gauges travel as codes too, and
#: a membership's first beat carries only how its stats differ from ``stat_codes.BEAT_BASELINE``
PROTOCOL_VERSION = 6
UNJOINED = -1  # the ``src`` of a process that has no node id yet (joining node, `psrv status`)


class Op(StrEnum):
    JOIN = "join"  # node -> controller: please place me (address, name, token)
    JOIN_REPLY = "join_reply"  # controller -> node: id, mesh, restart flag, heartbeat
    MESH = "mesh"  # controller -> every live node: the new mesh version
    UPDATE = "update"  # any -> neighbours: one encoded update, its fields by name (accepted; not sent)
    UPDATES = "updates"  # any -> neighbours: 1-256 updates, a header row and a payload each
    PARAMS_REQUEST = "params_request"  # node -> controller: send me the master copy
    PARAMS_REPLY = "params_reply"  # controller -> node: params (+ updater state) + seen sequences
    CHUNK = "chunk"  # one piece of a large message (its inner header rides along)
    HEARTBEAT = "heartbeat"  # both ways; node->controller carries stats, controller->node watermarks
    LEAVE = "leave"  # node -> controller: I am stopping
    EVICTED = "evicted"  # controller -> node: you are not (or no longer) a member; rejoin
    SHUTDOWN = "shutdown"  # controller -> nodes: the controller is stopping
    STATUS_REQUEST = "status_request"  # anyone -> controller
    STATUS_REPLY = "status_reply"  # controller -> asker: nodes, mesh, counters


INT = (int,)
NUM = (int, float)
STR = (str,)
OPT_STR = (str, type(None))
DICT = (dict,)
LIST = (list, tuple)
BOOL = (bool,)


INT64_MAX = update_header.INT64_MAX
MAX_TEXT = 1024  # reasons, names, tokens, encodings: short strings
MAX_ORIGINS = 1 << 20  # entries of a watermark map (pruned to members + recently departed in practice)
MAX_STATS = 256  # entries of a heartbeat's stats map
DTYPES = frozenset(f"{order}f{size}" for order in "<>=|" for size in (2, 4, 8)) | {"f2", "f4", "f8"}
ENCODINGS = update_header.ENCODINGS
MAX_BATCH = 256  # updates (rows and buffers) of one UPDATES message


def _bad(op: str, detail: str) -> FrameRejectedError:
    return FrameRejectedError("bad_field", f"{op}: {detail}")


def is_int(value: object, low: int = 0, high: int = INT64_MAX) -> bool:
    """A real int (not a bool) within [low, high]: what every id, sequence and size must be."""
    return type(value) is int and low <= value <= high


def check_text(op: str, name: str, value: object, limit: int = MAX_TEXT) -> None:
    if value is not None and len(value) > limit:
        raise _bad(op, f"{name} of {len(value)} characters > {limit}")


def check_int_map(op: str, name: str, value: dict, low_key: int = 1, low_value: int = 0) -> None:
    """A map of origin id -> int (a watermark): ints only, no bools, no huge numbers."""
    if len(value) > MAX_ORIGINS:
        raise _bad(op, f"{name} holds {len(value)} entries > {MAX_ORIGINS}")
    for key, item in value.items():
        if not (is_int(key, low_key) and is_int(item, low_value)):
            raise _bad(
                op, f"{name} must map origin ids to ints >= {low_value}, got {key!r:.40}: {item!r:.40}"
            )


def _join(f: dict) -> None:
    check_text("join", "address", f["address"], 300)
    check_text("join", "name", f["name"])
    check_text("join", "token", f["token"], 128)
    session = f["session"]
    if session is not None and not (len(session) == 32 and _HEX.issuperset(session)):
        raise _bad("join", f"session must be 32 lowercase hex digits, got {session!r:.40}")


def _join_reply(f: dict) -> None:
    if not is_int(f["node_id"], 1):
        raise _bad("join_reply", f"node_id must be an int >= 1, got {f['node_id']!r:.40}")
    beat = f["heartbeat_s"]
    if not (math.isfinite(beat) and 0 < beat <= 3600) or not is_int(f["missed_beats"], 1, 10_000):
        raise _bad("join_reply", f"bad heartbeat pace {beat!r:.40} x {f['missed_beats']!r:.40}")
    check_text("join_reply", "token", f["token"], 128)
    check_routes("join_reply", f["routes"])


_HEX = frozenset("0123456789abcdef")


def check_routes(op: str, routes: dict) -> None:
    """node id -> routing id (hex) of the senders a node accepts: the controller and its neighbours."""
    if len(routes) > 4096:
        raise _bad(op, f"routes holds {len(routes)} entries")
    for key, item in routes.items():
        if not (is_int(key) and isinstance(item, str) and 0 < len(item) <= 64 and not len(item) % 2):
            raise _bad(op, f"routes must map node ids to routing ids, got {key!r:.40}: {item!r:.40}")
        if not _HEX.issuperset(item):
            raise _bad(op, f"a routing id must be lowercase hex, got {item!r:.40}")


def _mesh(f: dict) -> None:
    if not is_int(f["version"]):
        raise _bad("mesh", f"version must be an int >= 0, got {f['version']!r:.40}")
    check_routes("mesh", f["routes"])


def _update(f: dict) -> None:
    try:
        update_header.check_fields(f["origin"], f["seq"], f["iteration"], f["epoch"], f["tau"], f["encoding"])
    except MalformedMessageError as exc:
        raise _bad("update", str(exc)) from None


def _updates(f: dict) -> None:
    try:
        for row in f["updates"]:
            update_header.check_row(row)
    except MalformedMessageError as exc:
        raise _bad("updates", str(exc)) from None


def _params_request(f: dict) -> None:
    if not is_int(f["request_id"]):
        raise _bad("params_request", f"request_id must be an int >= 0, got {f['request_id']!r:.40}")


def _params_reply(f: dict) -> None:
    op = "params_reply"
    if not is_int(f["request_id"]):
        raise _bad(op, f"request_id must be an int >= 0, got {f['request_id']!r:.40}")
    for dtype, size in ((f["dtype"], f["size"]), (f["updater_dtype"], f["updater_size"])):
        if dtype is not None and dtype not in DTYPES:
            raise _bad(op, f"dtype must be a float dtype such as '<f4', got {dtype!r:.40}")
        if not is_int(size, 0, INT64_MAX // 8):
            raise _bad(op, f"size must be an int >= 0, got {size!r:.40}")
    check_int_map(op, "watermark", f["watermark"])
    for name in ("extra_seen", "given_up"):
        _check_seq_map(op, name, f[name] or {})


def _check_seq_map(op: str, name: str, value: dict) -> None:
    if len(value) > MAX_ORIGINS:
        raise _bad(op, f"{name} holds {len(value)} entries")
    for key, seqs in value.items():
        if not (is_int(key, 1) and isinstance(seqs, list | tuple) and all(is_int(s, 1) for s in seqs)):
            raise _bad(op, f"{name} must map origin ids to lists of seqs, got {key!r:.40}: {seqs!r:.40}")


def _chunk(f: dict) -> None:
    for name in ("msg_id", "index", "count", "offset", "total"):
        if not is_int(f[name]):
            raise _bad("chunk", f"{name} must be an int >= 0, got {f[name]!r:.40}")
    if len(f["lengths"]) > 1024 or not all(is_int(n) for n in f["lengths"]):
        raise _bad("chunk", f"lengths must be a short list of ints >= 0, got {f['lengths']!r:.80}")


def _heartbeat(f: dict) -> None:
    if not is_int(f["mesh_version"]):
        raise _bad("heartbeat", f"mesh_version must be an int >= 0, got {f['mesh_version']!r:.40}")
    stats = f["stats"]
    if len(stats) > MAX_STATS or not all(isinstance(k, str) and len(k) <= 128 for k in stats):
        raise _bad("heartbeat", f"stats must map at most {MAX_STATS} short names to values")
    check_int_map("heartbeat", "watermark", f["watermark"])


def _reason(op: str) -> Callable[[dict], None]:
    def check(f: dict) -> None:
        check_text(op, "reason", f["reason"])

    return check


@dataclass(frozen=True)
class Schema:
    """What the header of one op must hold (types, then ``check`` for values), and how many raw
    buffers follow it. ``check`` raises FrameRejectedError; a handler only sees values it passed."""

    fields: dict[str, tuple[type, ...]]
    min_buffers: int = 0
    max_buffers: int = 0
    check: Callable[[dict], None] | None = None
    optional: frozenset[str] = frozenset()  # fields a sender may leave out (they read as None)


CATALOGUE: dict[Op, Schema] = {
    # session: 16 random bytes (hex) per join, the key of the node's per-link routing ids
    # (server/identity.py); a node that sends none is bound to the routing id it joined from
    Op.JOIN: Schema(
        {"address": STR, "name": OPT_STR, "token": STR, "session": OPT_STR},
        check=_join,
        optional=frozenset({"session"}),
    ),
    Op.JOIN_REPLY: Schema(
        {
            "node_id": INT,
            "mesh": DICT,
            "restart": BOOL,
            "heartbeat_s": NUM,
            "missed_beats": INT,
            "token": STR,
            "routes": DICT,
        },
        check=_join_reply,
    ),
    Op.MESH: Schema({"mesh": DICT, "version": INT, "routes": DICT}, check=_mesh),
    Op.UPDATE: Schema(dict(update_header.FIELD_TYPES), 1, 1, check=_update),
    Op.UPDATES: Schema({"updates": LIST}, 1, MAX_BATCH, check=_updates),
    Op.PARAMS_REQUEST: Schema({"request_id": INT, "want_updater": BOOL}, check=_params_request),
    Op.PARAMS_REPLY: Schema(
        {
            "request_id": INT,
            "dtype": STR,
            "size": INT,
            "updater_dtype": OPT_STR,
            "updater_size": INT,
            "watermark": DICT,
            "extra_seen": DICT,
            "given_up": DICT,
        },
        1,
        2,
        check=_params_reply,
        optional=frozenset({"given_up"}),
    ),
    Op.CHUNK: Schema(
        {
            "msg_id": INT,
            "index": INT,
            "count": INT,
            "offset": INT,
            "total": INT,
            "inner": DICT,
            "lengths": LIST,
        },
        1,
        1,
        check=_chunk,
    ),
    # delta: the stats are those that changed since the sender's previous beat (absent: all of them)
    Op.HEARTBEAT: Schema({"mesh_version": INT, "stats": DICT, "watermark": DICT, "delta": BOOL},
                         check=_heartbeat, optional=frozenset({"delta"})),
    Op.LEAVE: Schema({"reason": STR}, check=_reason("leave")),
    Op.EVICTED: Schema({"reason": STR, "node_id": INT}, check=_reason("evicted")),
    Op.SHUTDOWN: Schema({"reason": STR}, check=_reason("shutdown")),
    Op.STATUS_REQUEST: Schema({}),
    Op.STATUS_REPLY: Schema({"status": DICT}),
}

RESERVED = ("v", "op", "src")


@dataclass
class Message:
    """One decoded (or to-be-encoded) message: op, sender id, header fields and raw buffers."""

    op: Op
    fields: dict[str, Any] = field(default_factory=dict)
    buffers: list[Any] = field(default_factory=list)  # bytes, memoryview, numpy arrays or zmq.Frame
    src: int = UNJOINED

    def __getitem__(self, name: str) -> Any:
        return self.fields[name]

    def header(self) -> dict[str, Any]:
        return {"v": PROTOCOL_VERSION, "op": self.op.value, "src": self.src, **self.fields}


def handler_table(owner: object) -> dict[Op, Callable[..., None]]:
    """Map each op to ``owner.on_<op>`` where the owner defines it (ops it does not handle are absent)."""
    table: dict[Op, Callable[..., None]] = {}
    for op in Op:
        method = getattr(owner, f"on_{op.value}", None)
        if method is not None:
            table[op] = method
    return table
