"""Re-batching a partition's data into minibatches of a fixed size.

RDD elements may be single examples or DataSets of any size; training and evaluation want
minibatches of ``batch_size`` examples (the last one of a partition may be smaller).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from itertools import islice
from typing import Any, TypeVar

from psrv.nn.data import DataSet, MultiDataSet
from psrv.nn.data_common import check_batch_size as nn_check_batch_size
from psrv.nn.errors import DataError
from psrv.spark.errors import SparkConfigError, SparkInputError

__all__ = ["as_batch", "as_dataset", "batches_of", "check_batch_size", "chunked", "rebatch"]

T = TypeVar("T")


def check_batch_size(batch_size: object, what: str = "batch_size") -> int:
    """``batch_size`` (or another count option named ``what``) as a positive int; psrv.spark reports a
    bad option as :class:`SparkConfigError` (the check itself is psrv.nn's)."""
    try:
        return nn_check_batch_size(batch_size, what)
    except DataError as exc:
        raise SparkConfigError(str(exc)) from exc


def chunked(items: Iterable[T], size: int) -> Iterator[list[T]]:
    """``items`` in lists of ``size`` (the last may be shorter), in order."""
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def as_dataset(item: object) -> DataSet:
    """An RDD element as a DataSet (a 1-in 1-out MultiDataSet is accepted and converted)."""
    if isinstance(item, DataSet):
        return item
    if isinstance(item, MultiDataSet):
        return item.to_dataset()
    raise SparkInputError(
        f"expected RDD elements of type DataSet (or a 1-in 1-out MultiDataSet), got {type(item).__name__}"
    )


def as_batch(item: object) -> DataSet | MultiDataSet:
    """An RDD element as a minibatch: a DataSet (a 1-in 1-out MultiDataSet converted), or a MultiDataSet
    of several inputs or outputs as it is (what a TorchNetwork of several inputs/outputs trains on)."""
    if isinstance(item, MultiDataSet) and item.num_feature_arrays == 1 and item.num_label_arrays == 1:
        return item.to_dataset()
    if isinstance(item, DataSet | MultiDataSet):
        return item
    raise SparkInputError(
        f"expected RDD elements of type DataSet or MultiDataSet, got {type(item).__name__}"
    )


def rebatch(
    items: Iterable[object], batch_size: int, *, single_to_dataset: bool = True
) -> Iterator[DataSet | MultiDataSet]:
    """Minibatches of exactly ``batch_size`` examples (the last may be smaller), in order; MultiDataSets
    of several inputs or outputs stay MultiDataSets. A MultiDataSet of one input and one output becomes
    a DataSet (what training wants) unless ``single_to_dataset=False`` (exports keep what they were given)."""
    convert = as_batch if single_to_dataset else _as_data
    yield from batches_of((convert(item) for item in items), batch_size)


def _as_data(item: object) -> DataSet | MultiDataSet:
    if isinstance(item, DataSet | MultiDataSet):
        return item
    raise SparkInputError(f"expected DataSet or MultiDataSet elements, got {type(item).__name__}")


def batches_of(items: Iterable[Any], batch_size: int) -> Iterator[Any]:
    """DataSets (or MultiDataSets) merged and split into minibatches of exactly ``batch_size``
    examples (the last may be smaller), in order; an item of exactly that size passes as it is."""
    check_batch_size(batch_size)
    pending: list[Any] = []
    count = 0
    for item in items:
        if item.num_examples == 0:
            continue
        if count == 0 and item.num_examples == batch_size:
            yield item
            continue
        pending.append(item)
        count += item.num_examples
        if count >= batch_size:
            merged = _merge(pending)
            start = 0
            while count - start >= batch_size:
                yield merged.subset(slice(start, start + batch_size))
                start += batch_size
            pending = [merged.subset(slice(start, count))] if count > start else []
            count -= start
    if count:
        yield _merge(pending)


def _merge(items: list[Any]) -> Any:
    if len(items) == 1:
        return items[0]
    try:
        return type(items[0]).merge(items)
    except DataError as exc:
        raise SparkInputError(f"cannot batch these elements together: {exc}") from exc
