"""A frozen Spark worker loses nothing: one executor's Python worker is stopped (SIGSTOP) mid-fit for
longer than the liveness timeout, so the controller drops it and refuses its old id's frames; when it
wakes it rejoins, catches up and re-sends what the master lacked. The master then holds every update
the workers submitted, once, and the fit's accounting says so (real Spark local-cluster[2,1,1024])."""

from __future__ import annotations

import functools

import pytest
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.spark import SparkNetwork
from psrv.spark.config import VoidConfiguration
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.task.sharing import SharingTrainer

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

FREEZE_S = 4.0  # 8 beats of 500 ms: the controller drops a member after 3 silent beats


def _freeze_first_attempt_of_partition_0(at_step: int, steps: int) -> None:
    """Partition 0's first attempt stops its own process at ``at_step`` (every thread, the node's I/O
    included); a detached shell wakes it FREEZE_S later."""
    import os
    import signal
    import subprocess

    from pyspark import TaskContext

    context = TaskContext.get()
    if steps == at_step and context is not None and context.partitionId() == 0 \
            and context.attemptNumber() == 0:
        subprocess.Popen(["sh", "-c", f"sleep {FREEZE_S}; kill -CONT {os.getpid()}"],
                         start_new_session=True)
        os.kill(os.getpid(), signal.SIGSTOP)


class _FreezingMaster(SharedTrainingMaster):
    """Gradient sharing whose partition 0 freezes once; keeps the workers' results to look at."""

    results: list = []

    def task_trainer(self, setup, loader) -> SharingTrainer:
        trainer = super().task_trainer(setup, loader)
        trainer.on_step = functools.partial(_freeze_first_attempt_of_partition_0, 4)
        return trainer

    def _finish(self, network, setup, results, *args, **kwargs) -> None:
        self.results = list(results)
        super()._finish(network, setup, results, *args, **kwargs)


def test_a_frozen_worker_loses_no_update(spark_context, digits) -> None:
    train, _ = digits
    conf = VoidConfiguration(unicast_port=0, mesh_build_mode="plain", heartbeat_ms=500)
    master = _FreezingMaster(conf, batch_size_per_worker=16, rdd_training_approach="direct",
                             threshold_algorithm=AdaptiveThreshold(3e-2))
    network = Network([Dense(64, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2),
                      seed=5)
    spark_net = SparkNetwork(spark_context, network, master)
    spark_net.fit(spark_context.parallelize(list(train.batches(50)), 2))
    fit = master.last_fit
    frozen = [r for r in master.results if r.partition == 0]
    assert frozen and len(frozen[0].counters["node_ids"]) > 1, "partition 0 did not rejoin: no freeze seen"
    assert fit["retried_partitions"] == [] and fit["updates_applied_by_failed_attempts"] == 0, fit
    # every update the workers submitted is in the master copy, once, and the accounting says so
    assert fit["updates_missing"] == 0, fit
    assert fit["controller_updates_applied"] == fit["messages"], fit
    assert fit["replicas_diverged"] == 0, fit
