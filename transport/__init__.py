"""psrv.transport: frames on the wire, ZeroMQ sockets, the I/O loop, mesh topology.

The roles live in psrv.server; ``Controller`` and ``Node`` are still importable from here (resolved on
first use, so importing the transport never imports the server)."""

from __future__ import annotations

from typing import Any

from psrv.transport.config import TransportConfig
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
    if name == "Controller":
        from psrv.server.controller import Controller

        return Controller
    if name == "Node":
        from psrv.server.node import Node

        return Node
    raise AttributeError(f"module 'psrv.transport' has no attribute {name!r}")
