"""Errors raised by psrv.spark; every one derives from one base class."""

from __future__ import annotations


class SparkError(Exception):
    """Base class of every error raised by psrv.spark."""
