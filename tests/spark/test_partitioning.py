"""Repartitioning policy and the balanced strategy, on real Spark."""

from __future__ import annotations

import pytest
from psrv.spark.driver.partitioning import balanced_repartition, needs_repartition, repartition_rdd
from psrv.spark.errors import SparkConfigError

pytestmark = [pytest.mark.timeout(120)]


def test_needs_repartition_policy() -> None:
    assert needs_repartition("always", 2, 2)
    assert not needs_repartition("never", 7, 2)
    assert needs_repartition("num_partitions_workers_differs", 7, 2)
    assert not needs_repartition("NUM_PARTITIONS_WORKERS_DIFFERS", 2, 2)
    with pytest.raises(SparkConfigError, match="repartition: expected one of always"):
        needs_repartition("sometimes", 1, 1)


@pytest.mark.spark
@pytest.mark.parametrize(("count", "partitions", "expected"), [(100, 4, [25] * 4), (10, 3, [4, 3, 3])])
def test_balanced_repartition_gives_equal_counts(spark_context, count, partitions, expected) -> None:
    # skewed input: everything in one partition but one element
    skewed = spark_context.parallelize(range(count), 5).coalesce(2)
    balanced = balanced_repartition(skewed, partitions)
    assert balanced.getNumPartitions() == partitions
    assert sorted(balanced.glom().map(len).collect(), reverse=True) == expected
    assert sorted(balanced.collect()) == list(range(count))


@pytest.mark.spark
def test_repartition_policy_applied(spark_context) -> None:
    rdd = spark_context.parallelize(range(30), 3)
    assert repartition_rdd(rdd, 2, "never") is rdd
    assert repartition_rdd(rdd, 3, "num_partitions_workers_differs") is rdd
    changed = repartition_rdd(rdd, 2, "num_partitions_workers_differs", "balanced")
    assert changed.glom().map(len).collect() == [15, 15]
    spark_default = repartition_rdd(rdd, 2, "always", "spark_default")
    assert spark_default.getNumPartitions() == 2
    assert sorted(spark_default.collect()) == list(range(30))


@pytest.mark.spark
def test_known_counts_deal_exactly_as_zip_with_index_and_keep_balanced_data(spark_context) -> None:
    """With the element counts of the driver's preflight pass the balanced strategy skips its counting job
    and deals every element to the same worker as zipWithIndex does; data already balanced for the
    workers is left as it is."""
    skewed = spark_context.parallelize(range(23), 5).coalesce(2)
    counts = skewed.glom().map(len).collect()

    def dealt_to(rdd):  # which elements each worker gets (a shuffle's order within a partition varies)
        return [sorted(part) for part in rdd.glom().collect()]

    assert dealt_to(balanced_repartition(skewed, 3, counts)) == dealt_to(balanced_repartition(skewed, 3))
    balanced = spark_context.parallelize(range(21), 2)  # 10 and 11 elements
    assert repartition_rdd(balanced, 2, "always", "balanced", counts=[10, 11]) is balanced
    dealt = repartition_rdd(balanced, 3, "always", "balanced", counts=[10, 11])
    assert dealt.glom().map(len).collect() == [7, 7, 7]
