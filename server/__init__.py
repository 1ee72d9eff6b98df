"""psrv.server: the parameter-server roles (controller, node, the liveness rules they share) and
the `psrv` command line."""

from __future__ import annotations

from typing import Any

from psrv.server.version import __version__

__all__ = ["Controller", "__version__"]


def __getattr__(name: str) -> Any:
    """``Controller`` is imported on first use: the command line starts without the I/O stack."""
    if name == "Controller":
        from psrv.server.controller import Controller

        return Controller
    raise AttributeError(f"module 'psrv.server' has no attribute {name!r}")
