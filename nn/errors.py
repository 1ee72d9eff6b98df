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
