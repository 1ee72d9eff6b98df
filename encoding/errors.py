"""Errors raised by psrv.encoding; every one derives from one base class."""

from __future__ import annotations


class EncodingError(Exception):
    """Base class of every error raised by psrv.encoding."""
