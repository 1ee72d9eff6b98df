"""Per-link routing identities: what a member's connection to another member presents.

A joining node draws a random 16-byte ``session`` and sends it in JOIN (CURVE encrypts it when keys
are on). Its DEALER to member ``to`` presents the routing id ``link_id(session, to)``; the controller
binds the node to ``link_id(session, 0)`` (its id is accepted only on that connection) and tells
each node ``m``, in its routes, the ids its neighbours ``n`` present TO IT: ``link_id(session_n, m)``
(and its own, ``link_id(controller_session, m)``). So a member learns only ids that others present
to itself, never one it could present to a third member to pass for someone else: the session
stays secret (a keyed hash does not give its key away).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable

SESSION_BYTES = 16
LINK_ID_BYTES = 16


def new_session() -> bytes:
    """A fresh random session (one per join; the controller draws one per start)."""
    return os.urandom(SESSION_BYTES)


def link_id(session: bytes, to: int) -> bytes:
    """The routing id a process with ``session`` presents on its connection to member ``to``.

    The first byte is never 0 (zmq reserves routing ids that start with a zero byte)."""
    digest = bytearray(
        hashlib.blake2b(to.to_bytes(8, "big", signed=True), key=session, digest_size=LINK_ID_BYTES).digest()
    )
    digest[0] |= 0x80
    return bytes(digest)


def parse_session(text: str | None) -> bytes | None:
    """A JOIN's ``session`` (hex, checked by the catalogue) as bytes; None when absent."""
    return None if text is None else bytes.fromhex(text)


NAMES_KEPT = 65536  # names (and id -> name entries) the controller remembers at most


class MemberIdentities:
    """The controller's bindings of each member: the routing id of the connection it joined from,
    its join session and token, and the names seen (a known name marks a restart)."""

    def __init__(self) -> None:
        self.tokens: dict[str, int] = {}
        self.routing: dict[int, bytes] = {}  # member id -> routing id of the connection it joined from
        self.by_routing: dict[bytes, int] = {}
        self.sessions: dict[int, bytes] = {}  # member id -> its join session (per-link routing ids)
        self.names_seen: dict[str, None] = {}  # insertion-ordered, the oldest forgotten beyond NAMES_KEPT
        self.names_by_id: dict[int, str | None] = {}  # every id admitted (the newest NAMES_KEPT)

    def seen_name(self, name: str | None) -> bool:
        """Was ``name`` seen at an earlier join (a restart)? Remembers it."""
        if name is None:
            return False
        restart = name in self.names_seen
        self.names_seen[name] = None
        if len(self.names_seen) > NAMES_KEPT:
            del self.names_seen[next(iter(self.names_seen))]
        return restart

    def bind(
        self, node_id: int, routing_id: bytes, session: bytes | None, token: str, name: str | None
    ) -> None:
        self.tokens[token] = node_id
        self.names_by_id[node_id] = name
        if len(self.names_by_id) > NAMES_KEPT:
            del self.names_by_id[next(iter(self.names_by_id))]
        self.routing[node_id] = routing_id
        self.by_routing[routing_id] = node_id
        if session is not None:
            self.sessions[node_id] = session

    def forget(self, node_id: int, token: str | None) -> None:
        if token is not None:
            self.tokens.pop(token, None)
        routing_id = self.routing.pop(node_id, None)
        if routing_id is not None and self.by_routing.get(routing_id) == node_id:
            del self.by_routing[routing_id]
        self.sessions.pop(node_id, None)

    def routes_for(self, node_id: int, neighbours: Iterable[int], to_it: bytes) -> dict[int, str]:
        """The routing ids ``node_id`` accepts messages from: ``to_it`` (what the controller presents
        to it) and those its neighbours present on their connections TO IT (a node that joined with
        no session: the one it joined from)."""
        routes = {0: to_it.hex()}
        for other in neighbours:
            session = self.sessions.get(other)
            if session is not None:
                routes[other] = link_id(session, node_id).hex()
            elif other in self.routing:
                routes[other] = self.routing[other].hex()
        return routes


__all__ = [
    "LINK_ID_BYTES", "NAMES_KEPT", "SESSION_BYTES", "MemberIdentities", "link_id", "new_session",
    "parse_session",
]
