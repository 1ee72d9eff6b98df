"""Data options for running psrv well: the direct approach's storage level (or none), ``fit`` from a
directory of exported minibatches, and ``list_paths`` as an RDD for ``fit_paths``."""

from __future__ import annotations

import pytest
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.spark import SharedTrainingMaster, SparkNetwork, VoidConfiguration
from psrv.spark.data import export_datasets, list_paths
from psrv.spark.errors import SparkInputError

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]


def _network() -> Network:
    return Network([Dense(32, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2), seed=5)


def _sharing(**options) -> SharedTrainingMaster:
    return SharedTrainingMaster(VoidConfiguration(unicast_port=0, heartbeat_ms=500), batch_size_per_worker=32,
                                threshold_algorithm=AdaptiveThreshold(3e-2), **options)


def _persisted(spark_context) -> dict[int, tuple[bool, bool]]:
    """Spark's persisted RDDs now: id -> (in memory, on disk)."""
    found = spark_context._jsc.getPersistentRDDs()
    return {int(k): (bool(found[k].getStorageLevel().useMemory()), bool(found[k].getStorageLevel().useDisk()))
            for k in found.keySet()}


@pytest.mark.parametrize("level, expected", [("DISK_ONLY", [(False, True)]), (None, [])],
                         ids=["disk-only", "none"])
def test_direct_epochs_keep_the_data_at_the_level_asked(spark_context, digits, level, expected) -> None:
    train, _ = digits
    part = train.subset(slice(0, 400))
    rdd = spark_context.parallelize(list(part.batches(50)), 2)
    before = _persisted(spark_context)
    during: list[list[tuple[bool, bool]]] = []

    def look(epoch: int, metrics: dict) -> bool:
        now = _persisted(spark_context)
        during.append([now[k] for k in sorted(set(now) - set(before))])
        return False

    master = _sharing(rdd_training_approach="direct", storage_level=level)
    SparkNetwork(spark_context, _network(), master).fit(rdd, epochs=2, callbacks=[look])
    assert during == [expected, expected]
    assert _persisted(spark_context) == before  # unpersisted after the call
    assert master.last_fit["examples"] == part.num_examples  # the last epoch trained every example


def test_fit_from_a_directory_and_list_paths_as_an_rdd(spark_context, digits, tmp_path) -> None:
    train, _ = digits
    part = train.subset(slice(0, 400))
    paths = export_datasets(part.batches(50), str(tmp_path / "export"), batch_size=32)
    uri = (tmp_path / "export").as_uri()

    network = _network()
    master = _sharing()
    with SparkNetwork(spark_context, network, master) as net:
        net.fit(uri, epochs=2)
        assert [r.epoch for r in net.history] == [1, 2] and network.epoch == 2
        assert master.last_fit["examples"] == part.num_examples  # every file of the directory, once
        assert master.last_fit["replicas_checked"] == master.last_fit["workers"] == 2
        assert master.last_fit["replicas_diverged"] == 0

        rdd = list_paths(spark_context, uri, as_rdd=True)
        assert rdd.getNumPartitions() == 2 and sorted(rdd.collect()) == [f"file://{p}" for p in paths]
        net.fit_paths(rdd)
        assert master.last_fit["examples"] == part.num_examples and network.epoch == 3

        (tmp_path / "empty").mkdir()
        with pytest.raises(SparkInputError, match="no minibatch files"):
            net.fit(str(tmp_path / "empty"))
