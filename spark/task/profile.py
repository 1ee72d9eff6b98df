"""The task side of the driver's data check: one light pass that counts examples and keeps a sample."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from psrv.spark.data.batching import as_batch

SAMPLE_ROWS = 2


def profile_partition(items: Iterator[Any]) -> Iterator[tuple[list[int], Any]]:
    """The partition's element sizes, and its first ``SAMPLE_ROWS`` examples (None when it has none)."""
    sizes: list[int] = []
    sample = None
    for item in items:
        dataset = as_batch(item)
        sizes.append(int(dataset.num_examples))
        if sample is None and dataset.num_examples:
            sample = dataset.subset(slice(0, min(SAMPLE_ROWS, dataset.num_examples)))
    yield sizes, sample


__all__ = ["SAMPLE_ROWS", "profile_partition"]
