"""psrv.spark: training masters, SparkNetwork, data pipelines, distributed evaluation and inference, stats."""

from __future__ import annotations

from psrv._version import __version__
from psrv.spark import storage  # importing it hands psrv.nn the reader and writer of every URI
from psrv.spark.config import VoidConfiguration
from psrv.spark.driver.epochs import EarlyStopping
from psrv.spark.driver.evaluation import load_evaluations, save_evaluations
from psrv.spark.driver.master import TrainingMaster
from psrv.spark.driver.network import SparkNetwork
from psrv.spark.driver.parameter_averaging import ParameterAveragingTrainingMaster
from psrv.spark.driver.partitioning import (
    Repartition,
    RepartitionStrategy,
    balanced_repartition,
    repartition_rdd,
)
from psrv.spark.driver.run import run
from psrv.spark.driver.shared_training import SharedTrainingMaster
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
    UserCodeError,
)
from psrv.spark.task.prefetch import PrefetchingIterator

__all__ = [
    "__version__",
    "storage",
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
    "UserCodeError",
    "balanced_repartition",
    "load_evaluations",
    "repartition_rdd",
    "run",
    "save_evaluations",
    "TrainingMaster",
]
