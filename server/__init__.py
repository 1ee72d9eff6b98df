"""psrv.server: the parameter-server roles (controller, node, the liveness rules they share) and
the `psrv` command line."""

from __future__ import annotations

from typing import Any

from psrv.server.version import __version__

__all__ = ["Controller", "Node", "__version__"]


def __getattr__(name: str) -> Any:
    """``Controller`` and ``Node`` are imported on first use: the command line starts without the I/O
    stack."""
    if name == "Controller":
        from psrv.server.controller import Controller  # lazy: the CLI starts without the I/O stack (zmq)

        return Controller
    if name == "Node":
        from psrv.server.node import Node  # lazy: the CLI starts without the I/O stack (zmq)

        return Node
    raise AttributeError(f"module 'psrv.server' has no attribute {name!r}")
