"""Many epochs in one ``SparkNetwork.fit`` call: the data prepared once, validation, callbacks, checkpoints.

The training data is exported as minibatch files once per call (the "export" approach) or cached once
(the "direct" approach); every epoch then trains from those files or that cache with the training
master's own per-epoch code, so an epoch inside one call trains exactly as a separate ``fit`` would
(the minibatch order still comes from the network's seed and epoch). After each epoch: metrics of the
driver's network (the master copy) on ``validation_data``, evaluated on the executors; the callbacks;
a checkpoint in the run's own directory, ``checkpoint_dir/<run_id>`` (psrv.spark.driver.runs).
``resume=True`` loads the run's newest checkpoint first and trains the remaining epochs.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from psrv.nn.data import FileDataSetLoader
from psrv.nn.protocol import TrainableNetwork
from psrv.spark.data.export import exported_minibatches
from psrv.spark.data.storage_level import kept
from psrv.spark.driver import checkpoints, runs
from psrv.spark.driver.master import TrainingMaster
from psrv.spark.driver.partitioning import repartition_rdd
from psrv.spark.errors import SparkConfigError, SparkInputError
from psrv.spark.observe.metrics import publish_validation
from psrv.spark.observe.progress import epoch_line

if TYPE_CHECKING:
    from pyspark import RDD, SparkContext

log = logging.getLogger(__name__)


class Callback(Protocol):
    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> bool | None:
        """Called after each epoch (``epoch`` counts from 1 within the run); True stops the fit."""


@dataclass
class EarlyStopping:
    """Stop when ``metric`` has not improved for ``patience`` epochs in a row (as Keras counts: 0 and 1
    both stop at the first epoch without improvement). ``mode`` "min", "max" or "auto" ("max" for
    accuracy/precision/recall/f1/r2, else "min"); ``min_delta`` is the least change that counts."""

    metric: str = "val_loss"
    patience: int = 2
    mode: str = "auto"
    min_delta: float = 0.0
    best: float | None = field(default=None, init=False)
    best_epoch: int | None = field(default=None, init=False)
    stopped_epoch: int | None = field(default=None, init=False)
    _waited: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.mode not in ("min", "max", "auto"):
            raise SparkConfigError(f"EarlyStopping mode: expected 'min', 'max' or 'auto', got {self.mode!r}")
        if self.patience < 0:
            raise SparkConfigError(f"EarlyStopping patience: expected >= 0, got {self.patience}")

    def _maximize(self) -> bool:
        if self.mode != "auto":
            return self.mode == "max"
        return any(word in self.metric for word in ("accuracy", "precision", "recall", "f1", "r2"))

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> bool:
        if self.metric not in metrics:
            raise SparkConfigError(
                f"EarlyStopping: no metric {self.metric!r} after epoch {epoch}; the metrics are "
                f"{sorted(metrics)} (val_* need validation_data)"
            )
        value = float(metrics[self.metric])
        better = self.best is None or (
            value > self.best + self.min_delta if self._maximize() else value < self.best - self.min_delta
        )
        if better:
            self.best, self.best_epoch, self._waited = value, epoch, 0
            return False
        self._waited += 1
        if self._waited >= self.patience:
            self.stopped_epoch = epoch
            return True
        return False


def validation_metrics(spark_network: Any, validation_data: Any) -> dict[str, float]:  # a SparkNetwork
    """What the driver's network scores on ``validation_data`` (evaluated on the executors, one pass):
    ``val_loss`` (the mean loss per example) and the default evaluation's metrics."""
    result, loss = spark_network.evaluate_with_loss(validation_data)
    metrics = {"val_loss": float(loss)} if math.isfinite(loss) else {}
    if isinstance(result, list):  # a network of several outputs: the first output's, then each output's
        metrics.update(_result_metrics(result[0]))
        for i, each in enumerate(result):
            metrics.update({f"val_out{i}_{k[4:]}": v for k, v in _result_metrics(each).items()})
        return metrics
    return {**metrics, **_result_metrics(result)}


def _result_metrics(result: Any) -> dict[str, float]:
    if hasattr(result, "accuracy"):
        return {"val_accuracy": float(result.accuracy()), "val_precision": float(result.precision()),
                "val_recall": float(result.recall()), "val_f1": float(result.f1())}
    return {"val_mse": float(result.mean_squared_error()), "val_mae": float(result.mean_absolute_error()),
            "val_rmse": float(result.root_mean_squared_error()), "val_r2": float(result.r_squared())}


def _stop_requested(callback: Any, epoch: int, metrics: dict[str, float]) -> bool:
    hook = getattr(callback, "on_epoch_end", None)
    if hook is None and callable(callback):
        hook = callback
    if hook is None:
        raise SparkConfigError(
            "callbacks: expected objects with on_epoch_end(epoch, metrics) -> bool, got "
            f"{type(callback).__name__}"
        )
    return bool(hook(epoch, dict(metrics)))


@dataclass(frozen=True)
class MinibatchFiles:
    """Minibatch files already exported (``fit`` from a directory): trained from as they are."""

    paths: list[str]


@contextmanager
def prepared_data(spark_context: SparkContext, master: TrainingMaster, network: TrainableNetwork,
                  rdd: RDD | MinibatchFiles,
                  element_counts: list[int] | None = None) -> Iterator[Callable[[], None]]:
    """A function that trains one epoch on data prepared once for the whole call.

    The data is repartitioned and exported (or cached) once; a master that can keep its controller for
    the call (gradient sharing's ``controller_for_call``) keeps it around every epoch trained here.
    ``element_counts`` (elements per partition of ``rdd``, from the driver's checks) spares the balanced
    repartitioning its counting job.
    """
    scope = master.controller_for_call(spark_context, network)
    if isinstance(rdd, MinibatchFiles):  # already exported: each epoch deals the files out
        with scope:
            yield lambda: master.train_epoch_on_paths(spark_context, network, list(rdd.paths),
                                                      FileDataSetLoader())
        return
    workers = int(master.workers(spark_context))
    data = repartition_rdd(rdd, workers, master.repartition, master.repartition_strategy, element_counts)
    if master.rdd_training_approach == "export":
        started = time.time()
        with exported_minibatches(data, master.batch_size_per_worker, master.export_directory) as paths:
            master.record_driver_event("export", started, time.time(), minibatches=len(paths))
            if not paths:
                raise SparkInputError("fit: the data holds no minibatch (empty RDD)")
            with scope:
                # each epoch in the order a separate fit would train in (the master shuffles the paths
                # from the network's seed and epoch), without a Spark job to deal them out
                yield lambda: master.train_epoch_on_paths(spark_context, network, list(paths),
                                                          FileDataSetLoader())
        return
    with kept(data, master.storage_level) as data, scope:
        yield lambda: master.train_epoch_on_partitions(spark_context, network, data)


@dataclass
class EpochRecord:
    epoch: int
    metrics: dict[str, float]
    seconds: float


def run_epochs(spark_network: Any, rdd: RDD | MinibatchFiles, epochs: int, validation_data: Any = None,
               callbacks: Sequence[Any] = (), checkpoint_dir: str | None = None,
               resume: bool = False, element_counts: list[int] | None = None,
               run_id: str | None = None) -> list[EpochRecord]:
    """Train ``epochs`` epochs in total (counting those of a resumed checkpoint); see the module doc.
    Checkpoints go to ``checkpoint_dir/<run_id>`` (psrv.spark.driver.runs); the run's id is left in
    ``spark_network.run_id``."""
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise SparkConfigError(f"epochs: expected a positive int, got {epochs!r}")
    if resume and checkpoint_dir is None:
        raise SparkConfigError("resume=True needs checkpoint_dir (where the checkpoints of the run are)")
    if run_id is not None and checkpoint_dir is None:
        raise SparkConfigError("run_id names a run under checkpoint_dir: pass checkpoint_dir too")
    sc, network, master = spark_network.spark_context, spark_network.network, spark_network._master()
    history: list[EpochRecord] = []
    done = 0
    run = None
    if checkpoint_dir is not None:
        run = runs.choose_run(checkpoint_dir, run_id, resume, lambda d: checkpoints.newest(sc, d))
        spark_network.run_id = run.run_id
        log.info("checkpoints of this fit: %s (run_id=%r)", run.directory, run.run_id)
    if run is not None and run.resumed:
        found = checkpoints.load_newest(sc, run.directory, network, master)
        if found is not None:
            done = found.epoch
            history.extend(EpochRecord(e, m, math.nan) for e, m in found.history)
            if found.stopped:
                log.warning("resume: run %r was stopped by a callback (early stopping) after epoch %d: "
                            "nothing left to train; start a new run (resume=False) to train again",
                            run.run_id, done)
                return history
            if done >= epochs:
                log.warning("resume: run %r already trained %d epoch(s) of the %d asked: nothing left to "
                            "train; ask for more epochs to continue it", run.run_id, done, epochs)
                return history
            log.info("resuming run %r from %s after epoch %d", run.run_id, found.path, done)
    with prepared_data(sc, master, network, rdd, element_counts) as train_one_epoch:
        for epoch in range(done + 1, epochs + 1):
            started = time.monotonic()
            train_one_epoch()
            metrics: dict[str, float] = {}
            score = master.last_score
            if score is not None:
                metrics["loss"] = float(score)
            if validation_data is not None:
                metrics.update(validation_metrics(spark_network, validation_data))
                publish_validation(master, network, epoch, metrics)  # loggers and the report too
                epoch_line(master, epoch, epochs, metrics)
            history.append(EpochRecord(epoch, metrics, time.monotonic() - started))
            stop = any([_stop_requested(callback, epoch, metrics) for callback in callbacks])
            if run is not None:
                checkpoints.save(sc, run.directory, network, master, epoch,
                                 [(r.epoch, r.metrics) for r in history], stopped=stop)
                runs.mark_latest(checkpoint_dir, run.run_id)
            if stop:
                log.info("a callback stopped the fit after epoch %d", epoch)
                break
    return history


__all__ = ["Callback", "EarlyStopping", "EpochRecord", "MinibatchFiles", "prepared_data", "run_epochs",
           "validation_metrics"]
