"""The multi-label and calibration evaluations through do_evaluation on Spark equal scikit-learn's on the
network's own outputs for the same rows, and survive the evaluation file."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet
from psrv.nn.evaluation import EvaluationBinary, EvaluationCalibration, ROCBinary
from psrv.spark import SparkNetwork
from psrv.spark.driver.evaluation import load_evaluations, save_evaluations
from sklearn import metrics
from sklearn.calibration import calibration_curve

pytestmark = [pytest.mark.spark, pytest.mark.timeout(120)]


def test_multilabel_and_calibration_on_spark_equal_sklearn(spark_context, digits, tmp_path) -> None:
    train, test = digits

    def tags(data: DataSet) -> DataSet:  # three yes/no questions per digit: even? > 4? a 0, 6, 8 or 9?
        digit = data.label_indices()
        labels = np.stack([digit % 2 == 0, digit > 4, np.isin(digit, [0, 6, 8, 9])], axis=1)
        return DataSet(data.features, labels.astype(np.float32))

    net = Network([Dense(16, activation="relu"), Output(3, activation="sigmoid")], input_shape=(64,),
                  updater=Adam(1e-2), seed=2)
    net.fit(tags(train), epochs=2, batch_size=32)
    tagged = tags(test)
    rdd = spark_context.parallelize(list(tagged.batches(40)), 3)
    binary, roc = SparkNetwork(spark_context, net).do_evaluation(
        rdd, 16, [EvaluationBinary(thresholds=[0.5, 0.4, 0.6]), ROCBinary()])

    y, p = tagged.labels.astype(bool), net.output(tagged.features)
    for i, t in enumerate([0.5, 0.4, 0.6]):
        assert binary.count(i) == tagged.num_examples
        assert binary.f1(i) == pytest.approx(metrics.f1_score(y[:, i], p[:, i] >= t))
        assert binary.precision(i) == pytest.approx(metrics.precision_score(y[:, i], p[:, i] >= t))
        assert binary.accuracy(i) == pytest.approx(metrics.accuracy_score(y[:, i], p[:, i] >= t))
        assert roc.auc(i) == pytest.approx(metrics.roc_auc_score(y[:, i], p[:, i]), abs=1e-6)
    assert roc.average_auc() > 0.7  # the network learnt something, so the comparison means something

    classifier = Network([Dense(16, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2),
                         seed=3)
    classifier.fit(train, epochs=1, batch_size=32)
    [calibration] = SparkNetwork(spark_context, classifier).do_evaluation(
        spark_context.parallelize(list(test.batches(40)), 3), 16, [EvaluationCalibration()])
    actual, probabilities = test.label_indices(), classifier.output(test.features)
    for c in range(10):
        prob_true, prob_pred = calibration_curve(actual == c, probabilities[:, c], n_bins=10)
        np.testing.assert_allclose(calibration.reliability_diagram(c).fraction_positive, prob_true)
        np.testing.assert_allclose(calibration.reliability_diagram(c).mean_predicted, prob_pred, rtol=1e-5)
    assert calibration.label_counts.tolist() == np.bincount(actual, minlength=10).tolist()

    path = str(tmp_path / "evaluations.json")
    save_evaluations([binary, roc, calibration], path)
    again = load_evaluations(path)
    assert [type(e) for e in again] == [EvaluationBinary, ROCBinary, EvaluationCalibration]
    assert [e.to_dict() for e in again] == [e.to_dict() for e in (binary, roc, calibration)]
