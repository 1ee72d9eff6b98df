"""Validation for the Spark ML estimators: which rows are held out, and what happens after each epoch.

``validation`` may be a fraction (a seeded random split of the DataFrame ``fit`` was given, so after a
Pipeline's earlier stages), the name of a boolean / 0-1 column marking validation rows, or a separate
DataFrame. After every epoch :class:`EpochEnd` scores the held-out rows with the model as ``transform``
would (so the metrics follow the loss's output semantics: accuracy for classes, MSE/MAE/RMSE/R² for
values), and hands the epoch's metrics to every sink the fit has: the history, the metrics loggers
(TensorBoard, MLflow ...), the training statistics the HTML report draws, the progress line, and the
user's callbacks (which may stop the fit on ``val_*``).
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from psrv.spark.errors import SparkInputError
from psrv.spark.observe.metrics import log_validation
from psrv.spark.observe.stats import validation_sample

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["EpochEnd", "split_validation", "validation_metrics"]


def split_validation(frame: DataFrame, validation: Any, seed: int) -> tuple[DataFrame, DataFrame | None]:
    """(training rows, validation rows or None) of ``frame`` as ``validation`` says."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType, NumericType

    if validation is None:
        return frame, None
    if isinstance(validation, float):
        train, held_out = frame.randomSplit([1.0 - validation, validation], seed=seed)
        return train, held_out
    if isinstance(validation, str):
        if validation not in frame.columns:
            raise SparkInputError(f"validation={validation!r}: the DataFrame has no such column; its columns "
                                  f"are {frame.columns} (a fraction like 0.2 splits at random instead)")
        data_type = frame.schema[validation].dataType
        if not isinstance(data_type, BooleanType | NumericType):
            raise SparkInputError(f"validation column {validation!r}: expected booleans or 0/1, got "
                                  f"{data_type.simpleString()}")
        marked = F.coalesce(F.col(validation).cast("boolean"), F.lit(False))
        return frame.where(~marked), frame.where(marked)
    return frame, validation


def validation_metrics(scored: DataFrame, label_col: str, prediction_col: str, kind: str) -> dict[str, float]:
    """``val_accuracy`` for class predictions; ``val_mse``, ``val_mae``, ``val_rmse``, ``val_r2`` for one
    predicted value per row (one aggregation over the scored rows)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    label = F.col(label_col).cast("double")
    prediction = F.col(prediction_col)
    if kind != "regression":
        if not isinstance(scored.schema[prediction_col].dataType, DoubleType):
            return {}  # multi-label: no single accuracy
        row = scored.agg(F.count(F.lit(1)).alias("n"),
                         F.sum((prediction == label).cast("double")).alias("hits")).first()
        return {"val_accuracy": float(row["hits"]) / row["n"]} if row and row["n"] else {}
    if not isinstance(scored.schema[prediction_col].dataType, DoubleType):
        return {}  # several outputs: no single value per row
    error = prediction - label
    row = scored.agg(F.count(F.lit(1)).alias("n"), F.sum(error * error).alias("sse"),
                     F.sum(F.abs(error)).alias("sae"), F.sum(label).alias("sy"),
                     F.sum(label * label).alias("syy")).first()
    if not row or not row["n"]:
        return {}
    n = float(row["n"])
    mse = float(row["sse"]) / n
    total = float(row["syy"]) - float(row["sy"]) ** 2 / n
    r2 = 1.0 - float(row["sse"]) / total if total > 0 else math.nan
    return {"val_mse": mse, "val_mae": float(row["sae"]) / n, "val_rmse": math.sqrt(mse), "val_r2": r2}


class EpochEnd:
    """The one callback the estimators give ``SparkNetwork.fit``: validation metrics for the epoch, then
    every sink, then the user's callbacks with the same metrics (any of them may stop the fit)."""

    def __init__(self, *, score: Callable[[], dict[str, float]] | None, master: Any, network: Any,
                 epochs: int, callbacks: Sequence[Any]) -> None:
        self.score = score
        self.master = master
        self.network = network
        self.epochs = epochs
        self.callbacks = list(callbacks)
        self.validation: dict[int, dict[str, float]] = {}  # epoch -> val_* metrics

    def on_epoch_end(self, epoch: int, metrics: dict[str, float]) -> bool:
        metrics = dict(metrics)
        if self.score is not None:
            found = self.score()
            self.validation[epoch] = found
            metrics.update(found)
            self._publish(epoch, {k.removeprefix("val_"): v for k, v in found.items()})
        self._progress_line(epoch, metrics)
        stop = False
        for callback in self.callbacks:
            hook = getattr(callback, "on_epoch_end", None) or callback
            stop = bool(hook(epoch, dict(metrics))) or stop
        return stop

    def _publish(self, epoch: int, found: dict[str, float]) -> None:
        found = {k: v for k, v in found.items() if math.isfinite(v)}
        if not found:
            return
        step = int(getattr(self.network, "iteration", epoch))
        log_validation(list(getattr(self.master, "loggers", None) or []), step, epoch, found)
        if getattr(self.master, "collect_training_stats", False):  # what the HTML report draws
            self.master.training_stats.append(validation_sample(time.time(), step, epoch, **found))

    def _progress_line(self, epoch: int, metrics: dict[str, float]) -> None:
        if not getattr(self.master, "progress", False):
            return
        parts = [f"{name} {value:.4g}" for name, value in metrics.items()]
        print(f"psrv: epoch {epoch}/{self.epochs} | " + " | ".join(parts), file=sys.stderr, flush=True)
