"""psrv.transport: frames on the wire, ZeroMQ sockets, mesh topology, controller and node roles."""

from __future__ import annotations

from psrv.transport.config import TransportConfig
from psrv.transport.controller import Controller
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
