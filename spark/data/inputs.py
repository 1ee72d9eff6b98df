"""Turning what a user hands ``SparkNetwork.fit`` into an RDD of DataSets.

A DataFrame needs a features column (array of numbers or an ML ``Vector``) and a label column
(a class index for classifiers, which becomes one-hot; a number or array for regression).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import DataSet
from psrv.nn.network import Network as LayerNetwork
from psrv.spark.data.parquet import ParquetColumns, check_class_indices, parquet_datasets
from psrv.spark.errors import SparkInputError

if TYPE_CHECKING:
    from pyspark import RDD

ROWS_PER_DATASET = 256


def is_dataframe(data: Any) -> bool:
    from pyspark.sql import DataFrame

    return isinstance(data, DataFrame)


def _vector(value: Any, column: str) -> np.ndarray:
    if hasattr(value, "toArray"):
        value = value.toArray()
    if value is None:
        raise SparkInputError(f"DataFrame column {column!r}: expected numbers, got a null")
    try:
        return np.asarray(value, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise SparkInputError(
            f"DataFrame column {column!r}: expected numbers, arrays of numbers or ML Vectors, got {value!r} "
            f"({type(value).__name__}); text labels need a StringIndexer stage first") from exc


def _rows_to_datasets(
    features_col: str, label_col: str, num_classes: int | None
) -> Any:
    def convert(rows: Iterator[Any]) -> Iterator[DataSet]:
        features: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        seen = [0]  # rows of this partition converted before the current batch

        def flush() -> DataSet:
            x = np.stack(features)
            y = np.stack(labels)
            if num_classes is not None:
                values = y.reshape(-1).astype(np.float64)
                check_class_indices(values, num_classes, label_col, "DataFrame", seen[0])
                y = np.eye(num_classes, dtype=np.float32)[values.astype(np.int64)]
            elif y.ndim == 1:
                y = y.reshape(-1, 1)
            return DataSet(x, y.astype(np.float32))

        for row in rows:
            features.append(_vector(row[features_col], features_col))
            label = _vector(row[label_col], label_col)
            if num_classes is not None and label.size != 1:
                raise SparkInputError(
                    f"DataFrame column {label_col!r}: expected one class index per row, got "
                    f"{label.size} values"
                )
            labels.append(label.reshape(-1) if num_classes is None else label.reshape(()))
            if len(features) == ROWS_PER_DATASET:
                yield flush()
                seen[0] += len(features)
                features, labels = [], []
        if features:
            yield flush()

    return convert


def dataframe_to_datasets(
    frame: Any, *, features_col: str = "features", label_col: str = "label", num_classes: int | None = None
) -> RDD:
    """An RDD of DataSets from a DataFrame; ``num_classes`` one-hot encodes a class-index label column.

    A DataFrame that is a plain Parquet scan is read with Arrow in the tasks (psrv.spark.data.parquet).
    """
    missing = [c for c in (features_col, label_col) if c not in frame.columns]
    if missing:
        raise SparkInputError(
            f"DataFrame lacks column(s) {missing}: expected a features column {features_col!r} and a label "
            f"column {label_col!r}, got columns {frame.columns}"
        )
    key = ("dataframe", _plan_hash(frame), features_col, label_col, num_classes)
    rdd = parquet_datasets(frame, ParquetColumns(features_col, label_col, num_classes))
    if rdd is not None:  # a plain Parquet scan: the tasks read Arrow batches, no row conversion
        rdd._psrv_source_key = key
        return rdd
    rdd = frame.select(features_col, label_col).rdd.mapPartitions(
        _rows_to_datasets(features_col, label_col, num_classes)
    )
    rdd._psrv_source_key = key
    return rdd


def _plan_hash(frame: Any) -> Any:
    """Equal for DataFrames of the same query plan (what lets a re-fit reuse an export)."""
    try:
        return ("semantic", int(frame.semanticHash()))
    except Exception:  # noqa: BLE001 - an older Spark or a plan without one: the frame's identity
        return ("object", id(frame))


def classes_of(network: Any) -> int | None:
    """The number of classes a network's output layer predicts (None for regression outputs)."""
    if isinstance(network, LayerNetwork) and network.output_layer.loss.name == "mse":
        return None
    outputs = network.num_outputs
    if outputs is None or outputs == 1:
        return None  # unknown, or a single sigmoid output that takes the 0/1 label as it is
    return int(outputs)


__all__ = [
    "ROWS_PER_DATASET",
    "classes_of",
    "dataframe_to_datasets",
    "is_dataframe",
]
