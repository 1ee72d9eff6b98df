"""Parquet in: DataFrames backed by Parquet read with Arrow in the tasks (no export), and Parquet as the
minibatch file format; predictions and training equal to the .psds path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet, FileDataSetLoader
from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork
from psrv.spark.data import batch_and_export
from psrv.spark.data.inputs import dataframe_to_datasets
from psrv.spark.data.parquet import (
    ParquetDataSetLoader,
    dataset_from_parquet,
    dataset_to_parquet,
    parquet_files,
)

pytest.importorskip("pyarrow")
pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]  # several fits on a shared 2-core machine


def _network(seed: int = 5) -> Network:
    return Network([Dense(32, "relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2), seed=seed)


def _sorted_rows(data: DataSet) -> DataSet:
    order = np.lexsort(np.concatenate([data.features, data.labels], axis=1).T[::-1])
    return data.subset(order)


@pytest.fixture(scope="module")
def digits_parquet(spark, digits, tmp_path_factory) -> str:
    train, _ = digits
    rows = [(f.astype(float).tolist(), int(c))
            for f, c in zip(train.features, train.label_indices(), strict=True)]
    path = str(tmp_path_factory.mktemp("parquet") / "digits, 64 features")  # Spark encodes it in URIs
    spark.createDataFrame(rows, "features array<double>, label long").repartition(3).write.parquet(path)
    return path


def test_parquet_dataframe_is_read_with_arrow_and_evaluates_like_datasets(spark, spark_context, digits,
                                                                          digits_parquet: str) -> None:
    train, _ = digits
    frame = spark.read.parquet(digits_parquet)
    assert parquet_files(frame) is not None and parquet_files(frame.filter("label > 2")) is None
    rdd = dataframe_to_datasets(frame, num_classes=10)
    assert getattr(rdd, "_psrv_parquet_files", None)  # the Arrow path, not the row path
    read = DataSet.merge(rdd.collect())
    assert _sorted_rows(read).equals(_sorted_rows(train))

    network = _network()
    network.fit(train, epochs=2, batch_size=32)
    spark_net = SparkNetwork(spark_context, network)
    from_parquet = spark_net.evaluate(frame)
    from_datasets = spark_net.evaluate(spark_context.parallelize(list(train.batches(100)), 3))
    np.testing.assert_array_equal(from_parquet.confusion_matrix(), from_datasets.confusion_matrix())
    # the row path (a filtered frame) agrees as well
    rows_only = spark_net.evaluate(frame.filter("label >= 0"))
    np.testing.assert_array_equal(rows_only.confusion_matrix(), from_datasets.confusion_matrix())


def test_fit_from_parquet_writes_no_export(spark, spark_context, digits, digits_parquet: str) -> None:
    _, test = digits
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=10)
    with SparkNetwork(spark_context, _network(), master) as net:
        for _ in range(2):
            net.fit(spark.read.parquet(digits_parquet))
        assert master._exports.stats()["files_written"] == 0
        assert net.evaluate(spark_context.parallelize([test], 2)).accuracy() > 0.85


def test_parquet_minibatch_files_train_exactly_like_psds(spark_context, digits, tmp_path: Path) -> None:
    train, test = digits
    rdd = spark_context.parallelize(list(train.batches(50)), 2)
    psds = batch_and_export(rdd, 16, str(tmp_path / "psds"))
    parquet = batch_and_export(rdd, 16, "file://" + str(tmp_path / "pq"), file_format="parquet")
    assert len(psds) == len(parquet) and all(p.endswith(".parquet") for p in parquet)
    for a, b in zip(psds, parquet, strict=True):
        assert ParquetDataSetLoader().load(b).equals(FileDataSetLoader().load(a))

    nets = []
    for paths, loader in ((psds, None), (parquet, ParquetDataSetLoader())):
        net = SparkNetwork(spark_context, _network(), ParameterAveragingTrainingMaster(
            batch_size_per_worker=16, averaging_frequency=10))
        net.fit_paths(spark_context.parallelize(paths, 2), loader)
        nets.append(net.get_network())
    np.testing.assert_array_equal(nets[0].params, nets[1].params)
    np.testing.assert_array_equal(nets[0].output(test.features), nets[1].output(test.features))


def test_parquet_minibatch_round_trip_keeps_shapes() -> None:
    import io

    rng = np.random.default_rng(1)
    labels = np.eye(4, dtype=np.float32)[[0, 1, 2, 3, 0]]
    batch = DataSet(rng.normal(size=(5, 2, 3, 3)).astype(np.float32), labels)
    back = dataset_from_parquet(io.BytesIO(dataset_to_parquet(batch)), "mem")
    assert back.equals(batch)


def test_ml_vector_column_from_parquet(spark, tmp_path: Path) -> None:
    from pyspark.ml.linalg import Vectors

    rows = [(Vectors.dense([1.0, 2.0, 3.0]), 0), (Vectors.sparse(3, [1], [5.0]), 1),
            (Vectors.dense([0, 0, 1.5]), 1)]
    spark.createDataFrame(rows, ["features", "label"]).coalesce(1).write.parquet(str(tmp_path / "v"))
    rdd = dataframe_to_datasets(spark.read.parquet(str(tmp_path / "v")), num_classes=2)
    assert getattr(rdd, "_psrv_parquet_files", None)
    data = DataSet.merge(rdd.collect())
    np.testing.assert_array_equal(data.features, [[1, 2, 3], [0, 5, 0], [0, 0, 1.5]])
    np.testing.assert_array_equal(data.label_indices(), [0, 1, 1])
