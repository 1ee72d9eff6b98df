"""Task side of the Spark ML estimators' row path: Spark's rows (numbers, arrays, ML Vectors) to DataSets.

What ``psrv.spark.ml`` falls back to without pyarrow; the functions here run in the executors (Spark
ships the closure), so they live with the other task code and need nothing of the driver.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from psrv.nn.data import DataSet
from psrv.spark.data.batching import chunked
from psrv.spark.data.parquet import check_class_indices, position_one_hot
from psrv.spark.errors import SparkInputError

__all__ = ["CHUNK_ROWS", "row_converter", "row_features"]

CHUNK_ROWS = 256  # rows turned into one DataSet (training) or scored at once (prediction)


def _values(value: Any, column: str) -> np.ndarray:
    if value is None:
        raise SparkInputError(f"column {column!r}: expected numbers, got a null")
    if hasattr(value, "toArray"):
        value = value.toArray()
    try:
        return np.asarray(value, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise SparkInputError(
            f"DataFrame column {column!r}: expected numbers, arrays of numbers or ML Vectors, got "
            f"{value!r} ({type(value).__name__}); text labels need a StringIndexer stage first") from exc


def row_features(row: Any, columns: Sequence[str]) -> np.ndarray:
    """One example's features: the columns' numbers, concatenated in the order given."""
    parts = [_values(row[c], c) for c in columns]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def row_converter(feature_cols: tuple[str, ...], label_col: str, num_classes: int | None,
                  binary: bool = False, positions: int = 1, classes_last: bool = True) -> Any:
    """A ``mapPartitions`` function: rows to DataSets of ``CHUNK_ROWS`` examples (labels one-hot where
    ``num_classes`` is given, 0/1 kept as they are where ``binary``; either checked to be class indices;
    ``positions`` > 1: that many class indices per row, one-hot per position as
    ``psrv.spark.data.parquet.position_one_hot`` lays them out, or rows of the output's whole shape)."""

    def convert(rows: Iterator[Any]) -> Iterator[Any]:
        first_row = 0
        for chunk in chunked(rows, CHUNK_ROWS):
            x = np.stack([row_features(r, feature_cols) for r in chunk])
            labels = [_values(r[label_col], label_col) for r in chunk]
            if positions > 1:
                lengths = {v.shape[0] for v in labels}
                if len(lengths) > 1:
                    raise SparkInputError(f"DataFrame column {label_col!r}: expected {positions} class "
                                          f"indices per row (or the output's whole shape) in every row, got "
                                          f"lengths {sorted(lengths)}")
                y = position_one_hot(np.stack(labels), int(num_classes or 0), positions, classes_last,
                                     label_col, "DataFrame", first_row)
            elif num_classes is not None or binary:
                if any(v.shape[0] != 1 for v in labels):
                    raise SparkInputError(f"DataFrame column {label_col!r}: expected one class index per row")
                values = np.array([v[0] for v in labels], dtype=np.float64)
                classes = 2 if binary else int(num_classes or 0)
                check_class_indices(values, classes, label_col, "DataFrame", first_row)
                if binary:
                    y = values.astype(np.float32).reshape(-1, 1)
                else:
                    y = np.eye(classes, dtype=np.float32)[values.astype(np.int64)]
            else:
                y = np.stack(labels).astype(np.float32)
            first_row += len(chunk)
            yield DataSet(x, y)

    return convert
