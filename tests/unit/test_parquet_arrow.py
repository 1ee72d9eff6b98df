"""psrv.spark.data.parquet without Spark: Arrow batches (as mapInArrow hands them to a task) to DataSets —
several feature columns concatenated, ML Vectors dense and sparse, batches sliced, labels one-hot."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")

from psrv.spark.data.parquet import ARROW_DATASET_COLUMN, ArrowBatchConverter, ParquetColumns  # noqa: E402
from psrv.spark.errors import SparkInputError  # noqa: E402

_VECTOR = pa.struct([("type", pa.int8()), ("size", pa.int32()), ("indices", pa.list_(pa.int32())),
                     ("values", pa.list_(pa.float64()))])


def _batch(rows: int) -> pa.RecordBatch:
    vectors = [{"type": 1, "size": None, "indices": None, "values": [float(i), -float(i)]} if i % 3 else
               {"type": 0, "size": 2, "indices": [1], "values": [float(i)]} for i in range(rows)]
    return pa.RecordBatch.from_pydict({
        "v": pa.array(vectors, _VECTOR),
        "x": pa.array([0.5 * i for i in range(rows)]),
        "arr": pa.array([[i, i + 1] for i in range(rows)], pa.list_(pa.int64())),
        "label": pa.array([i % 3 for i in range(rows)]),
    })


def _expected(rows: int) -> np.ndarray:
    out = []
    for i in range(rows):
        vector = [float(i), -float(i)] if i % 3 else [0.0, float(i)]
        out.append([*vector, 0.5 * i, i, i + 1])
    return np.asarray(out, dtype=np.float32)


def test_converter_slices_batches_and_concatenates_columns() -> None:
    columns = ParquetColumns(("v", "x", "arr"), "label", 3)
    out = list(ArrowBatchConverter(columns, 4)(iter([_batch(10), _batch(3)])))
    assert [o.schema.names for o in out] == [[ARROW_DATASET_COLUMN]] * 4
    datasets = [pickle.loads(o.column(0)[0].as_py()) for o in out]
    assert [d.num_examples for d in datasets] == [4, 4, 2, 3]  # each batch sliced on its own
    features = np.concatenate([d.features for d in datasets])
    np.testing.assert_array_equal(features, np.concatenate([_expected(10), _expected(3)]))
    labels = np.concatenate([d.labels for d in datasets])
    np.testing.assert_array_equal(labels.argmax(axis=1), [i % 3 for i in range(10)] + [0, 1, 2])
    assert columns.names == ["v", "x", "arr", "label"]


def test_converter_refuses_out_of_range_labels_and_nulls() -> None:
    with pytest.raises(SparkInputError, match=r"class indices in \[0, 2\)"):
        list(ArrowBatchConverter(ParquetColumns("x", "label", 2), 8)(iter([_batch(5)])))
    nulls = pa.RecordBatch.from_pydict({"x": pa.array([1.0, None]), "label": pa.array([0, 1])})
    with pytest.raises(SparkInputError, match="'x'.*null"):
        list(ArrowBatchConverter(ParquetColumns("x", "label", 2), 8)(iter([nulls])))
