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
