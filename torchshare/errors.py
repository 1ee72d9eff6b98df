"""Errors raised by psrv.torch; every one derives from one base class.

Fatal errors (fix the call or the environment; retrying cannot help) derive from :class:`FatalTorchError`;
errors another attempt may cure (a launcher or controller that could not be reached in time) derive from
:class:`RetryableTorchError`.
"""

from __future__ import annotations


class TorchShareError(Exception):
    """Base class of every error raised by psrv.torch."""

    retryable = False


class FatalTorchError(TorchShareError):
    """Retrying cannot help: the call, the model or the environment is wrong."""


class RetryableTorchError(TorchShareError):
    """A transient condition: calling again (or Spark's task retry) may succeed."""

    retryable = True


class LauncherRequiredError(FatalTorchError, RuntimeError):
    """``init()`` or a DistributedOptimizer was used in a process no psrv launcher started."""


class SharingConfigError(FatalTorchError, ValueError):
    """An argument of DistributedOptimizer, run or init is invalid (the message names the fix)."""


class WorkerFailedError(FatalTorchError, RuntimeError):
    """A worker failed and its own exception could not travel back (the message holds its traceback)."""


class RendezvousError(RetryableTorchError, ConnectionError):
    """A worker could not reach its launcher, or the launcher gave up on the job (the message says why)."""


__all__ = [
    "FatalTorchError",
    "LauncherRequiredError",
    "RendezvousError",
    "RetryableTorchError",
    "SharingConfigError",
    "TorchShareError",
    "WorkerFailedError",
]
