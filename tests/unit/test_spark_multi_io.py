"""Spark-side pieces of several inputs/outputs, without Spark: DataFrame rows with several feature column
groups to MultiDataSets (psrv.spark.data.inputs_multi; rows are plain mappings, as pyspark Rows index by name)
and validation metrics per output (psrv.spark.driver.epochs)."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.spark.data.inputs_multi import _RowsToMultiDataSets, groups, is_multi_columns
from psrv.spark.errors import SparkInputError


def test_groups_and_detection() -> None:
    assert groups("features", "features_col") == ["features"]
    assert groups(["a", ("b", "c")], "features_col") == ["a", ("b", "c")]
    assert is_multi_columns(["a", "b"], "label") and not is_multi_columns("features", "label")
    with pytest.raises(SparkInputError, match="features_col"):
        groups([("a", 3)], "features_col")


def test_rows_become_multidatasets_with_groups_concatenated_and_class_indices_one_hot() -> None:
    rows = [{"x": [float(i), 1.0], "p": float(i), "q": [2.0, 3.0], "cls": i % 3, "v": [0.5 * i]}
            for i in range(5)]
    convert = _RowsToMultiDataSets(["x", ("p", "q")], ["cls", "v"], [3, None])
    (batch,) = list(convert(iter(rows)))
    assert [f.shape for f in batch.features] == [(5, 2), (5, 3)]
    np.testing.assert_array_equal(batch.features[1][4], [4.0, 2.0, 3.0])
    np.testing.assert_array_equal(batch.labels[0], np.eye(3, dtype=np.float32)[[0, 1, 2, 0, 1]])
    np.testing.assert_array_equal(batch.labels[1][:, 0], 0.5 * np.arange(5))
    bad = _RowsToMultiDataSets(["x"], ["cls"], [2])
    with pytest.raises(SparkInputError, match=r"class indices in \[0, 2\)"):
        list(bad(iter(rows)))


def test_validation_metrics_of_several_outputs_are_given_per_output() -> None:
    from psrv.nn.evaluation import Evaluation, RegressionEvaluation
    from psrv.nn.torch_io import PerOutput
    from psrv.spark.driver.epochs import validation_metrics

    result = PerOutput([Evaluation(num_classes=2), RegressionEvaluation()])
    result.eval([np.array([0, 1, 1]), np.array([[1.0], [2.0], [3.0]])],
                [np.array([[0.9, 0.1], [0.2, 0.8], [0.7, 0.3]]), np.array([[1.0], [2.0], [5.0]])])

    class Evaluated:  # what validation_metrics reads of a SparkNetwork: one pass, the metrics and the loss
        def evaluate_with_loss(self, data):
            return result, 0.25

    metrics = validation_metrics(Evaluated(), None)
    assert metrics["val_loss"] == 0.25
    assert metrics["val_accuracy"] == pytest.approx(2 / 3) == metrics["val_out0_accuracy"]
    assert metrics["val_out1_mse"] == pytest.approx(4 / 3)
    assert "val_mse" not in metrics
