"""Synchronous parameter averaging entirely in Spark (DL4J's ParameterAveragingTrainingMaster).

Each round: broadcast the parameters (and updater state), every worker fits
``averaging_frequency`` minibatches of its share, the results are tree-aggregated and averaged
on the driver (the round's task side: psrv.spark.task.averaging). Rounds repeat until every
minibatch of the data was used once (one epoch per ``fit`` call).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import FileDataSetLoader
from psrv.nn.protocol import TrainableNetwork
from psrv.spark.data.batching import check_batch_size, rebatch
from psrv.spark.data.export import ExportCache, check_training_approach
from psrv.spark.data.storage_level import DEFAULT_STORAGE_LEVEL, check_storage_level, kept
from psrv.spark.driver.job_errors import fatal_error
from psrv.spark.driver.master import driver_event, epoch_input
from psrv.spark.driver.partitioning import parse_repartition, parse_strategy
from psrv.spark.errors import SparkInputError
from psrv.spark.observe.metrics import check_loggers, publish_round
from psrv.spark.observe.worker_logs import relay_worker_logs
from psrv.spark.payload import NetworkPayload, mean_buffers, set_counters
from psrv.spark.task.averaging import RoundTrainer
from psrv.spark.task.prefetch import check_prefetch_num_batches
from psrv.spark.task.results import add_results

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

log = logging.getLogger(__name__)

class ParameterAveragingTrainingMaster:
    """Synchronous data-parallel training by averaging parameters every few minibatches.

    ``batch_size_per_worker`` examples per minibatch; every ``averaging_frequency`` minibatches per
    worker the parameters (and, with ``save_updater``, the updater state) are averaged. The number
    of workers is Spark's default parallelism (the total executor cores).
    """

    def __init__(
        self,
        batch_size_per_worker: int = 16,
        averaging_frequency: int = 5,
        save_updater: bool = True,
        worker_prefetch_num_batches: int = 2,
        rdd_training_approach: str = "export",
        export_directory: str | None = None,
        repartition: str = "always",
        repartition_strategy: str = "balanced",
        aggregation_depth: int = 2,
        collect_training_stats: bool = False,
        loggers: Any = None,
        storage_level: Any = DEFAULT_STORAGE_LEVEL,
    ) -> None:
        self.batch_size_per_worker = check_batch_size(batch_size_per_worker, "batch_size_per_worker")
        self.averaging_frequency = check_batch_size(averaging_frequency, "averaging_frequency")
        self.save_updater = bool(save_updater)
        self.worker_prefetch_num_batches = check_prefetch_num_batches(worker_prefetch_num_batches)
        self.rdd_training_approach = check_training_approach(rdd_training_approach)
        self.export_directory = export_directory
        self.storage_level = check_storage_level(storage_level)  # "direct": how minibatches are kept
        self.repartition = parse_repartition(repartition)
        self.repartition_strategy = parse_strategy(repartition_strategy)
        self.aggregation_depth = check_batch_size(aggregation_depth, "aggregation_depth")
        self.collect_training_stats = bool(collect_training_stats)
        self.loggers = check_loggers(loggers)  # metrics sinks (psrv.spark.observe.metrics), on the driver
        self.progress: Any = False  # no live progress: a round is a short synchronous job
        self.threshold_algorithm: Any = None  # nothing is encoded
        self.training_stats: list[dict[str, Any]] = []
        self.last_score: float | None = None
        self._exports = ExportCache()  # exports of the data fitted, reused by later fits

    def delete_temp_files(self) -> int:
        """Remove the exports psrv wrote in its default location (never a user's export_directory)."""
        return self._exports.delete_temp_files()

    def __repr__(self) -> str:
        return (
            f"ParameterAveragingTrainingMaster(batch_size_per_worker={self.batch_size_per_worker}, "
            f"averaging_frequency={self.averaging_frequency}, approach={self.rdd_training_approach!r})"
        )

    # -- entry points (called by SparkNetwork) ---------------------------------------------------
    def workers(self, spark_context: SparkContext) -> int:
        """Spark's default parallelism (the total executor cores)."""
        return max(1, int(spark_context.defaultParallelism))

    @contextmanager
    def controller_for_call(self, spark_context: SparkContext, network: TrainableNetwork) -> Iterator[None]:
        """Nothing outlives an epoch here (every round broadcasts the parameters afresh)."""
        yield

    def execute_training(self, spark_context: SparkContext, network: TrainableNetwork, rdd: RDD) -> None:
        """One epoch over an RDD of DataSets (any sizes: they are re-batched)."""
        paths, data = epoch_input(self, spark_context, rdd, self._exports,
                                  (self.repartition, self.repartition_strategy))
        if paths is not None:
            self._train_paths(spark_context, network, paths, FileDataSetLoader())
        else:
            self._train_direct(spark_context, network, data)
        network.epoch = network.epoch + 1

    def execute_training_paths(self, spark_context: SparkContext, network: TrainableNetwork, paths_rdd: RDD,
                               loader: Any | None = None) -> None:
        """One epoch over minibatch files (one minibatch per path, read with ``loader``)."""
        paths = paths_rdd.collect()
        bad = [p for p in paths[:5] if not isinstance(p, str)]
        if bad:
            raise SparkInputError(f"fit_paths: expected an RDD of path strings, got {type(bad[0]).__name__}")
        self._train_paths(spark_context, network, paths, loader or FileDataSetLoader())
        network.epoch = network.epoch + 1

    def train_epoch_on_paths(self, spark_context: SparkContext, network: TrainableNetwork,
                             paths: Sequence[str],
                             loader: Any | None = None) -> None:
        """One epoch over minibatch files listed on the driver (an export made once per call)."""
        self._train_paths(spark_context, network, list(paths), loader or FileDataSetLoader())
        network.epoch = network.epoch + 1

    def train_epoch_on_partitions(self, spark_context: SparkContext, network: TrainableNetwork,
                                  data: RDD) -> None:
        """One epoch over data already repartitioned for the workers (and cached) once per call."""
        self._train_direct(spark_context, network, data)
        network.epoch = network.epoch + 1

    # -- the rounds ------------------------------------------------------------------------------
    def _order(self, network: TrainableNetwork, count: int) -> np.ndarray:
        """A fresh order of the minibatches each epoch (reproducible from the network's seed)."""
        return np.random.default_rng([int(network.seed), int(network.epoch), 17]).permutation(count)

    def _train_paths(
        self, spark_context: SparkContext, network: TrainableNetwork, paths: Sequence[str], loader: Any
    ) -> None:
        if not paths:
            raise SparkInputError("fit: the data holds no minibatch (empty RDD)")
        workers = self.workers(spark_context)
        order = self._order(network, len(paths))
        shuffled = [paths[i] for i in order]
        per_round = workers * self.averaging_frequency
        rounds = math.ceil(len(shuffled) / per_round)
        for number in range(rounds):
            share = shuffled[number * per_round:(number + 1) * per_round]
            used = min(workers, len(share))
            self._round(spark_context, network, spark_context.parallelize(share, used), loader, number)

    def _train_direct(self, spark_context: SparkContext, network: TrainableNetwork, data: RDD) -> None:
        """Re-batch in memory, deal the minibatches to (round, worker) partitions with one shuffle per
        epoch, then run each round as a job over just that round's partitions."""
        batch_size = self.batch_size_per_worker
        rebatched = data.mapPartitions(lambda items: rebatch(items, batch_size))
        with kept(rebatched, self.storage_level) as minibatches:
            count = minibatches.count()
            if count == 0:
                raise SparkInputError("fit: the data holds no minibatch (empty RDD)")
            workers = self.workers(spark_context)
            freq = self.averaging_frequency
            per_round = workers * freq
            rounds = math.ceil(count / per_round)
            order = self._order(network, count)
            slots = np.empty(count, dtype=np.int64)
            for position, index in enumerate(order):
                number, offset = divmod(position, per_round)
                used = min(workers, count - number * per_round)
                slots[index] = number * workers + offset % used
            slot_of = spark_context.broadcast(slots)
            try:
                dealt = (
                    minibatches.zipWithIndex()
                    .map(lambda pair: (int(slot_of.value[pair[1]]), pair[0]))
                    .partitionBy(rounds * workers, lambda key: key)
                    .values()
                )
                for number in range(rounds):
                    partitions = list(range(number * workers, (number + 1) * workers))
                    self._round(spark_context, network, dealt, None, number, partitions=partitions)
            finally:
                slot_of.unpersist()

    def _round(self, spark_context: SparkContext, network: TrainableNetwork, share: RDD, loader: Any | None,
               number: int, partitions: list[int] | None = None) -> None:
        """One averaging round over ``share`` (or only over its ``partitions`` when given)."""
        started = time.time()
        payload = NetworkPayload.from_network(network, with_updater=self.save_updater)
        broadcast = spark_context.broadcast(payload)
        try:
            trainer = RoundTrainer(broadcast, loader, self.worker_prefetch_num_batches,
                                     self.collect_training_stats or bool(self.loggers), number)
            if partitions is None:
                result = share.mapPartitions(trainer).treeAggregate(
                    None, add_results, add_results, depth=self.aggregation_depth
                )
            else:  # a few partitions of a larger RDD: their W results are summed on the driver
                result = None
                for part in spark_context.runJob(share, trainer, partitions):
                    result = add_results(result, part)
        finally:
            broadcast.unpersist()
        if result is None:
            return
        relay_worker_logs(result.logs)
        if result.error is not None:  # the tasks returned it: no attempt of Spark's would do better
            raise fatal_error(result.error, "ended the job")
        network.set_params((result.params / result.workers).astype(network.params.dtype))
        if self.save_updater and result.updater_state is not None:
            averaged = result.updater_state / result.workers
            network.set_updater_state(averaged.astype(network.updater_state.dtype))
        if result.buffers is not None:  # BatchNorm statistics: averaged like the parameters
            network.set_buffers(mean_buffers(result.buffers, result.workers))
        set_counters(network, payload.iteration + result.max_steps, payload.epoch)
        if result.examples:
            self.last_score = result.loss_sum / result.examples
        if self.collect_training_stats:
            self.training_stats.extend(result.events)
        publish_round(self.loggers, network, payload.epoch + 1, result.events,
                      {"score": self.last_score, "workers": result.workers, "examples": result.examples},
                      time.time() - started)
        self.record_driver_event("averaging", started, time.time(), round=number, workers=result.workers,
                           steps=result.steps, score=self.last_score)
        log.debug("round %d: %d workers, %d steps, score %s", number, result.workers, result.steps,
                  self.last_score)

    def record_driver_event(self, kind: str, start: float, end: float, **fields: Any) -> None:
        """Add a driver event to ``training_stats`` (with ``collect_training_stats``)."""
        if self.collect_training_stats:
            self.training_stats.append(driver_event(kind, start, end, **fields))


__all__ = ["ParameterAveragingTrainingMaster"]
