"""A test hook of the node facade: lose one own update on its way out, on purpose.

Fault injection for tests that run real sockets everywhere: a TCP proxy cannot drop one ZeroMQ
message without corrupting the stream, so the node itself discards every copy it sends of its next
own update message (to each neighbour, and the re-sends of its beat repairs) for as long as it holds
the id it had when armed. After a rejoin (a new id) what the node sends of it passes. Off unless a
test calls ``Node.drop_next_own_update_upstream()``; nothing in psrv calls it.
"""

from __future__ import annotations

from psrv.server.updates import unbatch
from psrv.transport.events import Action, Send
from psrv.transport.messages import Op

__all__ = ["OwnUpdateLoss"]


class OwnUpdateLoss:
    """The own update (origin, seqs) being lost, and how many sends were discarded."""

    def __init__(self, origin: int) -> None:
        self.origin = origin
        self.seqs: set[int] = set()  # the seqs of the next own update message, once it is sent
        self.dropped = 0  # sends discarded

    def drops(self, action: Action, node_id: int) -> bool:
        """Is ``action`` a send of the lost update while the node still holds its id? (Counted.)"""
        if node_id != self.origin or type(action) is not Send:
            return False
        if action.message.op not in (Op.UPDATE, Op.UPDATES):
            return False
        mine = {fields["seq"] for fields, _ in unbatch(action.message) if fields["origin"] == self.origin}
        if not mine or (self.seqs and not mine & self.seqs):
            return False
        if not self.seqs:
            self.seqs = mine
        self.dropped += 1
        return True
