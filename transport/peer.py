"""One outgoing connection: a DEALER to a peer's ROUTER plus a bounded overflow queue; never blocks.

Back-pressure policy (per peer):

1. Frames go to the DEALER without blocking; it holds up to ``peer_queue_messages`` messages
   (SNDHWM) beside the kernel's TCP buffers.
2. When it is full, frames wait in the peer's ``pending`` queue (in order) and the I/O thread
   flushes them as soon as the socket is writable; nothing else waits for that peer.
3. A *relayed* update that finds ``pending`` already holding ``peer_queue_messages`` entries is
   dropped for that peer and counted (``updates_dropped_backpressure``). A node's *own* updates
   and control messages are never dropped; instead ``submit`` blocks once
   ``submit_queue_messages`` own updates are not yet handed to every neighbour (back-pressure on
   the training loop, at most until the slow neighbour's heartbeat timeout).
4. A peer silent for ``missed_beats`` heartbeats is declared offline: its socket is closed with
   zero linger and ``pending`` is freed; it must rejoin and catch up. A peer that is alive but
   missed dropped copies notices from the controller's heartbeat watermarks that it fell behind
   and re-syncs its parameters.

So a slow or frozen (SIGSTOPped) peer never stalls the others beyond its heartbeat timeout.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import zmq

__all__ = ["Peer"]


@dataclass
class Peer:
    node_id: int
    address: str
    socket: zmq.Socket
    # frames waiting for the socket, each with the Send's token (told ``sent()`` once they left)
    pending: deque[tuple[list[Any], Any]] = field(default_factory=deque)
    dropped: int = 0

    def close(self, linger_s: float = 0.0) -> None:
        """Close the DEALER; frames queued in zmq get ``linger_s`` to leave; ``pending`` is freed."""
        while self.pending:
            _, token = self.pending.popleft()
            if token is not None:
                token.sent()
        if not self.socket.closed:
            self.socket.close(linger=int(linger_s * 1000))
