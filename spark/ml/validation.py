"""Validation for the Spark ML estimators: which rows are held out, and what happens after each epoch.

``validation`` may be a fraction (a seeded random split of the DataFrame ``fit`` was given, so after a
Pipeline's earlier stages), the name of a boolean / 0-1 column marking validation rows, or a separate
DataFrame. After every epoch :class:`EpochEnd` scores the held-out rows with the model as ``transform``
would (so the metrics follow the loss's output semantics: accuracy and macro precision/recall/F1 for
classes, MSE/MAE/RMSE/R² for values; ``val_loss`` for every model), and hands the epoch's metrics to
every sink the fit has: the history, the metrics loggers (TensorBoard, MLflow ...), the training
statistics the HTML report draws, the progress line, and the user's callbacks (which may stop the fit
on ``val_*``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.spark.errors import SparkInputError
from psrv.spark.observe.metrics import publish_validation
from psrv.spark.observe.progress import epoch_line

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["EpochEnd", "class_metrics", "split_validation", "validation_metrics"]


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


def validation_metrics(scored: DataFrame, label_col: str, prediction_col: str, kind: str,
                       classes: int | None = None) -> dict[str, float]:
    """For class predictions ``val_accuracy`` and the macro averages ``val_precision``, ``val_recall``,
    ``val_f1`` over ``classes`` classes (as psrv's Evaluation averages them: a class never predicted has
    precision 0), from one confusion count; ``val_mse``, ``val_mae``, ``val_rmse``, ``val_r2`` for one
    predicted value per row (one aggregation over the scored rows)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    label = F.col(label_col).cast("double")
    prediction = F.col(prediction_col)
    if kind != "regression":
        if not isinstance(scored.schema[prediction_col].dataType, DoubleType):
            return {}  # multi-label: no single accuracy
        counts = scored.groupBy(label.alias("y"), prediction.alias("p")).count().collect()
        return class_metrics([(int(r["y"]), int(r["p"]), int(r["count"])) for r in counts], classes)
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


def class_metrics(counts: Sequence[tuple[int, int, int]], classes: int | None = None) -> dict[str, float]:
    """``val_accuracy`` and the macro ``val_precision``/``val_recall``/``val_f1`` of (label, prediction,
    rows) counts; ``classes`` (default: the largest class seen + 1) is how many classes are averaged."""
    counts = [c for c in counts if c[2] > 0]
    if not counts:
        return {}
    size = max(classes or 0, 1 + max(max(y, p) for y, p, _ in counts))
    confusion = np.zeros((size, size), dtype=np.int64)
    for y, p, rows in counts:
        confusion[y, p] += rows
    tp = np.diag(confusion).astype(np.float64)
    predicted, actual = confusion.sum(axis=0), confusion.sum(axis=1)
    precision = np.divide(tp, predicted, out=np.zeros(size), where=predicted > 0)
    recall = np.divide(tp, actual, out=np.zeros(size), where=actual > 0)
    both = precision + recall
    f1 = np.divide(2 * precision * recall, both, out=np.zeros(size), where=both > 0)
    return {"val_accuracy": float(tp.sum() / confusion.sum()), "val_precision": float(precision.mean()),
            "val_recall": float(recall.mean()), "val_f1": float(f1.mean())}


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
            publish_validation(self.master, self.network, epoch, found)
        epoch_line(self.master, epoch, self.epochs, metrics)
        stop = False
        for callback in self.callbacks:
            hook = getattr(callback, "on_epoch_end", None) or callback
            stop = bool(hook(epoch, dict(metrics))) or stop
        return stop
