"""Repartitioning of training data: when to do it and how (DL4J's Repartition + RepartitionStrategy).

The balanced strategy deals elements out round-robin by their global index, so partition sizes
differ by at most one element; Spark's own ``repartition`` only balances in expectation.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

from psrv.spark.errors import SparkConfigError

if TYPE_CHECKING:
    from pyspark import RDD


class Repartition(StrEnum):
    ALWAYS = "always"
    NEVER = "never"
    NUM_PARTITIONS_WORKERS_DIFFERS = "num_partitions_workers_differs"


class RepartitionStrategy(StrEnum):
    BALANCED = "balanced"
    SPARK_DEFAULT = "spark_default"


def _parse_choice(choices: type[StrEnum], value: object, what: str) -> Any:
    try:
        return choices(str(value).lower())
    except ValueError:
        names = ", ".join(c.value for c in choices)
        raise SparkConfigError(f"{what}: expected one of {names}, got {value!r}") from None


def parse_repartition(value: Repartition | str) -> Repartition:
    return _parse_choice(Repartition, value, "repartition")


def parse_strategy(value: RepartitionStrategy | str) -> RepartitionStrategy:
    return _parse_choice(RepartitionStrategy, value, "repartition_strategy")


def needs_repartition(repartition: Repartition | str, current_partitions: int, num_workers: int) -> bool:
    """Whether data in ``current_partitions`` partitions must be repartitioned for ``num_workers``."""
    mode = parse_repartition(repartition)
    if mode is Repartition.ALWAYS:
        return True
    if mode is Repartition.NEVER:
        return False
    return current_partitions != num_workers


def _identity_partition(key: int) -> int:
    return key


def balanced_repartition(rdd: RDD, num_partitions: int, counts: list[int] | None = None) -> RDD:
    """``rdd`` in exactly ``num_partitions`` partitions whose sizes differ by at most one.

    ``counts`` (elements per partition of ``rdd``, e.g. from the driver's preflight pass) gives each
    element its global index without the Spark job ``zipWithIndex`` runs to count the partitions.
    """
    if num_partitions < 1:
        raise SparkConfigError(f"num_partitions: expected a positive int, got {num_partitions!r}")
    n = int(num_partitions)
    if counts is not None and len(counts) == rdd.getNumPartitions():
        offsets = [0]
        for count in counts[:-1]:
            offsets.append(offsets[-1] + int(count))

        def keyed_partition(index: int, items: Any) -> Any:
            return (((offsets[index] + position) % n, item) for position, item in enumerate(items))

        keyed = rdd.mapPartitionsWithIndex(keyed_partition)
    else:
        keyed = rdd.zipWithIndex().map(lambda pair: (pair[1] % n, pair[0]))
    return keyed.partitionBy(n, _identity_partition).values()


def repartition_rdd(
    rdd: RDD,
    num_workers: int,
    repartition: Repartition | str = Repartition.ALWAYS,
    strategy: RepartitionStrategy | str = RepartitionStrategy.BALANCED,
    counts: list[int] | None = None,
) -> RDD:
    """``rdd`` prepared for ``num_workers`` workers according to the repartition policy.

    ``counts`` (elements per partition, when known): the balanced strategy needs no counting job, and
    data already in ``num_workers`` partitions whose counts differ by at most one is left as it is (the
    shuffle would only deal the same number of elements to each worker again).
    """
    strategy = parse_strategy(strategy)
    if not needs_repartition(repartition, rdd.getNumPartitions(), num_workers):
        return rdd
    if strategy is RepartitionStrategy.BALANCED:
        if counts is not None and len(counts) == rdd.getNumPartitions() == num_workers \
                and max(counts) - min(counts) <= 1:
            return rdd
        return balanced_repartition(rdd, num_workers, counts)
    return rdd.repartition(num_workers)


__all__ = [
    "Repartition", "RepartitionStrategy", "balanced_repartition", "needs_repartition", "parse_repartition",
    "parse_strategy", "repartition_rdd",
]
