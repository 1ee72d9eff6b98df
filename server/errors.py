"""Errors raised by psrv.server; every one derives from one base class."""

from __future__ import annotations

__all__ = ["ServerError"]


class ServerError(Exception):
    """Base class of every error raised by psrv.server."""
