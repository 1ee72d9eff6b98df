"""Large messages (parameter downloads) handed to the sockets in paced pieces, in turns.

A join burst used to hand every asking node's whole copy of the model to zmq at once. The I/O
loop instead gives each active download its next piece when that member's connection has nothing
waiting, at most ``DOWNLOAD_TURN_BYTES`` per loop iteration over all downloads, in turns: the loop
keeps ticking (beats, expiry) and the downloads progress together. Which snapshot a member gets
(and when one is shared) is protocol: server/downloads.py, used by the controller's machine.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import Any

from psrv.transport.chunking import ChunkPlan

__all__ = ["DOWNLOAD_CHUNK_MAX_BYTES", "DOWNLOAD_TURN_BYTES", "Paced", "PacedDownloads"]

DOWNLOAD_CHUNK_MAX_BYTES = 4 * 1024 * 1024  # finer turns than chunk_bytes (16 MiB) between downloads
DOWNLOAD_TURN_BYTES = 8 * 1024 * 1024  # handed to zmq per loop iteration, all downloads together


@dataclass
class Paced:
    """One download in progress: its pieces, the next one to hand over, the machine's token."""

    peer: int
    plan: ChunkPlan
    token: Any = None
    next_index: int = 0
    queued: bool = False  # a piece of it waits in the member's overflow queue (one at most)

    @property
    def done(self) -> bool:
        return self.next_index >= self.plan.count

    def sent(self) -> None:
        """The queued piece reached the socket (called like a Send token's ``sent``)."""
        self.queued = False


class PacedDownloads:
    """The active downloads of one process, one per member (a new one replaces the old)."""

    def __init__(self) -> None:
        self.active: dict[int, Paced] = {}
        self.order: deque[int] = deque()

    def start(self, peer: int, plan: ChunkPlan, token: Any = None) -> Paced:
        self.end(peer)
        paced = self.active[peer] = Paced(peer, plan, token)
        self.order.append(peer)
        return paced

    def end(self, peer: int) -> None:
        """Finished, replaced or cancelled: forget it and tell its token."""
        paced = self.active.pop(peer, None)
        if paced is None:
            return
        with contextlib.suppress(ValueError):
            self.order.remove(peer)
        if paced.token is not None:
            paced.token.sent()

    def end_all(self) -> None:
        for peer in list(self.active):
            self.end(peer)

    def next_turns(self) -> list[Paced]:
        """Every active download once, starting after the one served first last time (fair turns)."""
        if self.order:
            self.order.rotate(-1)
        return [self.active[p] for p in list(self.order)]

    def __bool__(self) -> bool:
        return bool(self.active)

    def __len__(self) -> int:
        return len(self.active)
