"""The contract between ``SparkNetwork`` and a training master (gradient sharing, parameter averaging).

``SparkNetwork.fit``, the epoch loop and the checkpoints drive a master only through ``TrainingMaster``;
both masters implement it, so a new training scheme is one class that does too.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from psrv.nn.protocol import TrainableNetwork
from psrv.spark.data.export import ExportCache, files_backed
from psrv.spark.driver.partitioning import repartition_rdd

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext


@runtime_checkable
class TrainingMaster(Protocol):
    """How the driver trains a network on Spark: one epoch per call, over data in one of three forms."""

    batch_size_per_worker: int
    rdd_training_approach: str  # "export" (minibatch files written once) or "direct" (cached in memory)
    export_directory: str | None
    storage_level: Any  # "direct": how fit(epochs=N) keeps the data between epochs (None: not cached)
    repartition: str
    repartition_strategy: str
    threshold_algorithm: Any  # a psrv.encoding threshold algorithm (checkpointed), None when not encoding
    loggers: list[Any]  # metrics sinks, on the driver
    progress: Any  # live progress on stderr during fit (False: off)
    last_score: float | None
    training_stats: list[dict[str, Any]]

    def workers(self, spark_context: SparkContext) -> int:
        """How many tasks train at once (the partitions of a training job)."""
        ...

    def execute_training(self, spark_context: SparkContext, network: TrainableNetwork, rdd: RDD) -> None:
        """One epoch over an RDD of DataSets (any sizes: they are re-batched)."""
        ...

    def execute_training_paths(self, spark_context: SparkContext, network: TrainableNetwork, paths_rdd: RDD,
                               loader: Any | None = None) -> None:
        """One epoch over minibatch files (one minibatch per path, read with ``loader``)."""
        ...

    def train_epoch_on_paths(self, spark_context: SparkContext, network: TrainableNetwork,
                             paths: Sequence[str],
                             loader: Any | None = None) -> None:
        """One epoch over minibatch files listed on the driver (an export made once per call)."""
        ...

    def train_epoch_on_partitions(self, spark_context: SparkContext, network: TrainableNetwork,
                                  data: RDD) -> None:
        """One epoch over data already partitioned for the workers (and cached) once per call."""
        ...

    def controller_for_call(self, spark_context: SparkContext,
                            network: TrainableNetwork) -> AbstractContextManager[None]:
        """What one ``fit(epochs=N)`` call keeps around all its epochs (gradient sharing: its controller)."""
        ...

    def record_driver_event(self, kind: str, start: float, end: float, **fields: Any) -> None:
        """Add a driver event to ``training_stats`` (when collecting them)."""
        ...

    def delete_temp_files(self) -> int:
        """Remove the exports written in psrv's default location; returns how many."""
        ...


def driver_event(kind: str, start: float, end: float, **fields: Any) -> dict[str, Any]:
    """A training-stats event of the driver (its own row in the timeline)."""
    return {"worker": "driver", "partition": -1, "kind": kind, "start": start, "end": end, **fields}


def epoch_input(master: TrainingMaster, spark_context: SparkContext, rdd: RDD, exports: ExportCache,
                export_key: Any) -> tuple[list[str] | None, RDD]:
    """An RDD's epoch as a master trains it: the repartitioned data, and with the export approach (not
    for Parquet, which the tasks read themselves) its minibatch files, reused while ``export_key`` and
    the data are the same as last time. The paths are None when the data trains directly."""
    workers = master.workers(spark_context)
    data = repartition_rdd(rdd, workers, master.repartition, master.repartition_strategy)
    if master.rdd_training_approach != "export" or files_backed(rdd):
        return None, data
    started = time.time()
    paths = exports.minibatch_paths(rdd, data, master.batch_size_per_worker, master.export_directory,
                                    export_key)
    master.record_driver_event("export", started, time.time(), minibatches=len(paths))
    return paths, data


__all__ = ["TrainingMaster", "driver_event", "epoch_input"]
