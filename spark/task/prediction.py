"""Task side of ``TorchModel.transform``: score Spark's rows or Arrow batches with the broadcast network.

Spark ships these to the executors; the network is built once per executor process (``cached_network``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from psrv.spark.data.batching import chunked
from psrv.spark.data.parquet import _vectors
from psrv.spark.task.row_datasets import CHUNK_ROWS, row_features
from psrv.spark.task.worker import cached_network

__all__ = ["ArrowPredictor", "row_predictor"]


def row_predictor(broadcast: Any, feature_cols: tuple[str, ...], classifier: bool) -> Any:
    """A ``mapPartitions`` function: each row with its prediction (and probability vector) appended."""

    def predict(rows: Iterator[Any]) -> Iterator[tuple[Any, ...]]:
        from pyspark.ml.linalg import DenseVector

        network = cached_network(broadcast.value)  # built once per executor process
        for chunk in chunked(rows, CHUNK_ROWS):
            out = np.asarray(network.output(np.stack([row_features(r, feature_cols) for r in chunk])))
            for row, values in zip(chunk, out, strict=True):
                if classifier:
                    index = int(values[0] >= 0.5) if values.shape[0] == 1 else int(np.argmax(values))
                    yield (*row, float(index), DenseVector(values.astype(np.float64)))
                else:
                    yield (*row, float(values[0]) if values.shape[0] == 1 else [float(v) for v in values])

    return predict


@dataclass(frozen=True)
class ArrowPredictor:
    """The scalar Arrow UDF ``transform`` uses: the feature columns' Arrow arrays of one batch to the
    network's outputs, column-wise (the network built once per executor process)."""

    broadcast: Any
    feature_cols: tuple[str, ...]
    classifier: bool

    def __call__(self, *arrays: Any) -> Any:
        import pyarrow as pa

        parts = [_vectors(a, name) for a, name in zip(arrays, self.feature_cols, strict=True)]
        x = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        network = cached_network(self.broadcast.value)
        out = np.asarray(network.output(x), dtype=np.float64).reshape(len(x), -1)
        outputs = out.shape[1]

        def lists(values: np.ndarray) -> Any:
            offsets = pa.array(np.arange(0, values.size + 1, outputs, dtype=np.int32))
            return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))

        if self.classifier:
            index = (out[:, 0] >= 0.5) if outputs == 1 else np.argmax(out, axis=1)
            return pa.StructArray.from_arrays([pa.array(index.astype(np.float64)), lists(out)],
                                              names=["prediction", "probability"])
        prediction = pa.array(out[:, 0]) if outputs == 1 else lists(out)
        return pa.StructArray.from_arrays([prediction], names=["prediction"])
