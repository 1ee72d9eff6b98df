"""A small CNN with BatchNorm trained on real Spark: its buffers (running statistics, counters) are
network state on both training masters; the device path of gradient sharing runs on CPU tensors."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.encoding import AdaptiveThreshold  # noqa: E402
from psrv.nn import TorchNetwork  # noqa: E402
from psrv.spark import ParameterAveragingTrainingMaster, SparkNetwork  # noqa: E402
from psrv.spark.config import VoidConfiguration  # noqa: E402
from psrv.spark.driver.shared_training import SharedTrainingMaster  # noqa: E402
from psrv.spark.task.device import wants_device_sharing  # noqa: E402
from psrv.spark.task.sharing import SharingTrainer  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]


class _DeviceSharingOnCpu(SharingTrainer):
    """The GPU worker's path of gradient sharing (device codec, node hooks) on CPU tensors."""

    def device_sharing(self, network) -> bool:
        return wants_device_sharing(network, force=True)


class _DeviceSharingMaster(SharedTrainingMaster):
    def task_trainer(self, setup, loader) -> SharingTrainer:
        return _DeviceSharingOnCpu(setup, loader)


def _cnn(seed: int) -> TorchNetwork:
    torch.manual_seed(seed)
    module = torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 8, 8)), torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(512, 10))
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(64,),
                        optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2), seed=seed)


def _assert_saved_buffers_round_trip(network: TorchNetwork, tmp_path) -> None:
    network.save(tmp_path / "cnn.pt")
    loaded = TorchNetwork.load(tmp_path / "cnn.pt")
    saved = network.get_buffers()
    for name, value in loaded.get_buffers().items():
        assert value.dtype == saved[name].dtype
        np.testing.assert_array_equal(value, saved[name])
    np.testing.assert_array_equal(loaded.params, network.params)


def test_gradient_sharing_on_the_device_path_returns_the_average_of_the_workers_buffers(
        spark_context, digits, tmp_path) -> None:
    train, test = digits
    network = _cnn(3)
    conf = VoidConfiguration(unicast_port=0, mesh_build_mode="plain", heartbeat_ms=2000,
                             join_timeout_ms=120_000)  # executors import torch first: slow on a busy host
    master = _DeviceSharingMaster(conf, batch_size_per_worker=16, rdd_training_approach="direct",
                                  threshold_algorithm=AdaptiveThreshold(3e-2))
    spark_net = SparkNetwork(spark_context, network, master)
    rdd = spark_context.parallelize(list(train.batches(50)), 2)
    for _ in range(3):
        spark_net.fit(rdd)
        reported = master.last_worker_buffers
        assert len(reported) == 2 and all(r is not None for r in reported)
        driver = network.get_buffers()
        for name, value in driver.items():
            mean = np.mean([r[name].astype(np.float64) for r in reported], axis=0)
            expected = np.rint(mean) if value.dtype.kind == "i" else mean.astype(value.dtype)
            np.testing.assert_array_equal(value, expected, err_msg=name)
        assert master.last_fit["updates_missing"] == 0, master.last_fit
        # the device path keeps the invariant too: the live (device) replicas equal the master copy
        assert master.last_fit["replicas_checked"] == 2 and master.last_fit["replicas_diverged"] == 0, \
            master.last_fit
        assert master.last_fit["step_from"] == {"own": 2}  # from replica + residual, on the device too
    assert np.abs(driver["2.running_mean"]).sum() > 0 and not np.allclose(driver["2.running_var"], 1.0)
    assert int(driver["2.num_batches_tracked"]) > 0
    assert network.evaluate(test).accuracy() >= 0.85  # evaluated with the averaged running statistics
    _assert_saved_buffers_round_trip(network, tmp_path)


def test_parameter_averaging_averages_the_buffers(spark_context, digits, tmp_path) -> None:
    train, test = digits
    network = _cnn(4)
    master = ParameterAveragingTrainingMaster(batch_size_per_worker=16, averaging_frequency=5,
                                              rdd_training_approach="export")
    spark_net = SparkNetwork(spark_context, network, master)
    batches = list(train.batches(16))[:40]  # 40 minibatches of 16: 4 rounds of 2 workers x 5 steps
    rdd = spark_context.parallelize(batches, 2)
    spark_net.fit(rdd)
    driver = network.get_buffers()
    # every worker took 5 BatchNorm steps per round from the averaged counter: the average is 20 exactly
    assert int(driver["2.num_batches_tracked"]) == 20
    assert np.abs(driver["2.running_mean"]).sum() > 0 and not np.allclose(driver["2.running_var"], 1.0)
    for _ in range(2):
        spark_net.fit(spark_context.parallelize(list(train.batches(16)), 2))
    assert network.evaluate(test).accuracy() >= 0.85
    _assert_saved_buffers_round_trip(network, tmp_path)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs CUDA (torch.cuda.is_available() is False here)")
def test_two_workers_sharing_one_gpu_train_digits_with_the_driver_on_cpu(spark_context, digits) -> None:
    train, test = digits
    network = _cnn(5)  # the driver's network stays on the CPU
    conf = VoidConfiguration(unicast_port=0, mesh_build_mode="plain", heartbeat_ms=1000,
                             join_timeout_ms=120_000)
    master = SharedTrainingMaster(conf, batch_size_per_worker=16, rdd_training_approach="direct",
                                  threshold_algorithm=AdaptiveThreshold(3e-2), collect_training_stats=True)
    spark_net = SparkNetwork(spark_context, network, master)
    rdd = spark_context.parallelize(list(train.batches(50)), 2)
    accuracy = 0.0
    for _ in range(8):
        spark_net.fit(rdd)
        accuracy = network.evaluate(test).accuracy()
        if accuracy >= 0.90:
            break
    assert accuracy >= 0.90
    assert network.device.type == "cpu"
    devices = {e["device"] for e in spark_net.get_training_stats() if e["kind"] == "setup"}
    assert devices == {"cuda:0"}, devices  # both workers on the one GPU (partition % 1 GPU)
