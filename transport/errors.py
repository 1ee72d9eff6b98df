"""Errors raised by psrv.transport; every one derives from one base class."""

from __future__ import annotations


class TransportError(Exception):
    """Base class of every error raised by psrv.transport."""
