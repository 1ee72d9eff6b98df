"""Array-shaped outputs in the Spark ML stages: which module shapes a DataFrame can train and predict.

A DataFrame row holds fixed-length columns: the features (numbers, arrays or ML Vectors, reshaped to the
module's ``input_shape``) and one label column. A module whose output per example is a value ``()``, a
vector ``(k,)`` or any array (``(T,)``, ``(T, k)``, ``(C, H, W)``) trains from a label column of the same
values flattened in C order (an array or Vector of ``prod(shape)`` numbers; a number for ``()``) with a
regression loss, and ``TorchModel.transform`` writes the module's output flattened the same way (a
number for one value, else an array; ``TorchModel.output_shape`` is the shape to reshape it to).
Per-position classes (a tagger's ``(T, k)`` logits under CrossEntropyLoss, a segmentation map's classes)
need one class index per position, which a label column of one value per row cannot give: they are
refused before training, with the way that works (``SparkNetwork`` with DataSets).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.nn.output_semantics import OutputSemantics
from psrv.nn.torch_adapter import TorchNetwork
from psrv.spark.errors import SparkConfigError

__all__ = ["check_dataframe_shapes", "output_shape", "prediction_width"]


def output_shape(network: Any) -> tuple[int, ...]:
    """The per-example shape of the network's (first) output: ``()`` for one value per example."""
    layout = getattr(network, "layout", None)
    if isinstance(network, TorchNetwork) and layout is not None and layout.output_shapes:
        return tuple(int(d) for d in layout.output_shapes[0])
    return (int(network.num_outputs),)


def prediction_width(network: Any) -> int:
    """How many numbers the module's output has per example (the length of a flattened prediction)."""
    return int(np.prod(output_shape(network), dtype=np.int64))


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
    if semantics.kind != "regression" and len(shape) > 1:
        raise SparkConfigError(
            f"the module outputs {_described(shape)} and {semantics.source} means classes along an axis of "
            "each example (per step or per pixel); a DataFrame's label column holds one value per row, "
            "not one class index per position. Fix: train it with SparkNetwork.fit on DataSets (labels of "
            f"shape {_described(shape[:-1] if len(shape) == 2 else shape[1:])} as class indices, e.g. from "
            "psrv.spark.data.sequences_to_datasets), or use a regression loss (MSELoss) on an array label "
            f"column of {int(np.prod(shape))} values per row (the target flattened in C order)")
