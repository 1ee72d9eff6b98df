"""psrv.transport: frames on the wire, ZeroMQ sockets, mesh topology, and the one I/O loop.

The roles live in psrv.server; ``Node`` is still importable from here (lazily, so that importing
the transport does not import the server).
"""

from __future__ import annotations

from typing import Any

from psrv.transport.config import TransportConfig
from psrv.transport.controller import Controller
from psrv.transport.errors import ControllerLostError, JoinError, SendQueueFullError, TransportError

__all__ = [
    "Controller",
    "Node",
    "TransportConfig",
    "ControllerLostError",
    "JoinError",
    "SendQueueFullError",
    "TransportError",
]


def __getattr__(name: str) -> Any:
    if name == "Node":
        from psrv.server.node import Node

        return Node
    raise AttributeError(f"module 'psrv.transport' has no attribute {name!r}")
