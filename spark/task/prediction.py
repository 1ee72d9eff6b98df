"""Task side of ``TorchModel.transform``: score Spark's rows or Arrow batches with the broadcast network.

Spark ships these to the executors; the network is built once per executor process (``cached_network``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from psrv.nn.torch_shapes import class_axis
from psrv.spark.data.batching import chunked
from psrv.spark.data.parquet import _vectors
from psrv.spark.task.row_datasets import CHUNK_ROWS, row_features
from psrv.spark.task.worker import cached_network

__all__ = ["ArrowPredictor", "row_predictor", "scores"]


def scores(out: np.ndarray, kind: str) -> tuple[np.ndarray, np.ndarray | None]:
    """(prediction, probability) of an activated (n, k) output, as its kind predicts
    (psrv.nn.output_semantics): multiclass the argmax and the output; binary of one column ``p >= 0.5`` and
    ``[1 - p, p]``, of several (multi-label) each column thresholded and the output; regression the output
    (one column: a value per row) and no probability. A class output with positions ((n, T, k), (n, C, H, W):
    classes per step or pixel) predicts the argmax per position, flattened (n, positions), with the output
    flattened as its probability."""
    out = np.asarray(out, dtype=np.float64)
    if kind == "multiclass" and out.ndim > 2:
        axis = class_axis(tuple(out.shape[1:]))
        chosen = np.argmax(out, axis=axis).astype(np.float64).reshape(len(out), -1)
        return chosen, out.reshape(len(out), -1)
    out = out.reshape(len(out), -1)
    if kind == "multiclass":
        return np.argmax(out, axis=1).astype(np.float64), out
    if kind == "binary":
        chosen = (out >= 0.5).astype(np.float64)
        if out.shape[1] == 1:
            return chosen[:, 0], np.hstack([1.0 - out, out])
        return chosen, out
    return (out[:, 0] if out.shape[1] == 1 else out), None


def row_predictor(broadcast: Any, feature_cols: tuple[str, ...], kind: str) -> Any:
    """A ``mapPartitions`` function: each row with its prediction (and probability vector) appended."""

    def predict(rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        from pyspark.ml.linalg import DenseVector

        network = cached_network(broadcast.value)  # built once per executor process
        for chunk in chunked(rows, CHUNK_ROWS):
            out = np.asarray(network.output(np.stack([row_features(r, feature_cols) for r in chunk])))
            prediction, probability = scores(out, kind)
            for i, row in enumerate(chunk):
                value = prediction[i]
                value = float(value) if np.ndim(value) == 0 else [float(v) for v in value]
                if probability is None:
                    yield (*row, value)
                else:
                    yield (*row, value, DenseVector(probability[i]))

    return predict


@dataclass(frozen=True)
class ArrowPredictor:
    """The scalar Arrow UDF ``transform`` uses: the feature columns' Arrow arrays of one batch to the
    network's outputs, column-wise (the network built once per executor process)."""

    broadcast: Any
    feature_cols: tuple[str, ...]
    kind: str

    def __call__(self, *arrays: Any) -> Any:
        import pyarrow as pa

        parts = [_vectors(a, name, "DataFrame") for a, name in zip(arrays, self.feature_cols, strict=True)]
        x = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        network = cached_network(self.broadcast.value)
        prediction, probability = scores(np.asarray(network.output(x)), self.kind)

        def column(values: np.ndarray) -> Any:
            if values.ndim == 1:
                return pa.array(values)
            width = values.shape[1]
            offsets = pa.array(np.arange(0, values.size + 1, width, dtype=np.int32))
            return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))

        if probability is None:
            return pa.StructArray.from_arrays([column(prediction)], names=["prediction"])
        return pa.StructArray.from_arrays([column(prediction), column(probability)],
                                          names=["prediction", "probability"])
