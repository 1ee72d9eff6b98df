"""psrv.transport: the vocabulary (messages, events), the wire (frames, chunking, sockets, keys) and the
one I/O loop that runs a role's machine. The roles themselves (``Controller``, ``Node``) are in
psrv.server."""

from __future__ import annotations

from psrv.transport.config import TransportConfig
from psrv.transport.errors import ControllerLostError, JoinError, SendQueueFullError, TransportError

__all__ = [
    "TransportConfig",
    "ControllerLostError",
    "JoinError",
    "SendQueueFullError",
    "TransportError",
]
