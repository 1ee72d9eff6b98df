"""psrv.transport: frames on the wire, ZeroMQ sockets, the I/O loop, mesh topology.

The roles live in psrv.server; ``Controller`` is still importable from here (resolved on first use,
so importing the transport never imports the server)."""

from __future__ import annotations

from typing import Any

from psrv.transport.config import TransportConfig
from psrv.transport.errors import ControllerLostError, JoinError, SendQueueFullError, TransportError
from psrv.transport.node import Node

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
    raise AttributeError(f"module 'psrv.transport' has no attribute {name!r}")
