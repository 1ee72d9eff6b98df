"""The storage level of the "direct" approach: named or given levels, None for no caching, the
caller's own cache left alone, and bad values refused on the driver."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")

from psrv.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster  # noqa: E402
from psrv.spark.data import list_paths  # noqa: E402
from psrv.spark.data.storage_level import DEFAULT_STORAGE_LEVEL, check_storage_level, kept  # noqa: E402
from psrv.spark.errors import SparkConfigError, SparkInputError  # noqa: E402
from pyspark import StorageLevel  # noqa: E402


class _Rdd:
    """The part of an RDD ``kept`` uses (persist/unpersist/is_cached), recording each call."""

    def __init__(self, cached: bool = False) -> None:
        self.is_cached = cached
        self.calls: list[tuple[str, object]] = []

    def persist(self, level: StorageLevel) -> _Rdd:
        self.calls.append(("persist", level))
        self.is_cached = True
        return self

    def unpersist(self) -> _Rdd:
        self.calls.append(("unpersist", None))
        self.is_cached = False
        return self


def test_levels_by_name_or_object_and_none() -> None:
    assert check_storage_level(DEFAULT_STORAGE_LEVEL) == StorageLevel.MEMORY_ONLY  # what cache() uses
    assert check_storage_level("memory_and_disk") == StorageLevel.MEMORY_AND_DISK
    assert check_storage_level(StorageLevel.DISK_ONLY) is StorageLevel.DISK_ONLY
    assert check_storage_level(None) is None
    for bad in ("MEMORY", 3, True):
        with pytest.raises(SparkConfigError, match="storage_level: expected a pyspark StorageLevel"):
            check_storage_level(bad)


def test_kept_persists_at_the_level_then_unpersists() -> None:
    rdd = _Rdd()
    with kept(rdd, StorageLevel.DISK_ONLY) as data:
        assert data is rdd and rdd.calls == [("persist", StorageLevel.DISK_ONLY)]
    assert rdd.calls[-1] == ("unpersist", None) and not rdd.is_cached


def test_kept_with_none_or_the_callers_cache_touches_nothing() -> None:
    plain, users = _Rdd(), _Rdd(cached=True)
    with kept(plain, None), kept(users, StorageLevel.MEMORY_ONLY):
        pass
    assert plain.calls == [] and users.calls == [] and users.is_cached


def test_masters_take_the_option_and_refuse_bad_values_at_construction() -> None:
    assert SharedTrainingMaster().storage_level == StorageLevel.MEMORY_ONLY
    assert SharedTrainingMaster(rdd_training_approach="direct", storage_level=None).storage_level is None
    assert ParameterAveragingTrainingMaster(storage_level="DISK_ONLY").storage_level == StorageLevel.DISK_ONLY
    with pytest.raises(SparkConfigError, match="MEMORY_AND_DISK"):
        SharedTrainingMaster(storage_level="memory-and-disk")


def test_list_paths_as_an_rdd_needs_a_spark_context(tmp_path) -> None:
    with pytest.raises(SparkInputError, match="needs a SparkContext"):
        list_paths(None, str(tmp_path), as_rdd=True)
