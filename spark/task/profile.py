"""The task side of the driver's data check: one light pass that counts examples, keeps a sample and
finds the partition's first non-finite value."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from psrv.spark.data.batching import as_batch
from psrv.spark.task.failures import first_non_finite

SAMPLE_ROWS = 2


def profile_partition(items: Iterator[Any]) -> Iterator[tuple[list[int], Any, Any]]:
    """The partition's element sizes, its first ``SAMPLE_ROWS`` examples (None when it has none), and
    where its first NaN/inf is: ``(row in the partition, "features" or "labels", index in the row,
    value)``, or None."""
    sizes: list[int] = []
    sample = None
    non_finite = None
    rows = 0
    for item in items:
        dataset = as_batch(item)
        sizes.append(int(dataset.num_examples))
        if sample is None and dataset.num_examples:
            sample = dataset.subset(slice(0, min(SAMPLE_ROWS, dataset.num_examples)))
        if non_finite is None:
            for what, arrays in (("features", dataset.features), ("labels", dataset.labels)):
                found = first_non_finite(arrays)
                if found is not None:
                    non_finite = (rows + found[0], what, list(found[1]), found[2])
                    break
        rows += int(dataset.num_examples)
    yield sizes, sample, non_finite


__all__ = ["SAMPLE_ROWS", "profile_partition"]
