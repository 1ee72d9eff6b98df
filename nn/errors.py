"""Errors raised by psrv.nn; every one derives from one base class."""

from __future__ import annotations


class NNError(Exception):
    """Base class of every error raised by psrv.nn."""
