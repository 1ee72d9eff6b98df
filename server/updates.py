"""Updates as the transport carries them: payloads checked against the model, and UPDATE / UPDATES
messages built from and split into ``(fields, payload)`` items.

The header of an update (its fields, their bounds, the payload's own header) is defined once, in
``psrv.encoding.update_header``; this module only turns its MalformedMessageError into the counted
rejection (``bad_payload``) and packs items into messages.

Updates travel in UPDATES: a row per update (its six fields as a list) and one raw buffer per row.
When updates queue up (a fast producer, a busy relay), sending them together saves the per-message
cost of Python and zmq, which dominates below ~100 KB. A lone update travels as an UPDATES of one
row too: its header is 29 bytes smaller than UPDATE's, which names each field (70 bytes against 99
with large ids), and on a small model that is a tenth of what an update costs on the wire. UPDATE is
still accepted. Receivers handle each row exactly like an UPDATE (validated, deduplicated, relayed,
applied once), so batching never changes what is applied.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
from psrv.encoding.errors import MalformedMessageError
from psrv.encoding.update_header import PayloadHeader, as_payload, fields_row, payload_header, row_fields
from psrv.transport.codec import frame_size
from psrv.transport.errors import FrameRejectedError
from psrv.transport.messages import MAX_BATCH, Message, Op

__all__ = [
    "MAX_BATCH",
    "MAX_BATCH_BYTES",
    "PayloadHeader",
    "batch_message",
    "check_payload",
    "groups",
    "unbatch",
]

MAX_BATCH_BYTES = 1024 * 1024  # payload bytes per message (a larger update travels alone)


def check_payload(
    payload: Any, size: int, what: str, max_tau: float = math.inf
) -> tuple[np.ndarray, PayloadHeader]:
    """An encoded message as an int32 array plus its header, checked against a model of ``size``."""
    try:
        array = as_payload(payload)
        return array, payload_header(array, size, max_tau)
    except MalformedMessageError as exc:
        raise FrameRejectedError("bad_payload", f"{what}: {exc}") from None


def batch_message(items: list[tuple[dict, Any]], src: int) -> Message:
    """One UPDATES message carrying ``(fields, buffer)`` items (one or more)."""
    rows = [fields_row(fields) for fields, _ in items]
    return Message(Op.UPDATES, {"updates": rows}, [buffer for _, buffer in items], src)


def unbatch(message: Message) -> list[tuple[dict, Any]]:
    """The ``(fields, buffer)`` items of an UPDATE or UPDATES message."""
    if message.op is Op.UPDATE:
        return [(message.fields, message.buffers[0])]
    return [
        (row_fields(row), buffer)
        for row, buffer in zip(message["updates"], message.buffers, strict=True)
    ]


def groups(items: list, size_of=lambda item: frame_size(item[1])) -> Iterator[list]:
    """Consecutive groups of at most MAX_BATCH items and MAX_BATCH_BYTES (at least one item each)."""
    group: list = []
    nbytes = 0
    for item in items:
        size = size_of(item)
        if group and (len(group) >= MAX_BATCH or nbytes + size > MAX_BATCH_BYTES):
            yield group
            group, nbytes = [], 0
        group.append(item)
        nbytes += size
    if group:
        yield group
