"""What a model predicts follows its loss (psrv.nn.output_semantics), and the task-side conversions refuse
labels that are not class indices, naming the column, the value and its row, and the frame's real kind."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pa = pytest.importorskip("pyarrow")

from psrv.nn.errors import ConfigError  # noqa: E402
from psrv.nn.output_semantics import check_outputs, for_loss_name, for_torch_loss  # noqa: E402
from psrv.spark.data.parquet import ArrowBatchConverter, ParquetColumns  # noqa: E402
from psrv.spark.errors import SparkInputError  # noqa: E402
from psrv.spark.task.prediction import scores  # noqa: E402
from psrv.spark.task.row_datasets import row_converter  # noqa: E402

nn = torch.nn


@pytest.mark.parametrize(("loss", "kind", "activation"), [
    (nn.CrossEntropyLoss(), "multiclass", "softmax"), (nn.NLLLoss(), "multiclass", None),
    (nn.BCEWithLogitsLoss(), "binary", "sigmoid"), (nn.BCELoss(), "binary", None),
    (nn.MSELoss(), "regression", None), (nn.L1Loss(), "regression", None),
    (nn.SmoothL1Loss(), "regression", None), (nn.HuberLoss(), "regression", None)])
def test_the_loss_decides_kind_and_activation(loss, kind, activation) -> None:
    semantics = for_torch_loss(loss)
    assert (semantics.kind, semantics.activation) == (kind, activation)
    assert semantics.has_probability == (kind != "regression")


def test_the_user_overrides_and_impossible_combinations_are_refused() -> None:
    assert for_torch_loss(nn.MSELoss(), activation="sigmoid").activation == "sigmoid"
    assert for_torch_loss(nn.MSELoss(), kind="binary").activation == "sigmoid"
    with pytest.raises(ConfigError, match="outputKind"):
        for_torch_loss(lambda out, y: out.sum())  # a loss psrv does not know: say what it means
    with pytest.raises(ConfigError, match="one output column.*BCEWithLogitsLoss"):
        check_outputs(for_torch_loss(nn.CrossEntropyLoss()), 1)
    with pytest.raises(ConfigError, match="softmax over one output"):
        check_outputs(for_torch_loss(nn.MSELoss(), activation="softmax"), 1)
    check_outputs(for_torch_loss(nn.BCEWithLogitsLoss()), 1)
    assert for_loss_name("xent", "sigmoid").kind == "binary" and for_loss_name("mse").kind == "regression"
    with pytest.raises(ConfigError, match="one output column"):
        check_outputs(for_loss_name("mcxent", "softmax"), 1)


def test_scores_per_kind() -> None:
    out = np.array([[0.2, 0.8], [0.9, 0.1]])
    prediction, probability = scores(out, "multiclass")
    np.testing.assert_array_equal(prediction, [1.0, 0.0])
    np.testing.assert_array_equal(probability, out)
    prediction, probability = scores(np.array([[0.3], [0.7]]), "binary")
    np.testing.assert_array_equal(prediction, [0.0, 1.0])
    np.testing.assert_allclose(probability, [[0.7, 0.3], [0.3, 0.7]])
    prediction, probability = scores(np.array([[-2.5], [3.0]]), "regression")
    np.testing.assert_array_equal(prediction, [-2.5, 3.0])
    assert probability is None


@pytest.mark.parametrize("bad", [0.5, -1.0])
def test_arrow_and_row_paths_refuse_labels_that_are_not_classes(bad) -> None:
    labels = [0.0, 1.0, 2.0, bad, 1.0]
    batch = pa.RecordBatch.from_pydict({"x": pa.array([1.0, 2.0, 3.0, 4.0, 5.0]), "label": pa.array(labels)})
    with pytest.raises(SparkInputError) as caught:  # through mapInArrow: a DataFrame, not "Parquet"
        list(ArrowBatchConverter(ParquetColumns("x", "label", 3, source="DataFrame"), 2)(iter([batch])))
    message = str(caught.value)
    assert "DataFrame column 'label'" in message and "row 3 " in message and repr(bad) in message
    assert "Parquet" not in message
    rows = [{"x": float(i), "label": v} for i, v in enumerate(labels)]
    with pytest.raises(SparkInputError, match=rf"'label'.*row 3 .*{bad!r}"):
        list(row_converter(("x",), "label", 3)(iter(rows)))
    with pytest.raises(SparkInputError, match=r"'label'.*row 3 "):  # binary: 0 and 1 only
        list(row_converter(("x",), "label", None, binary=True)(iter([{"x": 1.0, "label": v} for v in
                                                                     [0.0, 1.0, 1.0, 2.0]])))


def test_row_path_names_the_column_of_a_string_label() -> None:
    rows = [{"x": 1.0, "label": "yes"}]
    with pytest.raises(SparkInputError, match="column 'label'.*'yes'.*StringIndexer"):
        list(row_converter(("x",), "label", 2)(iter(rows)))


def test_sparknetwork_row_path_refuses_fractional_class_labels() -> None:
    from psrv.spark.data.inputs import _rows_to_datasets

    rows = [{"features": [1.0, 2.0], "label": v} for v in (0.0, 1.0, 1.5)]
    with pytest.raises(SparkInputError, match=r"DataFrame column 'label'.*row 2 .*1\.5"):
        list(_rows_to_datasets("features", "label", 3)(iter(rows)))
