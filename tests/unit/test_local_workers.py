"""Several workers behind one node: every batch dealt once, their steps summed exactly (values on a grid,
so float32 sums are exact), nothing the node decodes meanwhile lost, bad settings refused early."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from psrv.encoding import FixedThreshold, NoResidualPostProcessor, ResidualEncoder, decode
from psrv.nn import Adam, Dense, Network, Output
from psrv.spark.driver.shared_training import SharedTrainingMaster
from psrv.spark.errors import SparkConfigError
from psrv.spark.payload import NetworkPayload
from psrv.spark.task.local_workers import LocalWorkers, check_workers_per_node, deal, local_devices

GRID = 1.0 / 64  # every value a multiple of it: float32 sums stay exact


class _Batch:
    def __init__(self, index: int, rows: int = 4) -> None:
        self.index = index
        self.num_examples = rows


def _network() -> Network:
    network = Network([Dense(4, activation="relu"), Output(3)], input_shape=(5,), updater=Adam(1e-2), seed=1)
    network.set_params(np.round(network.params / GRID) * GRID)  # the replica starts on the grid
    return network


def _workers(count: int) -> tuple[Network, LocalWorkers, threading.RLock]:
    network = _network()
    lock = threading.RLock()
    payload = NetworkPayload.from_network(network, with_updater=True)
    return network, LocalWorkers(network, payload, count, lock, on_device=False), lock


def _grid_step(index: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(index)
    return (rng.integers(-40, 41, size) * GRID).astype(np.float32)


def test_the_batches_are_dealt_one_per_worker_each_exactly_once() -> None:
    timed = [(_Batch(i), float(i)) for i in range(7)]
    rounds = list(deal(iter(timed), 3))
    assert [[b.index for b in group] for group, _ in rounds] == [[0, 1, 2], [3, 4, 5], [6]]
    assert [start for _, start in rounds] == [0.0, 3.0, 6.0]  # each round's first step start
    assert list(deal(iter(timed), 1)) == [([b], s) for b, s in timed]  # one worker: today's loop


def test_two_workers_steps_are_summed_exactly_and_nothing_decoded_meanwhile_is_lost() -> None:
    """A round of two workers while the node's I/O thread decodes an update into the replica: the
    replica afterwards is the start + what arrived + both steps, exactly; worker 1 stepped from a snapshot
    of the replica; one combined update per round goes out (what an encoder with a grid threshold and no
    clipping sends plus its residual is that sum to the last bit)."""
    network, workers, lock = _workers(2)
    size = network.num_params
    start = np.array(network.params, copy=True)
    arrived = np.zeros(size, dtype=np.float32)
    sent = np.zeros(size, dtype=np.float32)
    seen: dict[int, np.ndarray] = {}
    buffers = {id(n): np.zeros(size, dtype=np.float32) for n in workers.networks}
    encoder = ResidualEncoder(size, threshold_algorithm=FixedThreshold(GRID * 4),
                              post_processor=NoResidualPostProcessor())

    def compute(net, batch, rows_before):
        seen[batch.index] = np.array(net.params, copy=True)
        if net is workers.networks[0]:  # the I/O thread decodes a peer's update during worker 0's step
            incoming = _grid_step(1000 + batch.index, size)
            with lock:
                network.params[...] += incoming
            arrived[...] += incoming
        out = buffers[id(net)]  # each worker's step lives in its own reused buffer (as TorchNetwork's)
        out[...] = _grid_step(batch.index, size)
        return out, float(batch.index)

    batches = [_Batch(i) for i in range(5)]
    messages = 0
    for group, _ in deal(iter([(b, 0.0) for b in batches]), 2):
        before = np.array(network.params, copy=True)
        outcomes = workers.compute(group, compute, 0)
        total = workers.combine([u for u, _ in outcomes])
        expected = sum(_grid_step(b.index, size) for b in group)
        if len(group) == 2:  # worker 1 stepped from the replica as it was, before or after the arrival
            during = before + _grid_step(1000 + group[0].index, size)
            assert np.array_equal(seen[group[1].index], before) or \
                np.array_equal(seen[group[1].index], during)
        assert np.array_equal(total, expected)  # exact, in worker order
        message = encoder.encode_update(total)
        messages += 1
        with lock:  # the task applies its one message locally, as node.submit(apply_locally=True)
            decode(message, network.params)
        decode(message, sent)
    workers.close()
    assert messages == 3  # five minibatches, two workers: three messages on the wire
    steps = sum(_grid_step(b.index, size) for b in batches)
    assert np.array_equal(sent + encoder.residual, steps)  # nothing of the steps lost or doubled
    assert np.array_equal(network.params, start + arrived + sent)  # nor of what arrived meanwhile
    assert np.array_equal(seen[0], start)  # worker 0 steps on the live replica


def test_a_workers_step_buffer_is_copied_out_before_its_next_step() -> None:
    network, workers, _ = _workers(2)
    shared = np.full(network.num_params, GRID, dtype=np.float32)
    total = workers.combine([shared, shared])
    shared[...] = 99.0  # the worker's next step overwrites its buffer
    assert np.all(total == 2 * GRID)
    workers.close()


def test_the_first_error_in_worker_order_is_raised_after_every_worker_finished() -> None:
    _, workers, _ = _workers(3)
    finished = []

    def compute(net, batch, rows_before):
        finished.append(batch.index)
        if batch.index >= 1:
            raise ValueError(f"row {rows_before}")
        return np.zeros(net.num_params, dtype=np.float32), 0.0

    with pytest.raises(ValueError, match="row 4"):  # worker 1's (4 rows before it), not worker 2's
        workers.compute([_Batch(0), _Batch(1), _Batch(2)], compute, 0)
    assert sorted(finished) == [0, 1, 2]
    workers.close()


def test_each_worker_has_its_own_network_and_updater_and_the_state_is_their_average() -> None:
    network, workers, _ = _workers(2)
    assert len(workers.networks) == 2 and workers.networks[0] is network
    assert workers.networks[1] is not network
    assert np.array_equal(workers.networks[1].updater_state, network.updater_state)
    network.set_updater_state(np.full_like(network.updater_state, 2.0))
    workers.networks[1].set_updater_state(np.full_like(network.updater_state, 4.0))
    assert np.all(workers.updater_state() == 3.0)
    workers.close()


def test_local_devices_are_the_tasks_gpus_in_turn_else_the_tasks_device() -> None:
    assert local_devices("cuda:0", 3, ["cuda:0", "cuda:1"]) == ["cuda:0", "cuda:1", "cuda:0"]
    assert local_devices("cuda:1", 2, ["cuda:0", "cuda:1"]) == ["cuda:1", "cuda:1"]  # an override
    assert local_devices("cpu", 2, []) == ["cpu", "cpu"]


@pytest.mark.parametrize("bad", [0, -1, 1.5, 2.0, "2", True, None])
def test_workers_per_node_must_be_an_int_of_at_least_one(bad) -> None:
    with pytest.raises(SparkConfigError, match=r"workers_per_node: expected an int >= 1.*got"):
        check_workers_per_node(bad)
    with pytest.raises(SparkConfigError, match="workers_per_node"):
        SharedTrainingMaster(workers_per_node=bad)


def test_the_default_is_one_worker_per_task() -> None:
    assert SharedTrainingMaster().workers_per_node == 1
    assert SharedTrainingMaster(workers_per_node=3).workers_per_node == 3
    _, workers, _ = _workers(1)
    assert len(workers.networks) == 1 and workers._pool is None


def test_the_estimator_takes_workers_per_node_as_a_param() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("pyspark")
    from psrv.spark.ml import TorchEstimator

    def make(**kw):
        return TorchEstimator(torch.nn.Linear(3, 2), torch.nn.CrossEntropyLoss(), input_shape=(3,),
                              feature_cols=["f"], **kw)

    assert make().getWorkersPerNode() == 1
    estimator = make(workers_per_node=2)
    assert estimator.getOrDefault("workersPerNode") == 2
    assert estimator._master().workers_per_node == 2
    with pytest.raises(SparkConfigError, match="workersPerNode"):
        make(workers_per_node=0)
    given = make(workers_per_node=2, training_master=SharedTrainingMaster())
    with pytest.raises(SparkConfigError, match="set workers_per_node on it instead"):
        given._master()


def test_torch_workers_on_the_device_path_step_from_the_replica_and_sum_tensors() -> None:
    """The device path (a torch network whose live parameters are tensors; CPU tensors here, as CI runs
    it): worker 1 copies the replica's tensor, both step with ``compute_update_tensor``, the sum is a
    tensor equal to the two steps taken one after the other from the same point."""
    torch = pytest.importorskip("torch")
    from psrv.nn.torch_adapter import TorchNetwork

    torch.manual_seed(0)
    network = TorchNetwork(torch.nn.Linear(5, 3), torch.nn.CrossEntropyLoss(), input_shape=(5,),
                           optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5))
    payload = NetworkPayload.from_network(network, with_updater=True)
    workers = LocalWorkers(network, payload, 2, threading.RLock(), on_device=True)
    rng = np.random.default_rng(3)
    batches = []
    for _ in range(2):
        batch = type("B", (), {})()
        batch.features = rng.normal(size=(4, 5)).astype(np.float32)
        batch.labels = np.eye(3, dtype=np.float32)[rng.integers(0, 3, 4)]
        batch.num_examples = 4
        batches.append(batch)
    reference = []
    for batch in batches:  # each step alone, from the replica's parameters
        twin = TorchNetwork(torch.nn.Linear(5, 3), torch.nn.CrossEntropyLoss(), input_shape=(5,),
                            optimizer=lambda ps: torch.optim.SGD(ps, lr=0.5))
        twin.set_params(network.params)
        reference.append(twin.compute_update(batch.features, batch.labels)[0].copy())

    def compute(net, batch, rows_before):
        return net.compute_update_tensor(batch.features, batch.labels)

    outcomes = workers.compute(batches, compute, 0)
    total = workers.combine([u for u, _ in outcomes])
    assert isinstance(total, torch.Tensor)
    assert np.allclose(total.numpy(), reference[0] + reference[1], atol=1e-6)
    assert np.array_equal(workers.networks[1].params, network.params)  # nothing applied by a step
    workers.close()


def test_with_an_offset_the_other_workers_start_at_the_replica_plus_it() -> None:
    """step_from="own": workers 1..N-1 take the replica plus the node's residual as their parameters
    before each step; worker 0 (the replica itself) is left alone."""
    network = _network()
    residual = np.random.default_rng(7).normal(0, 1e-2, network.num_params).astype(network.params.dtype)
    payload = NetworkPayload.from_network(network, with_updater=True)
    workers = LocalWorkers(network, payload, 2, threading.RLock(), on_device=False, offset=lambda: residual)
    replica = network.params.copy()
    seen = {}

    def compute(net, batch, rows_before):
        seen[rows_before] = net.params.copy()
        return np.zeros(net.num_params), 0.0

    batches = [type("B", (), {"num_examples": 3})() for _ in range(2)]
    workers.compute(batches, compute, 0)
    np.testing.assert_array_equal(seen[0], replica)  # worker 0: the replica, untouched
    np.testing.assert_array_equal(seen[3], replica + residual)
    workers.close()
