"""TorchNetwork devices and buffers: the module stays where it is, buffers are state, the device
sharing path (psrv.spark.task.device) works on CPU tensors with a real controller and nodes."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.encoding import AdaptiveThreshold, ResidualEncoder, compact, encode_counted  # noqa: E402
from psrv.nn.errors import ConfigError, InvalidInputError  # noqa: E402
from psrv.nn.torch_adapter import TorchNetwork, resolve_device  # noqa: E402
from psrv.server import Controller, Node  # noqa: E402
from psrv.spark.task import device as spark_device  # noqa: E402
from psrv.torch.device_sharing import DeviceSharing  # noqa: E402
from psrv.transport import TransportConfig  # noqa: E402

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs CUDA (torch.cuda.is_available() is False here)")


def cnn(seed: int = 0, dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 8, 8)), torch.nn.Conv2d(1, 4, 3, padding=1), torch.nn.BatchNorm2d(4),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(256, 10)).to(dtype)


def net(module=None, **kwargs) -> TorchNetwork:
    return TorchNetwork(module if module is not None else cnn(), torch.nn.CrossEntropyLoss(), (64,),
                        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), **kwargs)


def batch(n: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 64)).astype(np.float32), rng.integers(0, 10, n)


def test_the_module_stays_on_its_device_and_keeps_its_dtype() -> None:
    network = net()
    assert network.device == torch.device("cpu") and network.on_host
    assert all(p.device.type == "cpu" for p in network.module.parameters())
    double = net(cnn(dtype=torch.float64))
    assert double.params.dtype == np.float64 and double.dtype == np.float64
    assert all(p.dtype == torch.float64 for p in double.module.parameters())
    x, y = batch()
    update, _ = double.compute_update(x.astype(np.float64), y)
    assert update.dtype == np.float64
    before = double.params.copy()
    double.apply_update(update)
    np.testing.assert_array_equal(double.params, before + update)


def test_device_choices_and_clear_errors(caplog) -> None:
    assert net(device="cpu").device == torch.device("cpu")
    with caplog.at_level(logging.INFO, logger="psrv.nn.torch_adapter"):
        auto = net(device="auto")
    assert auto.device == (torch.device("cuda", torch.cuda.current_device()) if CUDA else torch.device("cpu"))
    assert "device='auto'" in caplog.text
    if not CUDA:
        with pytest.raises(ConfigError, match="CUDA is not available.*'auto'"):
            net(device="cuda:1")
    with pytest.raises(ConfigError, match="expected 'cpu', 'cuda'"):
        resolve_device("gpu-please")
    with pytest.raises(ConfigError, match="bfloat16.*autocast"):
        net(cnn().to(torch.bfloat16))
    mixed = cnn()
    mixed[5].double()
    with pytest.raises(ConfigError, match="mix dtypes"):
        net(mixed)


def test_tensor_paths_equal_the_numpy_paths_on_cpu() -> None:
    x, y = batch()
    a, b = net(cnn(1)), net(cnn(1))
    for _ in range(3):
        update, loss = a.compute_update(x, y)
        tensor, tensor_loss = b.compute_update_tensor(x, y)
        assert isinstance(tensor, torch.Tensor) and loss == tensor_loss
        np.testing.assert_array_equal(tensor.numpy(), update)
        a.apply_update(update)
        b.apply_update(tensor)
        np.testing.assert_array_equal(a.params, b.params)
        b.set_params(torch.from_numpy(a.params.copy()))
    with pytest.raises(InvalidInputError, match="shape"):
        b.apply_update(torch.zeros(3))


def test_buffers_are_state_get_set_and_save_load_exactly(tmp_path) -> None:
    network = net()
    fresh = network.get_buffers()
    assert set(fresh) == {"2.running_mean", "2.running_var", "2.num_batches_tracked"}
    assert not fresh["2.running_mean"].any()
    x, y = batch()
    for seed in range(3):
        network.compute_update(*batch(seed=seed))
    trained = network.get_buffers()
    assert trained["2.running_mean"].any() and int(trained["2.num_batches_tracked"]) == 3
    network.save(tmp_path / "n.pt")
    loaded = TorchNetwork.load(tmp_path / "n.pt")
    for name, value in loaded.get_buffers().items():
        np.testing.assert_array_equal(value, trained[name])
    np.testing.assert_array_equal(loaded.output(x), network.output(x))  # eval mode uses the statistics
    other = net(cnn(5))
    other.set_buffers({**trained, "2.num_batches_tracked": np.array(2.6)})  # averaged counters round
    assert int(other.get_buffers()["2.num_batches_tracked"]) == 3
    np.testing.assert_array_equal(other.get_buffers()["2.running_var"], trained["2.running_var"])
    with pytest.raises(InvalidInputError, match="names"):
        other.set_buffers({"2.running_mean": trained["2.running_mean"]})
    with pytest.raises(InvalidInputError, match="shape"):
        other.set_buffers({**trained, "2.running_mean": np.zeros(3)})


def test_task_device_override_and_auto(monkeypatch) -> None:
    monkeypatch.setenv(spark_device.DEVICE_ENV, "cpu")
    assert spark_device.task_device() == torch.device("cpu")
    monkeypatch.delenv(spark_device.DEVICE_ENV)
    expected = torch.device("cuda", 0) if CUDA else torch.device("cpu")  # no TaskContext: partition 0
    assert spark_device.task_device() == expected
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert spark_device._visible_index("5") == 1 and spark_device._visible_index("4") is None
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert spark_device._visible_index("2") == 2


def _config() -> TransportConfig:
    return TransportConfig(host="127.0.0.1", heartbeat_s=0.2)


def _replicas_equal(workers, nodes, controller) -> bool:
    with controller.lock:
        master = controller.params.copy()
    for (network, _, _), node in zip(workers, nodes, strict=True):
        with node.lock:
            if np.max(np.abs(network.params - master)) > 1e-6:
                return False
    return True


def test_device_sharing_keeps_replicas_equal_through_a_real_controller() -> None:
    """Two workers on the device path (CPU tensors here): encode on the device, host copy through the
    staging buffer, received updates decoded by the apply hook, the download installed by the hook."""
    cfg = _config()
    start = net(cnn(3))
    controller = Controller(cfg, start.params.copy()).start()
    workers, nodes = [], []
    try:
        for seed in range(2):
            network = net(cnn(3 + 10 * seed))  # different start: the download must replace it
            encoder = ResidualEncoder(network.num_params, threshold_algorithm=AdaptiveThreshold(1e-3),
                                      device=network.device)
            sharing = DeviceSharing(network, encoder)
            node = Node(cfg, sharing.node_params, controller.address, **sharing.node_hooks()).start()
            np.testing.assert_array_equal(network.params, start.params)  # installed on the device
            workers.append((network, encoder, sharing))
            nodes.append(node)
        sent = 0

        def train(i: int) -> None:
            nonlocal sent
            network, encoder, sharing = workers[i]
            for step in range(15):
                update, _ = network.compute_update_tensor(*batch(seed=100 * i + step))
                message = encoder.encode_update(update)
                if message is not None:
                    wire = compact(message.cpu().numpy())  # what travels, and what is counted
                    assert sharing.submit(nodes[i], message, network.iteration, 0) == wire.nbytes
                    sent += 1

        threads = [threading.Thread(target=train, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sent > 5
        for node in nodes:
            assert node.wait_acknowledged(timeout_s=10)
        pause = threading.Event()
        for _ in range(100):  # in-flight relays drain within a few heartbeats
            if controller.counters()["updates_applied"] >= sent and \
                    _replicas_equal(workers, nodes, controller):
                break
            pause.wait(0.1)
        assert controller.counters()["updates_applied"] == sent
        assert _replicas_equal(workers, nodes, controller)
        for _, _, sharing in workers:
            assert sharing._staging is not None and not sharing._staging.is_pinned()  # pinned only on CUDA
    finally:
        for node in nodes:
            node.stop()
        controller.stop()


def test_device_sharing_rejects_a_malformed_update_as_a_counted_rejection() -> None:
    from psrv.transport.errors import FrameRejectedError

    network = net()
    sharing = DeviceSharing(network, ResidualEncoder(network.num_params, device="cpu"))
    before = network.params.copy()
    with pytest.raises(FrameRejectedError, match="bad_payload|header"):
        sharing.apply(np.array([1, network.num_params, 0, 0, 1], dtype=np.int32), {"origin": 1, "seq": 2})
    np.testing.assert_array_equal(network.params, before)


@pytest.mark.gpu
@needs_cuda
def test_a_cuda_module_keeps_its_parameters_on_cuda() -> None:
    network = net(cnn().cuda())
    assert network.device.type == "cuda" and not network.on_host
    assert all(p.device.type == "cuda" for p in network.module.parameters())
    assert network.flat_params.device.type == "cuda" and network._step_flat.device.type == "cuda"
    x, y = batch()
    update, _ = network.compute_update_tensor(x, y)
    assert update.device.type == "cuda"
    assert all(v.device.type == "cuda" for s in network.optimizer.state.values() for v in s.values()
               if isinstance(v, torch.Tensor))
    copy = TorchNetwork.from_bytes(network.to_bytes())
    assert copy.device == network.device
    np.testing.assert_array_equal(copy.params, network.params)


def test_executor_side_builds_consult_the_task_device(monkeypatch) -> None:
    """Training (training_network) and evaluation/inference (cached_network) build a torch network on
    the task's device; here PSRV_DEVICE steers it (CPU only in CI)."""
    from psrv.spark.payload import NetworkPayload
    from psrv.spark.task.worker import cached_network, training_network

    network = net()
    for _ in range(2):
        network.compute_update(*batch())
    payload = NetworkPayload.from_network(network, with_updater=True)
    monkeypatch.setenv(spark_device.DEVICE_ENV, "cpu")
    for built in (cached_network(payload), training_network(payload)):
        assert built.device == torch.device("cpu")
        np.testing.assert_array_equal(built.params, network.params)
        for name, value in built.get_buffers().items():
            np.testing.assert_array_equal(value, network.get_buffers()[name])
    if not CUDA:
        monkeypatch.setenv(spark_device.DEVICE_ENV, "cuda:0")
        fresh = NetworkPayload.from_network(network)
        with pytest.raises(ConfigError, match="CUDA is not available"):
            cached_network(fresh)


def test_a_file_saved_on_a_missing_gpu_loads_on_the_cpu(caplog) -> None:
    if CUDA:
        pytest.skip("this host has CUDA: the saved device exists")
    network = net()
    network.device = torch.device("cuda", 0)  # only what to_bytes records: as if saved on a GPU host
    data = network.to_bytes()
    with caplog.at_level(logging.WARNING, logger="psrv.nn.torch_adapter"):
        loaded = TorchNetwork.from_bytes(data, source="gpu.pt")
    assert loaded.device == torch.device("cpu") and "gpu.pt: saved from cuda:0" in caplog.text


def test_task_device_takes_the_gpu_spark_assigned(monkeypatch, caplog) -> None:
    """TaskContext is Spark's (outside psrv): a stand-in says which GPU the task was given."""
    import pyspark

    class Gpus:
        addresses = ["0"]

    class Context:
        def resources(self):
            return {"gpu": Gpus()}

        def partitionId(self):  # noqa: N802 - Spark's name
            return 3

    monkeypatch.delenv(spark_device.DEVICE_ENV, raising=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: Context()))
    with caplog.at_level(logging.INFO, logger="psrv.spark.task.device"):
        chosen = spark_device.task_device()
    if CUDA:
        assert chosen == torch.device("cuda", 0) and "Spark assigned GPU 0" in caplog.text
    else:  # assigned a GPU torch cannot use: said so, then the automatic choice (the CPU here)
        assert chosen == torch.device("cpu")
        assert "Spark assigned GPU 0, which torch cannot use" in caplog.text


def test_a_burst_of_updates_reaches_a_device_replica_in_batches() -> None:
    """A burst submitted in a tight loop travels in UPDATES frames; the receiving device worker decodes
    each frame's updates with one apply_many call (one transfer, one kernel) and ends equal to the master,
    every update applied exactly once (the counts of both hooks add up to what was sent)."""
    cfg = _config()
    start = net(cnn(3))
    controller = Controller(cfg, start.params.copy()).start()
    sender_net, receiver_net = net(cnn(3)), net(cnn(3))
    sender = DeviceSharing(sender_net, ResidualEncoder(sender_net.num_params, device="cpu"))
    receiver = DeviceSharing(receiver_net,
                                          ResidualEncoder(receiver_net.num_params, device="cpu"))
    rows: list[int] = []
    singles: list[int] = []
    hooks = receiver.node_hooks()
    batch_hook, single_hook = hooks["apply_many"], hooks["apply"]

    def counted_batch(payloads, headers):
        rows.append(len(payloads))
        return batch_hook(payloads, headers)

    def counted_single(payload, header):
        singles.append(1)
        return single_hook(payload, header)

    hooks["apply_many"], hooks["apply"] = counted_batch, counted_single
    nodes = []
    try:
        nodes.append(Node(cfg, sender.node_params, controller.address, **sender.node_hooks()).start())
        nodes.append(Node(cfg, receiver.node_params, controller.address, **hooks).start())
        rng = np.random.default_rng(5)
        sent = 300
        for step in range(sent):
            update = np.zeros(sender_net.num_params, dtype=np.float32)
            update[rng.choice(sender_net.num_params, 20, replace=False)] = rng.choice([-1.0, 1.0], 20)
            message, _ = encode_counted(update, 2.0**-10)
            sender.submit(nodes[0], torch.from_numpy(message), step, 0)
        assert nodes[0].wait_acknowledged(timeout_s=30)
        pause = threading.Event()
        for _ in range(150):
            if nodes[1].counters()["updates_applied"] >= sent:
                break
            pause.wait(0.1)
        assert nodes[1].counters()["updates_applied"] == sent
        assert sum(rows) + len(singles) == sent  # every update through one hook, once
        assert max(rows, default=0) > 1  # the burst arrived in batches and was decoded as such
        assert _replicas_equal([(receiver_net, None, None), (sender_net, None, None)], nodes, controller)
    finally:
        for node in nodes:
            node.stop()
        controller.stop()
