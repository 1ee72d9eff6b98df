"""Re-batching a partition's data into minibatches of a fixed size.

RDD elements may be single examples or DataSets of any size; training and evaluation want
minibatches of ``batch_size`` examples (the last one of a partition may be smaller).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from psrv.nn.data import DataSet, MultiDataSet
from psrv.spark.errors import SparkConfigError, SparkInputError


def check_batch_size(batch_size: object, what: str = "batch_size") -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise SparkConfigError(f"{what}: expected a positive int, got {batch_size!r}")
    return batch_size


def as_dataset(item: object) -> DataSet:
    """An RDD element as a DataSet (a 1-in 1-out MultiDataSet is accepted and converted)."""
    if isinstance(item, DataSet):
        return item
    if isinstance(item, MultiDataSet):
        return item.to_dataset()
    raise SparkInputError(
        f"expected RDD elements of type DataSet (or a 1-in 1-out MultiDataSet), got {type(item).__name__}"
    )


def rebatch(items: Iterable[object], batch_size: int) -> Iterator[DataSet]:
    """Minibatches of exactly ``batch_size`` examples (the last may be smaller), in order."""
    check_batch_size(batch_size)
    pending: list[DataSet] = []
    pending_count = 0
    for item in items:
        data = as_dataset(item)
        if data.num_examples == 0:
            continue
        if pending_count == 0 and data.num_examples == batch_size:
            yield data
            continue
        pending.append(data)
        pending_count += data.num_examples
        if pending_count >= batch_size:
            merged = pending[0] if len(pending) == 1 else DataSet.merge(pending)
            start = 0
            while merged.num_examples - start >= batch_size:
                yield merged.subset(slice(start, start + batch_size))
                start += batch_size
            pending_count = merged.num_examples - start
            pending = [merged.subset(slice(start, merged.num_examples))] if pending_count else []
    if pending_count:
        yield pending[0] if len(pending) == 1 else DataSet.merge(pending)
