"""Errors raised by psrv.spark; every one derives from one base class.

Fatal errors (fix the input or the configuration; retrying cannot help) derive from
:class:`FatalSparkError`; errors a Spark task retry may cure (a slow data source, an
unreachable peer) derive from :class:`RetryableSparkError`.
"""

from __future__ import annotations


class SparkError(Exception):
    """Base class of every error raised by psrv.spark."""


class FatalSparkError(SparkError):
    """Retrying the task or the job cannot help: the input or the configuration is wrong."""


class RetryableSparkError(SparkError):
    """A transient condition: Spark's task retry (or calling again) may succeed."""


class SparkConfigError(FatalSparkError, ValueError):
    """A training master, SparkNetwork or VoidConfiguration option is invalid."""


class SparkInputError(FatalSparkError, ValueError):
    """The RDD / DataFrame / paths given hold something other than what was expected."""


class ExportError(FatalSparkError):
    """Exporting the training data as minibatch files failed (directory not writable, ...)."""


class StorageError(FatalSparkError, OSError):
    """A path or URI could not be read, written, listed or deleted (the message names it and why)."""


class StorageUnavailableError(StorageError):
    """No file system backend for a URI's scheme in this process (the message names what to install)."""


class ExportUnreachableError(FatalSparkError):
    """The export approach would write files that some executors cannot read (multi-host, file:// only)."""


class EvaluationFileError(FatalSparkError):
    """A saved evaluation-results file is missing, truncated or not a psrv evaluation file."""


class PrefetchTimeoutError(RetryableSparkError, TimeoutError):
    """The data source did not produce the next minibatch before the prefetch deadline."""


class UserCodeError(FatalSparkError):
    """The user's own code (the module's forward, the loss) raised inside a task: a retry would raise it
    again, so the job is cancelled at its first failure. The message starts with the user's exception."""


class TrainingJobError(SparkError):
    """A distributed training job failed; the message names the stage and the first cause."""


class ControllerUnreachableError(RetryableSparkError, ConnectionError):
    """A worker could not join the gradient-sharing controller (the message names address and mask)."""


__all__ = [
    "ControllerUnreachableError",
    "EvaluationFileError",
    "ExportError",
    "ExportUnreachableError",
    "FatalSparkError",
    "PrefetchTimeoutError",
    "RetryableSparkError",
    "SparkConfigError",
    "SparkError",
    "SparkInputError",
    "StorageError",
    "StorageUnavailableError",
    "TrainingJobError",
    "UserCodeError",
]
