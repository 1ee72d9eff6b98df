"""psrv.spark: training masters, SparkNetwork, data pipelines, distributed evaluation and inference, stats."""

from __future__ import annotations

from psrv import __version__
from psrv.spark.config import VoidConfiguration
from psrv.spark.epochs import EarlyStopping
from psrv.spark.errors import (
    ControllerUnreachableError,
    EvaluationFileError,
    ExportError,
    FatalSparkError,
    PrefetchTimeoutError,
    RetryableSparkError,
    SparkConfigError,
    SparkError,
    SparkInputError,
    StorageError,
    StorageUnavailableError,
    TrainingJobError,
)
from psrv.spark.evaluation import load_evaluations, save_evaluations
from psrv.spark.network import SparkNetwork
from psrv.spark.parameter_averaging import ParameterAveragingTrainingMaster
from psrv.spark.partitioning import Repartition, RepartitionStrategy, balanced_repartition, repartition_rdd
from psrv.spark.prefetch import PrefetchingIterator
from psrv.spark.shared_training import SharedTrainingMaster

__all__ = [
    "__version__",
    "ControllerUnreachableError",
    "EarlyStopping",
    "SharedTrainingMaster",
    "VoidConfiguration",
    "EvaluationFileError",
    "ExportError",
    "FatalSparkError",
    "ParameterAveragingTrainingMaster",
    "PrefetchTimeoutError",
    "PrefetchingIterator",
    "Repartition",
    "RepartitionStrategy",
    "RetryableSparkError",
    "SparkConfigError",
    "SparkError",
    "SparkInputError",
    "SparkNetwork",
    "StorageError",
    "StorageUnavailableError",
    "TrainingJobError",
    "balanced_repartition",
    "load_evaluations",
    "repartition_rdd",
    "save_evaluations",
]
