"""psrv.spark.ml (issues 12, 13): TorchEstimator in a Pipeline after a VectorAssembler: fit, transform, the
whole PipelineModel saved and loaded (file:// through fsspec and Spark's Hadoop FS), transform again with the
same predictions; several numeric columns without an assembler; DataFrames read as Arrow batches (Parquet
files in the tasks, mapInArrow otherwise) train exactly like the same data as an RDD of DataSets."""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.nn.data import DataSet  # noqa: E402
from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork, storage  # noqa: E402
from psrv.spark import ml as spark_ml  # noqa: E402
from psrv.spark.data.parquet import parquet_files  # noqa: E402
from psrv.spark.ml import TorchEstimator, TorchModel  # noqa: E402
from psrv.spark.ml import estimator as ml_estimator  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

COLUMNS = [f"x{i}" for i in range(8)]


def test_torch_estimator_pipeline_fit_transform_save_load(spark, tmp_path) -> None:
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import VectorAssembler

    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 8))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)
    records = [(i, *map(float, row), int(label)) for i, (row, label) in enumerate(zip(x, y, strict=True))]
    frame = spark.createDataFrame(records, ["id", *COLUMNS, "label"]).repartition(2)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    estimator = TorchEstimator(module, torch.nn.CrossEntropyLoss(),
                               optimizer=lambda params: torch.optim.Adam(params, lr=3e-2), input_shape=(8,),
                               epochs=4, seed=0, training_master=ParameterAveragingTrainingMaster(
                                   batch_size_per_worker=16, averaging_frequency=2))
    assembler = VectorAssembler(inputCols=COLUMNS, outputCol="features")
    model = Pipeline(stages=[assembler, estimator]).fit(frame)
    assert estimator.last_input_path == "arrow"  # the assembler's output through mapInArrow, not rows
    rows = model.transform(frame).orderBy("id").collect()
    predictions = np.array([r["prediction"] for r in rows])
    labels = np.array([r["label"] for r in rows])
    probabilities = np.array([r["probability"].toArray() for r in rows])
    assert np.mean(predictions == labels) > 0.7
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    torch_model = model.stages[-1]
    features = np.array([[r[c] for c in COLUMNS] for r in rows], dtype=np.float32)
    np.testing.assert_array_equal(predictions, torch_model.network.predict(features))  # as local inference

    uri = "file://" + str(tmp_path / "pipeline model")  # Spark writes its parts through the Hadoop FS
    saved = storage.current_options()
    try:
        storage.configure({**saved, "file": {}})  # psrv's model file through fsspec, the Hadoop-FS code path
        model.save(uri)
        whole = PipelineModel.load(uri)
    finally:
        storage.configure(saved)
    assert [type(s) for s in whole.stages] == [VectorAssembler, TorchModel]
    assert whole.stages[-1].uid == torch_model.uid and whole.stages[-1].feature_cols == ("features",)
    stage_dir = tmp_path / "pipeline model" / "stages" / f"1_{torch_model.uid}"
    assert (stage_dir / spark_ml.MODEL_FILE).is_file() and (stage_dir / "metadata").is_dir()
    reloaded = whole.transform(frame).orderBy("id").collect()
    np.testing.assert_array_equal(np.array([r["prediction"] for r in reloaded]), predictions)
    np.testing.assert_array_equal(np.array([r["probability"].toArray() for r in reloaded]), probabilities)

    path = str(tmp_path / "model.psrv")  # the stage alone, a plain path
    torch_model.save(path)
    loaded = TorchModel.load(path)
    again = PipelineModel([assembler, loaded]).transform(frame).orderBy("id").collect()
    np.testing.assert_array_equal(np.array([r["prediction"] for r in again]), predictions)
    again_probabilities = np.array([r["probability"].toArray() for r in again])
    np.testing.assert_allclose(again_probabilities, probabilities, rtol=1e-6)

    columns = TorchModel(loaded.network, feature_cols=COLUMNS).transform(frame)  # several numeric columns
    np.testing.assert_array_equal(np.array([r["prediction"] for r in columns.orderBy("id").collect()]),
                                  predictions)
    assert torch_model.last_transform_path == "arrow" and whole.stages[-1].last_transform_path == "arrow"
    loaded.use_arrow = False  # Spark's rows one by one: the same scores as the Arrow UDF's
    by_rows = PipelineModel([assembler, loaded]).transform(frame).orderBy("id").collect()
    assert loaded.last_transform_path == "rows"
    assert [r.asDict().keys() for r in by_rows] == [r.asDict().keys() for r in rows]
    np.testing.assert_array_equal(np.array([r["prediction"] for r in by_rows]), predictions)
    np.testing.assert_allclose(np.array([r["probability"].toArray() for r in by_rows]), probabilities,
                               rtol=1e-6)


def test_estimator_reads_dataframes_as_arrow_and_trains_like_the_rdd_path(spark, spark_context, tmp_path,
                                                                          monkeypatch) -> None:
    """A Parquet scan is read from its files in the tasks, any other DataFrame through mapInArrow; the row
    conversion is never called, and each trains to exactly the parameters the same rows give as an RDD of
    DataSets (parameter averaging, direct, one partition: the same minibatches in the same order)."""
    from pyspark.ml.feature import VectorAssembler

    rng = np.random.default_rng(2)
    x = rng.normal(size=(300, 8))
    y = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0).astype(int)
    records = [(list(map(float, row)), *map(float, row), int(label)) for row, label in zip(x, y, strict=True)]
    path = "file://" + str(tmp_path / "rows.parquet")
    spark.createDataFrame(records, ["features", *COLUMNS, "label"]).coalesce(1).write.parquet(path)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def master() -> ParameterAveragingTrainingMaster:
        return ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=2,
                                                rdd_training_approach="direct", repartition="never")

    def estimator(**columns) -> TorchEstimator:
        return TorchEstimator(module, torch.nn.CrossEntropyLoss(), input_shape=(8,), seed=0,
                              training_master=master(), **columns)

    from psrv.nn.torch_adapter import TorchNetwork

    reference = TorchNetwork(copy.deepcopy(module), torch.nn.CrossEntropyLoss(), (8,),
                             output_activation="softmax", seed=0)
    data = DataSet(x.astype(np.float32), np.eye(3, dtype=np.float32)[y])
    SparkNetwork(spark_context, reference, master()).fit(spark_context.parallelize([data], 1))

    def no_rows(*args, **kwargs):
        raise AssertionError("the row-by-row conversion was used")

    monkeypatch.setattr(ml_estimator, "_row_datasets", no_rows)
    scan = spark.read.parquet(path)
    assembled = VectorAssembler(inputCols=COLUMNS, outputCol="assembled").transform(scan.drop("features"))
    assert parquet_files(scan.select("features", "label")) is not None and parquet_files(assembled) is None
    cases = [(scan, {}, "parquet"), (scan, {"feature_cols": COLUMNS}, "parquet"),
             (assembled, {"feature_cols": "assembled"}, "arrow")]
    for frame, columns, expected_path in cases:
        fitted = estimator(**columns)
        model = fitted.fit(frame)
        assert fitted.last_input_path == expected_path, columns
        np.testing.assert_array_equal(model.network.params, reference.params)
