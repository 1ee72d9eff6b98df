"""A DataFrame with several feature column groups (and label columns) as an RDD of MultiDataSets, for a
TorchNetwork of several inputs or outputs.

``features_col`` lists one entry per input of the module: a column name (an array or ML ``Vector``
column, or one number) or a tuple of numeric column names that are concatenated, in order, into that
input. ``label_col`` is one column name per output (or one name for a single output): a class index for
an output with softmax activation (made one-hot), else numbers / an array taken as they are.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import MultiDataSet
from psrv.nn.torch_adapter import TorchNetwork
from psrv.spark.data.inputs import ROWS_PER_DATASET, _plan_hash, _vector
from psrv.spark.errors import SparkInputError

if TYPE_CHECKING:
    from pyspark import RDD

Group = str | tuple[str, ...]


def is_multi_columns(features_col: Any, label_col: Any) -> bool:
    """Whether ``features_col`` / ``label_col`` name several groups (lists, tuples), not one column."""
    return not isinstance(features_col, str) or not isinstance(label_col, str)


def groups(value: Any, option: str) -> list[Group]:
    """Each entry of ``value`` as a column name or a tuple of column names (a plain name: one group)."""
    items = [value] if isinstance(value, str) else list(value) if isinstance(value, Sequence) else None
    if not items:
        raise SparkInputError(f"{option}: expected a column name or a list of column names / tuples of "
                              f"column names, got {value!r}")
    out: list[Group] = []
    for item in items:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, Sequence) and item and all(isinstance(c, str) for c in item):
            out.append(tuple(item))
        else:
            raise SparkInputError(f"{option}: expected column names or tuples of column names, got {item!r}")
    return out


def columns_of(group_list: list[Group]) -> list[str]:
    names: list[str] = []
    for group in group_list:
        names.extend([group] if isinstance(group, str) else group)
    return names


def output_classes(network: Any) -> list[int | None]:
    """Per output of a TorchNetwork: its class count when its labels are class indices (a softmax output
    of several columns), else None (values taken as they are)."""
    if not isinstance(network, TorchNetwork):
        outputs = network.num_outputs
        return [int(outputs) if outputs and outputs > 1 else None]
    layout = network.layout
    return [size if activation == "softmax" and size > 1 else None
            for size, activation in zip(layout.output_sizes, layout.activations, strict=True)]


def _group_value(row: Any, group: Group) -> np.ndarray:
    if isinstance(group, str):
        return _vector(row[group], group)
    return np.concatenate([_vector(row[c], c).reshape(-1) for c in group])


class _RowsToMultiDataSets:
    """Executor side: rows to MultiDataSets of up to ROWS_PER_DATASET examples (a class, so it pickles by
    reference with psrv installed on the executors)."""

    def __init__(self, features: list[Group], labels: list[Group], classes: list[int | None]) -> None:
        self.features, self.labels, self.classes = features, labels, classes

    def __call__(self, rows: Iterator[Any]) -> Iterator[MultiDataSet]:
        xs: list[list[np.ndarray]] = [[] for _ in self.features]
        ys: list[list[np.ndarray]] = [[] for _ in self.labels]
        for row in rows:
            for column, group in zip(xs, self.features, strict=True):
                column.append(_group_value(row, group))
            for column, group in zip(ys, self.labels, strict=True):
                column.append(_group_value(row, group).reshape(-1))
            if len(xs[0]) == ROWS_PER_DATASET:
                yield self._flush(xs, ys)
                xs, ys = [[] for _ in self.features], [[] for _ in self.labels]
        if xs[0]:
            yield self._flush(xs, ys)

    def _flush(self, xs: list[list[np.ndarray]], ys: list[list[np.ndarray]]) -> MultiDataSet:
        labels = []
        for values, group, classes in zip(ys, self.labels, self.classes, strict=True):
            y = np.stack(values)
            if classes is not None:
                if y.shape[1] != 1:
                    raise SparkInputError(f"DataFrame column(s) {group!r}: expected one class index per row, "
                                          f"got {y.shape[1]} values")
                index = y[:, 0].astype(np.int64)
                if index.size and (index.min() < 0 or index.max() >= classes):
                    raise SparkInputError(
                        f"DataFrame column(s) {group!r}: expected class indices in [0, {classes}), got range "
                        f"[{int(index.min())}, {int(index.max())}]")
                y = np.eye(classes, dtype=np.float32)[index]
            labels.append(y.astype(np.float32))
        return MultiDataSet([np.stack(x) for x in xs], labels)


def dataframe_to_multidatasets(frame: Any, network: Any, features_col: Any, label_col: Any) -> RDD:
    """An RDD of MultiDataSets from ``frame``: one feature array per entry of ``features_col``, one label
    array per entry of ``label_col`` (a missing column named with the option and the frame's columns)."""
    features, labels = groups(features_col, "features_col"), groups(label_col, "label_col")
    for option, group_list in (("features_col", features), ("label_col", labels)):
        missing = [c for c in columns_of(group_list) if c not in frame.columns]
        if missing:
            raise SparkInputError(
                f"DataFrame has no column(s) {missing} ({option}={group_list!r}); its columns are "
                f"{list(frame.columns)}: pass SparkNetwork(..., {option}=[...])")
    classes = output_classes(network)
    if len(classes) != len(labels):
        raise SparkInputError(f"label_col: the network has {len(classes)} output(s), got {len(labels)} label "
                              f"column(s) {labels!r}: give one label column per output")
    selected = list(dict.fromkeys(columns_of(features) + columns_of(labels)))
    rdd = frame.select(*selected).rdd.mapPartitions(_RowsToMultiDataSets(features, labels, classes))
    rdd._psrv_source_key = ("dataframe-multi", _plan_hash(frame), repr(features), repr(labels), repr(classes))
    return rdd


__all__ = ["dataframe_to_multidatasets", "groups", "is_multi_columns", "output_classes"]
