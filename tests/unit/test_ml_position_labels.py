"""Class indices per position for the Spark ML stages without a Spark session: a label row of T (or H*W)
indices becomes the one-hot rows TorchNetwork reads in the module's layout, bad rows are named before
training, and the prediction side gives the argmax per position."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.nn.torch_adapter import TorchNetwork  # noqa: E402
from psrv.nn.torch_shapes import prepare_labels  # noqa: E402
from psrv.spark.data.parquet import position_one_hot  # noqa: E402
from psrv.spark.errors import SparkConfigError, SparkInputError  # noqa: E402
from psrv.spark.ml.estimator import TorchEstimator  # noqa: E402
from psrv.spark.ml.labels import position_label_problem  # noqa: E402
from psrv.spark.ml.shapes import check_dataframe_shapes, label_positions, single_prediction  # noqa: E402
from psrv.spark.task.prediction import scores  # noqa: E402
from psrv.spark.task.row_datasets import row_converter  # noqa: E402


class Tagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x):  # (n, 4, 3) -> (n, 4, 2): classes last
        return self.linear(x)


class Segmenter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 3, 1)

    def forward(self, x):  # (n, 1, 2, 3) -> (n, 3, 2, 3): classes first
        return self.conv(x)


def _network(module, shape) -> TorchNetwork:
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), shape)


@pytest.mark.parametrize(("module", "shape", "layout"), [
    (Tagger(), (4, 3), (4, 2, True)), (Segmenter(), (1, 2, 3), (6, 3, False))])
def test_one_hot_rows_are_what_torch_shapes_reads_from_class_indices(module, shape, layout) -> None:
    network = _network(module, shape)
    assert label_positions(network) == layout
    assert not single_prediction(network, "multiclass")
    positions, classes, last = layout
    indices = np.random.default_rng(0).integers(0, classes, size=(5, positions))
    flat = position_one_hot(indices.astype(np.float32), classes, positions, last, "tags", "DataFrame", 0)
    out_shape = tuple(network.layout.output_shapes[0])
    index_shape = out_shape[:-1] if last else out_shape[1:]  # the class axis removed
    reference = prepare_labels(indices.reshape((5, *index_shape)), 5, out_shape, np.dtype(np.float32))
    np.testing.assert_array_equal(prepare_labels(flat, 5, out_shape, np.dtype(np.float32)), reference)
    rows = [{"f": [0.0] * int(np.prod(shape)), "tags": indices[i].tolist()} for i in range(5)]
    (dataset,) = row_converter(("f",), "tags", classes, False, positions, last)(iter(rows))
    np.testing.assert_array_equal(dataset.labels, flat)


@pytest.mark.parametrize(("module", "shape", "layout"), [
    (Tagger(), (4, 3), (4, 2, True)), (Segmenter(), (1, 2, 3), (6, 3, False))])
def test_rows_of_the_outputs_whole_shape_are_kept_as_torch_shapes_reads_them(module, shape, layout) -> None:
    network = _network(module, shape)
    positions, classes, last = layout
    out_shape = tuple(network.layout.output_shapes[0])
    rng = np.random.default_rng(2)
    soft = rng.random((5, *out_shape)).astype(np.float32)  # class probabilities per position, any layout
    flat = soft.reshape(5, -1)
    kept = position_one_hot(flat, classes, positions, last, "tags", "DataFrame", 0)
    np.testing.assert_array_equal(kept, flat)
    np.testing.assert_array_equal(prepare_labels(kept, 5, out_shape, np.dtype(np.float32)), soft)
    rows = [{"f": [0.0] * int(np.prod(shape)), "tags": flat[i].tolist()} for i in range(5)]
    (dataset,) = row_converter(("f",), "tags", classes, False, positions, last)(iter(rows))
    np.testing.assert_array_equal(dataset.labels, flat)
    assert position_label_problem(flat[0].tolist(), positions, classes) is None
    flat[3, 4] = 1.5
    with pytest.raises(SparkInputError, match=r"row 3 .* holds 1.5 at element 4.*probabilities"):
        position_one_hot(flat, classes, positions, last, "tags", "DataFrame", 0)
    assert position_label_problem(flat[3].tolist(), positions, classes) == \
        "1.5 at element 4 (not a probability in [0, 1])"


def test_a_wrong_length_or_a_bad_index_is_named() -> None:
    wrong = r"'tags': expected 4 class indices per row.*or 8 one-hot.*got 5 values"
    with pytest.raises(SparkInputError, match=wrong):
        position_one_hot(np.zeros((2, 5), np.float32), 2, 4, True, "tags", "DataFrame", 0)
    bad = np.zeros((2, 4), np.float32)
    bad[1, 2] = 2.0
    with pytest.raises(SparkInputError, match=r"row 11 .* holds 2.0 at position 2.*\[0, 2\)"):
        position_one_hot(bad, 2, 4, True, "tags", "DataFrame", 10)
    assert position_label_problem([0, 1, 1, 0], 4, 2) is None
    assert position_label_problem([0, 1, 1], 4, 2) == "3 values"
    assert position_label_problem([0, 1.5, 1, 0], 4, 2) == "1.5 at position 1"
    assert position_label_problem([0, 1, -1, 0], 4, 2) == "-1 at position 2"
    assert position_label_problem(None, 4, 2) == "a null"


def test_predictions_are_the_argmax_per_position_flattened() -> None:
    out = np.random.default_rng(1).random((3, 4, 2))  # a tagger's (n, T, k)
    prediction, probability = scores(out, "multiclass")
    np.testing.assert_array_equal(prediction, out.argmax(axis=2))
    np.testing.assert_array_equal(probability, out.reshape(3, -1))
    maps = np.random.default_rng(2).random((3, 3, 2, 2))  # a segmentation's (n, C, H, W)
    prediction, _ = scores(maps, "multiclass")
    np.testing.assert_array_equal(prediction, maps.argmax(axis=1).reshape(3, -1))


def test_multi_label_per_position_is_refused_with_the_ways_that_work() -> None:
    network = TorchNetwork(Tagger(), torch.nn.BCEWithLogitsLoss(), (4, 3))
    estimator = TorchEstimator(Tagger(), torch.nn.BCEWithLogitsLoss(), input_shape=(4, 3))
    with pytest.raises(SparkConfigError, match=r"multi-label per position.*4 class indices"):
        check_dataframe_shapes(network, estimator._semantics(network))
