"""Several updates in one message: UPDATES carries a row per update and one raw buffer per row.

When updates queue up (a fast producer, a busy relay), sending them together saves the
per-message cost of Python and zmq, which dominates below ~100 KB. A lone update still travels
as a plain UPDATE. Receivers handle each row exactly like an UPDATE (validated, deduplicated,
relayed, applied once), so batching never changes what is applied.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from psrv.transport.codec import frame_size
from psrv.transport.messages import Message, Op

UPDATE_KEYS = ("origin", "seq", "iteration", "epoch", "tau", "encoding")
MAX_BATCH = 256  # updates per message
MAX_BATCH_BYTES = 1024 * 1024  # payload bytes per message (a larger update travels alone)


def batch_message(items: list[tuple[dict, Any]], src: int) -> Message:
    """One UPDATE (a single item) or one UPDATES message carrying ``(fields, buffer)`` items."""
    if len(items) == 1:
        fields, buffer = items[0]
        return Message(Op.UPDATE, fields, [buffer], src)
    rows = [[fields[k] for k in UPDATE_KEYS] for fields, _ in items]
    return Message(Op.UPDATES, {"updates": rows}, [buffer for _, buffer in items], src)


def unbatch(message: Message) -> list[tuple[dict, Any]]:
    """The ``(fields, buffer)`` items of an UPDATE or UPDATES message."""
    if message.op is Op.UPDATE:
        return [(message.fields, message.buffers[0])]
    return [
        (dict(zip(UPDATE_KEYS, row, strict=True)), buffer)
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
