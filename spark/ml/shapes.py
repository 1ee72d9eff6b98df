"""Array-shaped outputs in the Spark ML stages: which module shapes a DataFrame can train and predict.

A DataFrame row holds fixed-length columns: the features (numbers, arrays or ML Vectors, reshaped to the
module's ``input_shape``) and one label column. A module whose output per example is a value ``()``, a
vector ``(k,)`` or any array (``(T,)``, ``(T, k)``, ``(C, H, W)``) trains from a label column of the same
values flattened in C order (an array or Vector of ``prod(shape)`` numbers; a number for ``()``) with a
regression loss, and ``TorchModel.transform`` writes the module's output flattened the same way (a
number for one value, else an array; ``TorchModel.output_shape`` is the shape to reshape it to).
Per-position classes (a tagger's ``(T, k)`` logits, a segmentation map's ``(C, H, W)`` under
CrossEntropyLoss or NLLLoss) train from a label column of one class index per position: an array (or Vector)
of ``prod(positions)`` integral values in ``[0, k)``, the output's shape without its class axis flattened in
C order (``T`` for a tagger, ``H*W`` for a map; psrv.nn.torch_shapes says where the class axis is). The
prediction column is then the per-position argmax as a flat array of those positions, the probability
column the activated output (per-position class probabilities) flattened in the module's layout. A binary
loss per position (multi-label per position) is refused before training.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.nn.output_semantics import OutputSemantics
from psrv.nn.torch_adapter import TorchNetwork
from psrv.nn.torch_shapes import class_axis, positions
from psrv.spark.errors import SparkConfigError

__all__ = ["check_dataframe_shapes", "label_positions", "output_shape", "per_position_classes",
           "prediction_width", "single_prediction"]


def output_shape(network: Any) -> tuple[int, ...]:
    """The per-example shape of the network's (first) output: ``()`` for one value per example."""
    layout = getattr(network, "layout", None)
    if isinstance(network, TorchNetwork) and layout is not None and layout.output_shapes:
        return tuple(int(d) for d in layout.output_shapes[0])
    return (int(network.num_outputs),)


def prediction_width(network: Any) -> int:
    """How many numbers the module's output has per example (the length of a flattened prediction)."""
    return int(np.prod(output_shape(network), dtype=np.int64))


def per_position_classes(network: Any, kind: str) -> bool:
    """Whether the module predicts classes per position: a class loss on more than one axis per example."""
    return kind != "regression" and len(output_shape(network)) > 1


def label_positions(network: Any) -> tuple[int, int, bool]:
    """(positions, classes, classes_last) of a per-position classifier: how many class indices a label row
    holds, how many classes, and whether the class axis is the last (a tagger) or the first (a map)."""
    shape = output_shape(network)
    axis = class_axis(shape)
    assert axis is not None
    return int(np.prod(positions(shape), dtype=np.int64)), int(shape[axis - 1]), axis == len(shape)


def single_prediction(network: Any, kind: str) -> bool:
    """Whether the prediction column holds one number per row (else an array)."""
    if per_position_classes(network, kind):
        return False
    return prediction_width(network) == 1 or kind == "multiclass"


def _described(shape: tuple[Any, ...]) -> str:
    return "(" + ", ".join(str(d) for d in ("n", *shape)) + ")"


def check_dataframe_shapes(network: Any, semantics: OutputSemantics) -> None:
    """Refuse, before any job, a module a DataFrame cannot train: varying-length inputs, and per-position
    classes (an output of more than one axis per example under a classification loss)."""
    if not isinstance(network, TorchNetwork):
        return
    shapes = network.input_shape if network.multi_input else (network.input_shape,)
    if any(d is None for shape in shapes for d in shape):
        raise SparkConfigError(
            f"input_shape {network.input_shape}: a None (any number of steps) needs batches of varying "
            "length, but a DataFrame's feature columns have one length. Fix: give the steps a number "
            "(input_shape=(T, f) for array columns of T*f values, padded), or train sequences of varying "
            "length with SparkNetwork.fit on DataSets (psrv.spark.data.sequences_to_datasets)")
    shape = output_shape(network)
    if semantics.kind == "binary" and len(shape) > 1:
        raise SparkConfigError(
            f"the module outputs {_described(shape)} and {semantics.source} means independent yes/no labels "
            "at every position (multi-label per position), which TorchEstimator does not train from a "
            "DataFrame. Fix: for one class per position use CrossEntropyLoss with a label column of "
            f"{int(np.prod(positions(shape)))} class indices per row; for values use a regression loss "
            f"(MSELoss) on an array label column of {int(np.prod(shape))} values per row; or train it with "
            "SparkNetwork.fit on DataSets")
