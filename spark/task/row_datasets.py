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
from psrv.spark.errors import SparkInputError

__all__ = ["CHUNK_ROWS", "row_converter", "row_features"]

CHUNK_ROWS = 256  # rows turned into one DataSet (training) or scored at once (prediction)


def _values(value: Any, column: str) -> np.ndarray:
    if value is None:
        raise SparkInputError(f"column {column!r}: expected numbers, got a null")
    if hasattr(value, "toArray"):
        value = value.toArray()
    return np.asarray(value, dtype=np.float32).reshape(-1)


def row_features(row: Any, columns: Sequence[str]) -> np.ndarray:
    """One example's features: the columns' numbers, concatenated in the order given."""
    parts = [_values(row[c], c) for c in columns]
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def row_converter(feature_cols: tuple[str, ...], label_col: str, num_classes: int | None) -> Any:
    """A ``mapPartitions`` function: rows to DataSets of ``CHUNK_ROWS`` examples (labels one-hot where
    ``num_classes`` is given, checked to be class indices)."""

    def convert(rows: Iterator[Any]) -> Iterator[Any]:
        for chunk in chunked(rows, CHUNK_ROWS):
            x = np.stack([row_features(r, feature_cols) for r in chunk])
            labels = [_values(r[label_col], label_col) for r in chunk]
            if num_classes is not None:
                index = np.array([int(v[0]) for v in labels], dtype=np.int64)
                if index.min() < 0 or index.max() >= num_classes:
                    raise SparkInputError(
                        f"column {label_col!r}: expected class indices in [0, {num_classes}), got range "
                        f"[{int(index.min())}, {int(index.max())}]"
                    )
                y = np.eye(num_classes, dtype=np.float32)[index]
            else:
                y = np.stack(labels).astype(np.float32)
            yield DataSet(x, y)

    return convert
