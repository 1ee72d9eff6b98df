"""Errors raised by psrv.nn; every one derives from one base class."""

from __future__ import annotations


class NNError(Exception):
    """Base class of every error raised by psrv.nn."""


# --- data sets, normalizers, evaluation (data engineer) -------------------------------------------
class DataError(NNError, ValueError):
    """Bad data given to a DataSet/MultiDataSet (shapes, masks, dtypes): fatal, fix the input."""


class DataFileError(DataError):
    """A data file is truncated, corrupt, foreign or of an unsupported version: fatal for that file."""


class NormalizerError(NNError, ValueError):
    """A normalizer was used before fit(), fitted on nothing, or given an unknown saved state."""


class EvaluationError(NNError, ValueError):
    """Bad input to an evaluation (shapes, class range, NaN) or merging two incompatible ones."""


# --- networks, layers, updaters, save/load (network engineer) -------------------------------------
class ConfigError(NNError, ValueError):
    """A network, layer or updater configuration is invalid or unknown: fatal, fix the configuration."""


class InvalidInputError(NNError, ValueError):
    """Features, labels or mask given to a network are wrong (shape, range, NaN, empty): fatal for
    that batch; the network's parameters and updater state are untouched."""


class NonFiniteLossError(NNError, ArithmeticError):
    """The loss of a batch is NaN or infinite (the training diverged); nothing was updated."""


class ModelFileError(NNError):
    """A saved network cannot be read: fatal for that file."""


class ForeignFileError(ModelFileError):
    """The file is not a psrv network file (wrong magic bytes)."""


class TruncatedFileError(ModelFileError):
    """The file ends before the length its header announces, or a checksum does not match."""


class UnsupportedVersionError(ModelFileError):
    """The file was written by a newer (or unknown) version of the format."""


__all__ = [
    "ConfigError",
    "DataError",
    "DataFileError",
    "EvaluationError",
    "ForeignFileError",
    "InvalidInputError",
    "ModelFileError",
    "NNError",
    "NonFiniteLossError",
    "NormalizerError",
    "TruncatedFileError",
    "UnsupportedVersionError",
]
