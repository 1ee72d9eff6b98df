"""Large messages in chunks: zero-copy splitting and bounded, expiring reassembly.

A message whose buffers exceed ``chunk_bytes`` travels as CHUNK messages, each carrying the
original header (``inner``), the buffer lengths and one slice of the concatenated buffers.
The Reassembler holds at most ``limit_bytes`` of incomplete messages and drops any message
not completed within ``expiry_s`` (DL4J's incomplete chunks lived forever).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from psrv.transport.codec import as_buffer, frame_size
from psrv.transport.errors import FrameRejectedError
from psrv.transport.messages import Message, Op

__all__ = ["ChunkPlan", "needs_chunking", "Reassembler", "split_message"]


def needs_chunking(message: Message, chunk_bytes: int) -> bool:
    return sum(frame_size(b) for b in message.buffers) > chunk_bytes


class ChunkPlan:
    """The CHUNK messages of ``message``, built one at a time (``part(i)``): a large reply can be
    handed to a socket piece by piece, interleaved with other traffic. Slices are views of its
    buffers (no copy); a piece never spans two buffers, so ``count`` may exceed
    ceil(total / chunk_bytes) by one per buffer."""

    def __init__(self, message: Message, chunk_bytes: int, msg_id: int) -> None:
        self.inner = message.header()
        self.src = message.src
        self.msg_id = msg_id
        views = [as_buffer(b) for b in message.buffers]
        self.lengths = [v.nbytes for v in views]
        self.total = sum(self.lengths)
        self.pieces: list[tuple[int, memoryview]] = []
        offset = 0
        for view in views:
            for start in range(0, view.nbytes, chunk_bytes):
                self.pieces.append((offset + start, view[start : start + chunk_bytes]))
            offset += view.nbytes
        self.count = len(self.pieces)

    def part(self, index: int) -> Message:
        off, piece = self.pieces[index]
        return Message(
            Op.CHUNK,
            {
                "msg_id": self.msg_id,
                "index": index,
                "count": self.count,
                "offset": off,
                "total": self.total,
                "inner": self.inner,
                "lengths": self.lengths,
            },
            [piece],
            self.src,
        )


def split_message(message: Message, chunk_bytes: int, msg_id: int) -> list[Message]:
    """CHUNK messages carrying ``message``; slices are views of its buffers (no copy)."""
    plan = ChunkPlan(message, chunk_bytes, msg_id)
    return [plan.part(i) for i in range(plan.count)]


@dataclass
class _Partial:
    total: int
    count: int
    inner: dict[str, Any]
    lengths: list[int]
    data: bytearray
    started: float
    received: set[int] = field(default_factory=set)


class Reassembler:
    """Collects chunks per (sender, msg_id); memory-bounded, with expiry on an injected clock."""

    def __init__(
        self,
        limit_bytes: int,
        expiry_s: float,
        clock: Callable[[], float] = time.monotonic,
        peer_limit_bytes: int | None = None,
    ) -> None:
        self.limit_bytes = limit_bytes
        self.peer_limit_bytes = (
            limit_bytes if peer_limit_bytes is None else min(peer_limit_bytes, limit_bytes)
        )
        self.expiry_s = expiry_s
        self.clock = clock
        self._partials: dict[tuple[Any, int], _Partial] = {}
        self._per_sender: dict[Any, int] = {}  # bytes reserved by each sender's incomplete messages
        self.in_flight_bytes = 0

    def __len__(self) -> int:
        return len(self._partials)

    def add(self, sender: Any, chunk: Message) -> tuple[dict[str, Any], list[memoryview]] | None:
        """Store one chunk; return (inner header, buffers) when the message is complete."""
        f = chunk.fields
        key = (sender, f["msg_id"])
        partial = self._partials.get(key)
        if partial is None:
            if f["total"] > self.limit_bytes - self.in_flight_bytes:
                raise FrameRejectedError(
                    "bad_chunk",
                    f"chunked message of {f['total']} bytes exceeds the "
                    f"reassembly budget ({self.in_flight_bytes}/{self.limit_bytes} in use)",
                )
            held = self._per_sender.get(sender, 0)
            if f["total"] > self.peer_limit_bytes - held:
                raise FrameRejectedError(
                    "bad_chunk",
                    f"chunked message of {f['total']} bytes exceeds this sender's reassembly budget "
                    f"({held}/{self.peer_limit_bytes} in use)",
                )
            self._per_sender[sender] = held + f["total"]
            partial = _Partial(
                f["total"], f["count"], f["inner"], list(f["lengths"]), bytearray(f["total"]), self.clock()
            )
            self._partials[key] = partial
            self.in_flight_bytes += partial.total
        elif (partial.total, partial.count, partial.lengths) != (f["total"], f["count"], list(f["lengths"])):
            self._drop(key)
            raise FrameRejectedError(
                "bad_chunk", f"chunk {f['index']} of message {f['msg_id']} disagrees with the earlier chunks"
            )
        if f["index"] in partial.received:
            return None  # a repeated chunk changes nothing
        piece = as_buffer(chunk.buffers[0])
        partial.data[f["offset"] : f["offset"] + piece.nbytes] = piece
        partial.received.add(f["index"])
        if len(partial.received) < partial.count:
            return None
        self._drop(key)
        whole = memoryview(partial.data)
        buffers, start = [], 0
        for length in partial.lengths:
            buffers.append(whole[start : start + length])
            start += length
        return partial.inner, buffers

    def expire(self) -> int:
        """Drop every incomplete message older than expiry_s; return how many were dropped."""
        now = self.clock()
        old = [key for key, p in self._partials.items() if now - p.started > self.expiry_s]
        for key in old:
            self._drop(key)
        return len(old)

    def _drop(self, key: tuple[Any, int]) -> None:
        partial = self._partials.pop(key, None)
        if partial is not None:
            self.in_flight_bytes -= partial.total
            left = self._per_sender.pop(key[0], 0) - partial.total
            if left > 0:
                self._per_sender[key[0]] = left
