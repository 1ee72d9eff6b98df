"""The driver's "no worker reached the controller" watchdog counts from the tasks'
start, and leaves a task that is still starting (slow to reach its join) alone."""

from __future__ import annotations

import time

import pytest
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.spark import SharedTrainingMaster, SparkNetwork, VoidConfiguration

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SLOW_START_S = 10.0  # longer than join_timeout_ms + the old 5 s of slack, counted from job submission


def _slow_start(items):
    time.sleep(SLOW_START_S)  # a task busy before its join (a slow source, a Python worker importing torch)
    yield from items


def test_a_task_still_starting_is_not_declared_unreachable(spark_context, digits) -> None:
    train, _ = digits
    layers = [Dense(16, activation="relu"), Output(10)]
    network = Network(layers, input_shape=(64,), updater=Adam(1e-2), seed=3)
    conf = VoidConfiguration(unicast_port=0, heartbeat_ms=500, join_timeout_ms=3000)
    master = SharedTrainingMaster(conf, batch_size_per_worker=32, rdd_training_approach="direct",
                                  repartition="never", threshold_algorithm=AdaptiveThreshold(3e-2))
    batches = list(train.subset(slice(0, 256)).batches(64))
    data = spark_context.parallelize(batches, 2).mapPartitions(_slow_start)
    # was: ControllerUnreachableError "no worker reached the psrv controller ... within 3 s" after 8 s
    SparkNetwork(spark_context, network, master, check_data=False).fit(data)
    assert master.last_fit["steps"] > 0 and master.last_fit["workers"] == 2
