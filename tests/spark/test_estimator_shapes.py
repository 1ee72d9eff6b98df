"""TorchEstimator / TorchModel with outputs of more than one number per row: a scalar regression head
``(n,)`` and a small segmentation model ``(n, C, H, W)`` train from DataFrame array columns and predict in
the module's own shape (the prediction column flattened in C order, ``TorchModel.output_shape`` to
reshape it), equal to the trained module's own output on the same rows; a tagger trains from an array
label column of one class index per step and predicts the argmax per step, equal to the trained module's
own, and so does a segmentation classifier from H*W class indices per row; a label column of the wrong
length, and varying lengths, are refused on the driver before training."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.spark import ParameterAveragingTrainingMaster  # noqa: E402
from psrv.spark.errors import SparkConfigError, SparkInputError  # noqa: E402
from psrv.spark.ml import TorchEstimator  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

ROWS = 128


class Scalar(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 1)

    def forward(self, x):
        return self.linear(x).squeeze(1)  # (n,)


class Segmenter(torch.nn.Module):
    """(n, 1, 6, 6) images -> (n, 2, 6, 6) maps."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 2, 3, padding=1)

    def forward(self, x):
        return self.conv(x)


class Tagger(torch.nn.Module):
    """(n, 5, 3) steps -> (n, 5, 3) class scores per step (classes last)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        return self.linear(x)


def _estimator(module, loss, input_shape) -> TorchEstimator:
    torch.manual_seed(0)
    return TorchEstimator(module, loss, optimizer=lambda ps: torch.optim.Adam(ps, lr=0.1),
                          input_shape=input_shape, epochs=5, seed=0,
                          training_master=ParameterAveragingTrainingMaster(batch_size_per_worker=16,
                                                                           averaging_frequency=4))


def _module_output(model, x: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model.getModel()(torch.from_numpy(x)).numpy()


def test_array_outputs_and_classes_per_position_predict_in_the_modules_shape(spark) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 3)).astype(np.float32)
    y = x @ np.array([1.5, -2.0, 0.5], dtype=np.float32) + 0.3
    frame = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(ROWS)], ["features", "label"])
    model = _estimator(Scalar(), torch.nn.MSELoss(), (3,)).fit(frame.repartition(2))
    assert model.output_shape == ()
    rows = model.transform(frame).select("features", "prediction").collect()
    predicted = np.array([r["prediction"] for r in rows])  # one number per row
    inputs = np.array([r["features"] for r in rows], dtype=np.float32)
    np.testing.assert_allclose(predicted, _module_output(model, inputs), rtol=1e-5, atol=1e-5)
    mse = float(np.mean((predicted - (inputs @ np.array([1.5, -2.0, 0.5]) + 0.3)) ** 2))
    assert mse < 0.5 * float(np.var(y)), (mse, float(np.var(y)))  # it learned: below the mean's error

    images = rng.random((ROWS, 1, 6, 6)).astype(np.float32)
    bright = (images[:, 0] > 0.5).astype(np.float32)
    targets = np.stack([1.0 - bright, bright], axis=1)  # (n, 2, 6, 6), flattened into the label column
    classes = bright.reshape(ROWS, -1).astype(np.int64)  # (n, H*W): a class index per pixel
    pixels = spark.createDataFrame([(images[i].reshape(-1).tolist(), targets[i].reshape(-1).tolist(),
                                     classes[i].tolist()) for i in range(ROWS)],
                                   ["features", "label", "classes"])
    segmenter = _estimator(Segmenter(), torch.nn.MSELoss(), (1, 6, 6)).fit(pixels.repartition(2))
    assert segmenter.output_shape == (2, 6, 6)
    rows = segmenter.transform(pixels).select("features", "prediction").collect()
    maps = np.array([np.reshape(r["prediction"], segmenter.output_shape) for r in rows])
    inputs = np.array([r["features"] for r in rows], dtype=np.float32).reshape(-1, 1, 6, 6)
    np.testing.assert_allclose(maps, _module_output(segmenter, inputs), rtol=1e-5, atol=1e-5)
    truth = (inputs[:, 0] > 0.5).astype(np.int64)
    assert float(np.mean(maps.argmax(axis=1) == truth)) > 0.75

    steps = rng.normal(size=(ROWS, 5, 3)).astype(np.float32)
    tags = steps.argmax(axis=2)  # (n, 5): one class index per step
    tagged = spark.createDataFrame([(steps[i].reshape(-1).tolist(), tags[i].tolist()) for i in range(ROWS)],
                                   ["features", "label"])
    tagger = _estimator(Tagger(), torch.nn.CrossEntropyLoss(), (5, 3)).setParams(epochs=3, validation=0.25)
    model = tagger.fit(tagged.repartition(2))
    assert model.output_shape == (5, 3) and "val_loss" in model.history[-1]
    rows = model.transform(tagged).select("features", "label", "prediction", "probability").collect()
    inputs = np.array([r["features"] for r in rows], dtype=np.float32).reshape(-1, 5, 3)
    logits = _module_output(model, inputs)
    predicted = np.array([r["prediction"] for r in rows])  # (n, 5): the argmax per step, flat
    np.testing.assert_array_equal(predicted, logits.argmax(axis=2))
    probability = np.array([r["probability"].toArray() for r in rows]).reshape(-1, 5, 3)
    np.testing.assert_allclose(probability, torch.softmax(torch.from_numpy(logits), 2).numpy(), atol=1e-5)
    truth = np.array([r["label"] for r in rows])
    assert float(np.mean(predicted == truth)) > 0.5  # 1/3 by chance

    classifier = _estimator(Segmenter(), torch.nn.CrossEntropyLoss(), (1, 6, 6)).setParams(
        epochs=2, labelCol="classes").fit(pixels.repartition(2))
    rows = classifier.transform(pixels).select("features", "prediction", "probability").collect()
    inputs = np.array([r["features"] for r in rows], dtype=np.float32).reshape(-1, 1, 6, 6)
    logits = _module_output(classifier, inputs)  # (n, 2, 6, 6): classes first
    np.testing.assert_array_equal(np.array([r["prediction"] for r in rows]),
                                  logits.argmax(axis=1).reshape(-1, 36))  # H*W classes per row, C order
    assert np.array(rows[0]["probability"].toArray()).shape == (72,)

    one_hot = _estimator(Segmenter(), torch.nn.CrossEntropyLoss(), (1, 6, 6)).setParams(epochs=1).fit(
        pixels.repartition(2))  # labels of the output's whole shape: one-hot maps (n, 2, 6, 6), flat
    rows = one_hot.transform(pixels).select("features", "prediction").collect()
    inputs = np.array([r["features"] for r in rows], dtype=np.float32).reshape(-1, 1, 6, 6)
    np.testing.assert_array_equal(np.array([r["prediction"] for r in rows]),
                                  _module_output(one_hot, inputs).argmax(axis=1).reshape(-1, 36))

    from pyspark.sql import functions as F

    cut = pixels.withColumn("cut", F.slice("label", 1, 50))
    wrong_length = r"'cut'.*a row holds 50 values.*36 class indices.*\(n, 2, 6, 6\).*or of 72"
    with pytest.raises(SparkInputError, match=wrong_length):
        _estimator(Segmenter(), torch.nn.CrossEntropyLoss(), (1, 6, 6)).setParams(labelCol="cut").fit(cut)
    with pytest.raises(SparkConfigError, match=r"input_shape \(None, 3\).*SparkNetwork.fit"):
        _estimator(torch.nn.Linear(3, 2), torch.nn.MSELoss(), (None, 3)).fit(frame)
