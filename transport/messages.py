"""The one versioned catalogue of psrv transport messages, and op -> handler dispatch.

Every message on the wire is a small msgpack header (a map) followed by zero or more raw
buffers. The header always holds ``v`` (PROTOCOL_VERSION), ``op`` (an Op value) and ``src``
(the sender's node id: 0 the controller, -1 a process that has not joined). The other header
fields and the number of buffers of each op are listed in CATALOGUE; the codec checks them on
receipt, so a handler only ever sees a well-formed message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

PROTOCOL_VERSION = 1
UNJOINED = -1  # the ``src`` of a process that has no node id yet (joining node, `psrv status`)


class Op(StrEnum):
    JOIN = "join"  # node -> controller: please place me (address, name, token)
    JOIN_REPLY = "join_reply"  # controller -> node: id, mesh, restart flag, heartbeat
    MESH = "mesh"  # controller -> every live node: the new mesh version
    UPDATE = "update"  # any -> neighbours: one encoded update (payload: int32 message)
    UPDATES = "updates"  # any -> neighbours: several updates, a header row and a payload each
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


@dataclass(frozen=True)
class Schema:
    """What the header of one op must hold, and how many raw buffers follow it."""

    fields: dict[str, tuple[type, ...]]
    min_buffers: int = 0
    max_buffers: int = 0


CATALOGUE: dict[Op, Schema] = {
    Op.JOIN: Schema({"address": STR, "name": OPT_STR, "token": STR}),
    Op.JOIN_REPLY: Schema(
        {"node_id": INT, "mesh": DICT, "restart": BOOL, "heartbeat_s": NUM, "missed_beats": INT, "token": STR}
    ),
    Op.MESH: Schema({"mesh": DICT, "version": INT}),
    Op.UPDATE: Schema(
        {"origin": INT, "seq": INT, "iteration": INT, "epoch": INT, "tau": NUM, "encoding": STR}, 1, 1
    ),
    Op.UPDATES: Schema({"updates": LIST}, 2, 256),
    Op.PARAMS_REQUEST: Schema({"request_id": INT, "want_updater": BOOL}),
    Op.PARAMS_REPLY: Schema(
        {
            "request_id": INT,
            "dtype": STR,
            "size": INT,
            "updater_dtype": OPT_STR,
            "updater_size": INT,
            "watermark": DICT,
            "extra_seen": DICT,
        },
        1,
        2,
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
    ),
    Op.HEARTBEAT: Schema({"mesh_version": INT, "stats": DICT, "watermark": DICT}),
    Op.LEAVE: Schema({"reason": STR}),
    Op.EVICTED: Schema({"reason": STR}),
    Op.SHUTDOWN: Schema({"reason": STR}),
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
