"""What a node keeps so that a re-sync loses nothing: a bounded ring of the updates it applied
and the updates that arrived while a parameter download was under way.

After a download (the master copy plus the exact set of sequences it includes), the node
re-applies from the ring what the copy lacks (its own updates still in flight, typically) and
then the held updates the copy does not include. When the node rejoins under a new id, the ring
keeps only its own updates of the ids it held before (``keep_only``): those the master copy turns
out to lack are re-applied and re-sent after the catch-up. Plain object, no sockets; the caller
holds the node's lock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator

import numpy as np
from psrv.server.seen import covered

__all__ = ["Entry", "ReplayLog"]

Entry = tuple[int, int, np.ndarray, dict]  # origin, seq, encoded payload, header fields


class ReplayLog:
    """The applied-updates ring (bounded by count and bytes) and the held list (bounded by count)."""

    def __init__(self, max_messages: int, max_bytes: int) -> None:
        self.max_messages = max_messages
        self.max_bytes = max_bytes
        self.ring: deque[Entry] = deque()
        self.ring_bytes = 0
        self.evicted: dict[int, int] = {}  # per origin: the highest seq that fell out of the ring
        self.held: list[Entry] = []

    def remember(self, origin: int, seq: int, payload: np.ndarray, fields: dict) -> None:
        """Keep an applied update; the oldest fall out when the ring is over either bound."""
        self.ring.append((origin, seq, payload, fields))
        self.ring_bytes += payload.nbytes
        while self.ring and (len(self.ring) > self.max_messages or self.ring_bytes > self.max_bytes):
            o, s, p, _ = self.ring.popleft()
            self.ring_bytes -= p.nbytes
            self.evicted[o] = max(self.evicted.get(o, 0), s)

    def hold(self, origin: int, seq: int, payload: np.ndarray, fields: dict) -> bool:
        """Keep an update that arrived during a download; False when full (a later re-sync covers it)."""
        if len(self.held) >= self.max_messages:
            return False
        self.held.append((origin, seq, payload, fields))
        return True

    def take_held(self) -> list[Entry]:
        held, self.held = self.held, []
        return held

    def missing_from(self, watermark: dict[int, int], extra: dict[int, set[int]]) -> Iterator[Entry]:
        """Ring entries a download with this watermark (plus ``extra`` seqs) does not include."""
        return (e for e in self.ring if not covered(watermark, extra, e[0], e[1]))

    def incomplete(self, watermark: dict[int, int]) -> list[int]:
        """Origins whose updates fell out of the ring before the download's watermark covered them."""
        return [o for o, s in self.evicted.items() if s > watermark.get(o, 0)]

    def own(self, origin: int, after: int, upto: int) -> list[tuple[int, np.ndarray, dict]]:
        """``(seq, payload, fields)`` of ``origin``'s updates with after < seq <= upto still in the ring."""
        return [(s, p, f) for o, s, p, f in self.ring if o == origin and after < s <= upto]

    def keep_only(self, keep: Callable[[int, int], bool]) -> None:
        """Drop every entry but those ``keep(origin, seq)`` accepts (a rejoin: only own ones stay),
        and the held list; what fell out before stays recorded only for the kept origins."""
        kept = [e for e in self.ring if keep(e[0], e[1])]
        self.clear()
        for origin, seq, payload, fields in kept:
            self.remember(origin, seq, payload, fields)

    def take(self, origins: set[int]) -> list[Entry]:
        """Remove and return the ring's entries of ``origins``, oldest first."""
        taken = [e for e in self.ring if e[0] in origins]
        if taken:
            self.ring = deque(e for e in self.ring if e[0] not in origins)
            self.ring_bytes -= sum(e[2].nbytes for e in taken)
        return taken

    def clear(self) -> None:
        self.ring.clear()
        self.ring_bytes = 0
        self.evicted.clear()
        self.held.clear()
