"""psrv.spark.ml (issue 12): TorchEstimator in a Pipeline after a VectorAssembler: fit, transform, save,
load, transform again with the same predictions; several numeric columns without an assembler."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.spark import ParameterAveragingTrainingMaster  # noqa: E402
from psrv.spark.ml import TorchEstimator, TorchModel  # noqa: E402

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
    rows = model.transform(frame).orderBy("id").collect()
    predictions = np.array([r["prediction"] for r in rows])
    labels = np.array([r["label"] for r in rows])
    probabilities = np.array([r["probability"].toArray() for r in rows])
    assert np.mean(predictions == labels) > 0.7
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    torch_model = model.stages[-1]
    features = np.array([[r[c] for c in COLUMNS] for r in rows], dtype=np.float32)
    np.testing.assert_array_equal(predictions, torch_model.network.predict(features))  # as local inference

    path = str(tmp_path / "model.psrv")
    torch_model.save(path)
    loaded = TorchModel.load(path)
    again = PipelineModel([assembler, loaded]).transform(frame).orderBy("id").collect()
    np.testing.assert_array_equal(np.array([r["prediction"] for r in again]), predictions)
    again_probabilities = np.array([r["probability"].toArray() for r in again])
    np.testing.assert_allclose(again_probabilities, probabilities, rtol=1e-6)

    columns = TorchModel(loaded.network, feature_cols=COLUMNS).transform(frame)  # several numeric columns
    np.testing.assert_array_equal(np.array([r["prediction"] for r in columns.orderBy("id").collect()]),
                                  predictions)
