"""Gradient sharing on real Spark (local-cluster, 2 executors): accuracy, bytes, faults, inputs."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
from psrv.encoding import AdaptiveThreshold
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.data import DataSet
from psrv.spark import SparkNetwork
from psrv.spark.config import VoidConfiguration
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.errors import ControllerUnreachableError, SparkConfigError
from psrv.spark.observe.report import export_stats_html
from psrv.spark.task.node import route_source_address
from psrv.spark.task.sharing import SharingTrainer
from psrv.spark.task.worker import host_and_cores

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def _network(seed: int = 21) -> Network:
    layers = [Dense(64, activation="relu"), Output(10)]
    return Network(layers, input_shape=(64,), updater=Adam(1e-2), seed=seed)


def _master(mesh: str = "plain", approach: str = "export", cls: type = SharedTrainingMaster,
            **kwargs) -> SharedTrainingMaster:
    conf = VoidConfiguration(unicast_port=0, mesh_build_mode=mesh, heartbeat_ms=500,
                             **kwargs.pop("conf", {}))
    kwargs.setdefault("threshold_algorithm", AdaptiveThreshold(3e-2))
    return cls(conf, batch_size_per_worker=16, rdd_training_approach=approach, **kwargs)


def _kill_first_attempt_of_partition_0(after_steps: int, steps: int) -> None:
    """The first attempt of partition 0 dies like a crashed executor after ``after_steps`` steps."""
    import os

    from pyspark import TaskContext

    context = TaskContext.get()
    if steps == after_steps and context is not None and context.partitionId() == 0 \
            and context.attemptNumber() == 0:
        os._exit(17)


class _KillingMaster(SharedTrainingMaster):
    """Gradient sharing whose tasks run ``_kill_first_attempt_of_partition_0`` after each step while
    ``kill_after_steps`` is set."""

    kill_after_steps: int | None = None

    def task_trainer(self, setup, loader) -> SharingTrainer:
        trainer = super().task_trainer(setup, loader)
        if self.kill_after_steps is not None:
            trainer.on_step = functools.partial(_kill_first_attempt_of_partition_0, self.kill_after_steps)
        return trainer


def _fit_until(spark_net: SparkNetwork, rdd, test: DataSet, bar: float, epochs: int,
               min_epochs: int = 1) -> tuple[float, dict]:
    """Fit epochs until the test accuracy reaches ``bar``; also sum what the updates cost."""
    accuracy, totals = 0.0, {"bytes_sent": 0, "dense_bytes": 0, "epochs": 0}
    for _ in range(epochs):
        spark_net.fit(rdd)
        totals["epochs"] += 1
        fit = spark_net.training_master.last_fit
        totals["missing"] = totals.get("missing", 0) + fit["updates_missing"]
        # the central invariant, every epoch: each task's final replica equals the master copy
        assert fit["replicas_diverged"] == 0, fit
        totals["replicas_checked"] = totals.get("replicas_checked", 0) + fit["replicas_checked"]
        for key in ("bytes_sent", "dense_bytes"):
            totals[key] += spark_net.training_master.last_fit[key]
        accuracy = spark_net.network.evaluate(test).accuracy()
        if accuracy >= bar and totals["epochs"] >= min_epochs:
            break
    return accuracy, totals


@pytest.mark.parametrize(("mesh", "approach"), [("plain", "export"), ("plain", "direct"), ("mesh", "export"),
                                              ("mesh", "direct")])
def test_gradient_sharing_reaches_accuracy(spark_context, digits, mesh, approach, tmp_path) -> None:
    train, test = digits
    # MESH with fan-out 1: the second node hangs below the first, so updates are relayed by a node
    conf = {"mesh_fan_out": 1} if mesh == "mesh" else {}
    master = _master(mesh, approach, collect_training_stats=True, conf=conf)
    spark_net = SparkNetwork(spark_context, _network(), master)
    rdd = spark_context.parallelize(list(train.batches(50)), 3)
    started = time.monotonic()
    # at least 2 epochs: the byte count covers the threshold's adaptation and a steadier phase
    accuracy, totals = _fit_until(spark_net, rdd, test, 0.90, 10, min_epochs=2)
    assert accuracy >= 0.90, (accuracy, master.last_fit)
    fit = master.last_fit
    assert fit["workers"] == 2 and fit["examples"] == train.num_examples
    assert fit["replicas_checked"] == 2 and fit["replica_max_relative_l2"] <= 1e-6, fit
    assert totals["bytes_sent"] * 50 < totals["dense_bytes"], totals
    last_epoch = spark_net.network.epoch  # the stats count epochs from 1: the one just trained
    fits = [e for e in spark_net.get_training_stats() if e["kind"] == "fit" and e["epoch"] == last_epoch]
    assert {e["partition"] for e in fits} == {0, 1}
    assert sum(e["examples"] for e in fits) == train.num_examples
    if mesh == "plain":  # every update a worker sent reached the master copy
        assert fit["updates_missing"] == 0, fit
    kinds = {e["kind"] for e in spark_net.get_training_stats()}
    assert {"setup", "catch_up", "wait", "fit", "encode", "training_job"} <= kinds
    report = tmp_path / "stats.html"
    export_stats_html(spark_net.get_training_stats(), str(report))
    assert report.read_text().count("catch_up") >= 1
    print(f"{mesh}/{approach}: {accuracy:.3f} in {time.monotonic() - started:.1f} s, {totals}, {fit}")


def test_killed_worker_is_retried_and_fit_still_reaches_accuracy(spark_context, digits) -> None:
    train, test = digits
    master = _master("plain", "export", cls=_KillingMaster)
    master.kill_after_steps = 10  # partition 0's first attempt dies after 10 steps
    spark_net = SparkNetwork(spark_context, _network(seed=22), master)
    rdd = spark_context.parallelize(list(train.batches(50)), 3)
    spark_net.fit(rdd)
    fit = master.last_fit
    assert fit["retried_partitions"] == [0]
    # the failed attempt's updates that reached the master stay there, counted apart
    assert fit["controller_updates_applied"] == (
        fit["messages"] - fit["updates_missing"] + fit["updates_applied_by_failed_attempts"]
    ), fit
    master.kill_after_steps = None
    accuracy, _ = _fit_until(spark_net, rdd, test, 0.90, 9)
    assert accuracy >= 0.90


def test_unreachable_controller_fails_fast_with_clear_error(spark_context, digits) -> None:
    train, _ = digits
    conf = {"controller_address": "127.0.0.1:9", "join_timeout_ms": 2000, "secure": False}
    master = _master("plain", "direct", conf=conf)
    spark_net = SparkNetwork(spark_context, _network(), master)
    started = time.monotonic()
    with pytest.raises(ControllerUnreachableError, match=r"127\.0\.0\.1:9.*network mask"):
        spark_net.fit(spark_context.parallelize(list(train.batches(100)), 2))
    assert time.monotonic() - started < 60


def test_fit_paths_with_custom_loader(spark_context, digits, npz_batch_paths, npz_loader) -> None:
    train, test = digits
    paths = npz_batch_paths
    # encoding_debug_mode: every worker logs threshold, sparsity and residual statistics per step
    spark_net = SparkNetwork(spark_context, _network(seed=23), _master("plain", encoding_debug_mode=True))
    for _ in range(6):
        spark_net.fit_paths(spark_context.parallelize(paths, 2), loader=npz_loader)
        if spark_net.network.evaluate(test).accuracy() >= 0.9:
            break
    assert spark_net.network.evaluate(test).accuracy() >= 0.85
    assert spark_net.training_master.last_fit["examples"] == train.num_examples


def test_dataframe_input_and_saved_network_predicts_the_same(spark, spark_context, digits, tmp_path) -> None:
    train, test = digits
    labels = train.label_indices()
    rows = [(train.features[i].tolist(), int(labels[i])) for i in range(train.num_examples)]
    frame = spark.createDataFrame(rows, ["features", "label"])
    spark_net = SparkNetwork(spark_context, _network(seed=24), _master("plain", "direct"))
    accuracy, _ = _fit_until(spark_net, frame, test, 0.90, 8)
    assert accuracy >= 0.85
    trained = spark_net.get_network()
    path = tmp_path / "trained.psrv"
    trained.save(path)
    loaded = Network.load(path)
    np.testing.assert_array_equal(loaded.output(test.features), trained.output(test.features))
    np.testing.assert_array_equal(loaded.predict(test.features), trained.predict(test.features))


def test_configuration_errors_are_clear() -> None:
    with pytest.raises(SparkConfigError, match="mesh_build_mode"):
        VoidConfiguration(mesh_build_mode="star")
    with pytest.raises(SparkConfigError, match="unicast_port"):
        VoidConfiguration(unicast_port=70000)
    with pytest.raises(SparkConfigError, match="network_mask"):
        VoidConfiguration(network_mask="10.0.0.0/99")
    with pytest.raises(SparkConfigError, match="port 'x'"):
        VoidConfiguration(controller_address="host:x")
    conf = VoidConfiguration(controller_address="10.1.2.3:5000", unicast_port=0)
    assert conf.controller_host("driver") == "10.1.2.3"
    assert conf.advertised_address("10.1.2.3:41234") == "10.1.2.3:5000"
    assert VoidConfiguration().controller_host("localhost") == "127.0.0.1"  # names are resolved
    assert VoidConfiguration().controller_host("127.0.0.1") == "127.0.0.1"
    assert route_source_address("127.0.0.1:40123") == "127.0.0.1"
    with pytest.raises(SparkConfigError, match="rdd_training_approach"):
        SharedTrainingMaster(VoidConfiguration(), rdd_training_approach="teleport")


def test_mesh_loses_no_update_when_a_parent_leaves(spark_context, digits) -> None:
    """Fan-out 1 chains the nodes; a task that ends first leaves while others still send through it.
    Each node stays until the controller acknowledged its updates (re-sent if a relay lost them)."""
    train, _ = digits
    master = _master("mesh", "export", conf={"mesh_fan_out": 1}, collect_training_stats=True)
    spark_net = SparkNetwork(spark_context, _network(seed=25), master)
    rdd = spark_context.parallelize(list(train.batches(50)), 3)
    for _ in range(4):
        spark_net.fit(rdd)
        assert master.last_fit["updates_missing"] == 0, master.last_fit
    flushes = [e for e in spark_net.get_training_stats() if e["kind"] == "flush"]
    assert len(flushes) == 8 and all(e["acknowledged"] for e in flushes)


def test_more_partitions_than_task_slots_does_not_deadlock(spark_context, digits) -> None:
    train, test = digits
    slots = spark_context.defaultParallelism
    master = _master("plain", "direct", num_workers=slots + 3)
    spark_net = SparkNetwork(spark_context, _network(seed=26), master)
    started = time.monotonic()
    spark_net.fit(spark_context.parallelize(list(train.batches(50)), 2))
    assert master.last_fit["workers"] == slots + 3  # tasks ran in waves, each joined and left
    assert master.last_fit["examples"] == train.num_examples
    assert master.last_fit["updates_missing"] == 0
    # tasks of later waves joined a mesh that had moved on; each still ended equal to the master
    assert master.last_fit["replicas_checked"] == slots + 3 and master.last_fit["replicas_diverged"] == 0
    assert time.monotonic() - started < 120
    # every task said where it ran; tasks in waves do not add up: never more at once than the slots
    (host, ran), = master.last_fit["hosts"].items()
    assert (host, ran["cores"]) == host_and_cores()
    assert 1 <= ran["tasks"] <= slots


@pytest.mark.timeout(480)
def test_torch_network_replicas_equal_the_master(spark_context, digits) -> None:
    """The replica invariant on Spark: TorchNetwork trained by gradient sharing; every task's replica
    equals the master copy after the drain (the old compute_update lost updates decoded during its steps)."""
    torch = pytest.importorskip("torch")
    from psrv.nn import TorchNetwork

    train, test = digits
    torch.manual_seed(5)
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    net = TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(64,), seed=5,
                       optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2))
    # executors import torch first: a generous join timeout (it counts from job submission)
    master = _master("plain", "direct", conf={"join_timeout_ms": 120_000})
    spark_net = SparkNetwork(spark_context, net, master)
    accuracy, totals = _fit_until(spark_net, spark_context.parallelize(list(train.batches(50)), 2), test,
                                  0.90, 6, min_epochs=2)
    fit = spark_net.training_master.last_fit
    assert totals["replicas_checked"] == 2 * totals["epochs"], (totals, fit)
    assert fit["replica_max_relative_l2"] <= 1e-6, fit
    assert accuracy >= 0.85, (accuracy, fit)
