"""How the "direct" training approach keeps its data between epochs: a Spark storage level, or none.

``fit(epochs=N)`` with ``rdd_training_approach="direct"`` trains every epoch from the same
repartitioned RDD. By default it is kept in executor memory (``MEMORY_ONLY``, what ``RDD.cache()``
does); data larger than the executors' storage memory is better kept with ``MEMORY_AND_DISK`` or
``DISK_ONLY``, and data that is cheap to recompute (or already cached by the caller) with ``None``:
each epoch then recomputes its lineage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from psrv.spark.errors import SparkConfigError

if TYPE_CHECKING:
    from pyspark import RDD, StorageLevel

DEFAULT_STORAGE_LEVEL = "MEMORY_ONLY"
STORAGE_LEVELS = ("MEMORY_ONLY", "MEMORY_ONLY_2", "MEMORY_AND_DISK", "MEMORY_AND_DISK_2",
                  "MEMORY_AND_DISK_DESER", "DISK_ONLY", "DISK_ONLY_2", "DISK_ONLY_3", "OFF_HEAP")


def check_storage_level(level: Any) -> StorageLevel | None:
    """A Spark ``StorageLevel`` (given, or named by one of ``STORAGE_LEVELS``), or None for no caching."""
    if level is None:
        return None
    from pyspark import StorageLevel

    if isinstance(level, StorageLevel):
        return level
    if isinstance(level, str) and level.upper() in STORAGE_LEVELS:
        return getattr(StorageLevel, level.upper())
    raise SparkConfigError(
        f"storage_level: expected a pyspark StorageLevel, one of {STORAGE_LEVELS} or None (no caching), "
        f"got {level!r}"
    )


@contextmanager
def kept(data: RDD, level: StorageLevel | None) -> Iterator[RDD]:
    """``data`` persisted at ``level`` while inside (unpersisted after); left as it is when ``level`` is
    None or the caller already persisted it (the caller's cache stays)."""
    if level is None or data.is_cached:
        yield data
        return
    persisted = data.persist(level)
    try:
        yield persisted
    finally:
        persisted.unpersist()


__all__ = ["DEFAULT_STORAGE_LEVEL", "STORAGE_LEVELS", "check_storage_level", "kept"]
