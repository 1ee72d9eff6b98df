"""Several workers per node on real Spark (local-cluster, 2 executors): four workers as four mesh members
against four workers as two members of two local workers each, on the same data and epochs."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.spark import SparkNetwork
from psrv.spark.config import VoidConfiguration
from psrv.spark.driver.shared_training import SharedTrainingMaster

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]
EPOCHS = 8
WORKERS = 4  # in all, in both runs


def _network() -> Network:
    return Network([Dense(64, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2), seed=21)


def _one_process(train, test) -> float:
    """The reference: the same network trained in this process on the same data and epochs."""
    network = _network()
    network.fit(list(train.batches(50)), epochs=EPOCHS)
    return float(network.evaluate(test).accuracy())


def _train(spark_context, train, test, workers_per_node: int) -> tuple[float, list[dict]]:
    tasks = WORKERS // workers_per_node
    master = SharedTrainingMaster(
        VoidConfiguration(unicast_port=0, heartbeat_ms=500), batch_size_per_worker=16, num_workers=tasks,
        threshold_algorithm=AdaptiveThreshold(3e-2), workers_per_node=workers_per_node)
    spark_net = SparkNetwork(spark_context, _network(), master)
    rdd = spark_context.parallelize(list(train.batches(50)), 4)
    fits: list[dict] = []

    class _EachEpoch:  # what the master counted in each epoch's job
        def on_epoch_end(self, epoch: int, metrics: dict) -> None:
            fits.append(dict(master.last_fit))

    spark_net.fit(rdd, epochs=EPOCHS, callbacks=[_EachEpoch()])
    assert len(fits) == EPOCHS
    return float(spark_net.network.evaluate(test).accuracy()), fits


def test_two_workers_per_node_train_with_half_the_members_and_the_same_accuracy(spark_context,
                                                                               digits) -> None:
    train, test = digits
    runs = {count: _train(spark_context, train, test, count) for count in (1, 2)}
    for count, (_, fits) in runs.items():
        members = WORKERS // count
        for fit in fits:
            assert fit["mesh_members"] == members and fit["workers"] == members, fit  # the controller's count
            assert fit["local_workers"] == WORKERS, fit
            assert fit["step_from"] == {"shared": members}, fit  # a psrv.nn.Network steps from its replica
            assert fit["examples"] == train.num_examples, fit
            # the invariant: every replica equals the master copy, every update applied once
            assert fit["replicas_checked"] == members and fit["replicas_diverged"] == 0, fit
            assert fit["replica_max_relative_l2"] <= 1e-6, fit
            assert fit["updates_missing"] == 0, fit
    one, two = runs[1][1], runs[2][1]
    accuracy_one, accuracy_two = runs[1][0], runs[2][0]
    print(f"workers_per_node=1: {accuracy_one:.3f}, messages {[f['messages'] for f in one]}; "
          f"workers_per_node=2: {accuracy_two:.3f}, messages {[f['messages'] for f in two]}")
    assert all(f["messages"] <= f["steps"] for f in one)  # at most one message per step
    for fit in two:  # at most one message per round of two steps (a task's last round may hold one)
        assert fit["messages"] * 2 <= fit["steps"] + fit["workers"], fit
    assert sum(f["messages"] for f in two) < 0.6 * sum(f["messages"] for f in one)
    # asynchronous sharing on two executors is not deterministic: on 449 test rows one fit to the next
    # moves by up to ~2.5 points, so each run is held to the one-process reference rather than to the other
    alone = _one_process(train, test)
    for accuracy in (accuracy_one, accuracy_two):
        assert accuracy >= alone - 0.05, (accuracy_one, accuracy_two, alone)
    assert abs(accuracy_two - accuracy_one) <= 0.05, (accuracy_one, accuracy_two, alone)
    assert np.isfinite([f["score"] for f in one + two]).all()
