"""TorchNetwork: torch modules behind the psrv.nn contract, parameters backed by one flat buffer."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from psrv.nn import InvalidInputError, NonFiniteLossError  # noqa: E402
from psrv.nn.errors import ModelFileError  # noqa: E402
from psrv.nn.torch_adapter import TorchNetwork  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with threadpool_limits(1, user_api="blas"):
        yield
    torch.set_num_threads(threads)


def _mlp(seed: int = 0, optimizer=None) -> TorchNetwork:
    torch.manual_seed(seed)
    module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(64,), optimizer=optimizer)


def _batch(n: int = 16, seed: int = 0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, 64)).astype(np.float32), rng.integers(0, 10, n)


def test_params_are_one_flat_buffer_shared_with_torch() -> None:
    net = _mlp()
    assert net.num_params == 64 * 64 + 64 + 64 * 10 + 10
    assert net.params.dtype == np.float32
    net.params[:] = 0.25   # what the decoder does: write the NumPy view
    assert all(torch.all(p == 0.25) for p in net.module.parameters())
    with torch.no_grad():
        net.module[0].bias.add_(1.0)   # and torch's writes show in the view
    assert np.all(net.params[64 * 64 : 64 * 64 + 64] == 1.25)


def test_compute_update_equals_a_torch_step_without_applying_it() -> None:
    x, y = _batch()
    net = _mlp(optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    reference = _mlp(optimizer=None)
    ref_opt = torch.optim.SGD(reference.module.parameters(), lr=0.1, momentum=0.9)
    before = net.params.copy()
    for _ in range(3):
        update, loss = net.compute_update(x, y)
        np.testing.assert_array_equal(net.params, before)
        ref_opt.zero_grad()
        logits = reference.module(torch.from_numpy(x))
        ref_loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y))
        ref_loss.backward()
        ref_opt.step()
        net.apply_update(update)
        before = net.params.copy()
        assert loss == pytest.approx(float(ref_loss.detach()), rel=1e-5)
    np.testing.assert_allclose(net.params, reference.params, atol=1e-6)
    assert net.iteration == 3


def test_compute_update_returns_a_step_the_caller_keeps() -> None:
    """The step compute_update returns is the caller's: later steps do not write it, and it shares no
    memory with the network's buffers (the snapshot a step starts from is the network's own)."""
    x, y = _batch()
    net = _mlp(optimizer=lambda ps: torch.optim.Adam(ps, lr=1e-2))
    first, _ = net.compute_update(x, y)
    kept = first.copy()
    net.apply_update(first)
    second, _ = net.compute_update(*_batch(seed=1))
    np.testing.assert_array_equal(first, kept)
    assert not np.shares_memory(first, second) and not np.shares_memory(first, net.params)
    assert not np.array_equal(first, second)


def test_updater_state_round_trip_gives_the_same_next_step() -> None:
    x, y = _batch()
    a = _mlp(seed=1)
    for _ in range(2):
        a.apply_update(a.compute_update(x, y)[0])
    b = _mlp(seed=2)
    assert b.updater_state.size == 0     # torch creates optimizer state lazily
    b.set_params(a.params)
    b.set_updater_state(a.updater_state)
    np.testing.assert_array_equal(b.updater_state, a.updater_state)
    np.testing.assert_array_equal(b.compute_update(x, y)[0], a.compute_update(x, y)[0])
    with pytest.raises(InvalidInputError, match="expected a flat vector"):
        b.set_updater_state(np.zeros(5, dtype=np.float32))


def test_bad_input_leaves_params_untouched() -> None:
    net = _mlp()
    params = net.params.copy()
    zeros = np.zeros(4, dtype=int)
    cases = [(np.zeros((4, 63)), zeros), (np.full((4, 64), np.nan), zeros),
             (np.zeros((4, 64)), np.array([0, 1, 2, 10]))]
    for features, labels in cases:
        with pytest.raises(InvalidInputError):
            net.compute_update(features, labels)
    net.params[0] = np.inf
    with pytest.raises(NonFiniteLossError):
        net.compute_update(np.ones((4, 64)), np.zeros(4, dtype=int))
    net.params[0] = params[0]
    np.testing.assert_array_equal(net.params, params)
    assert net.iteration == 0


def test_fit_on_no_data_is_a_clear_error_like_network_fit() -> None:
    net = _mlp()
    before = net.params.copy()
    with pytest.raises(InvalidInputError, match="no minibatch"):
        net.fit([])
    assert np.array_equal(net.params, before) and net.epoch == 0
    features, labels = _batch()
    net.fit((features, labels), epochs=2, batch_size=8)
    assert net.epoch == 2 and not np.array_equal(net.params, before)


def test_save_load_identical_outputs(tmp_path) -> None:
    x, y = _batch(32)
    net = _mlp()
    net.fit((x, y), epochs=2, batch_size=8)
    path = tmp_path / "torch.pt"
    net.save(path)
    loaded = TorchNetwork.load(path)
    np.testing.assert_array_equal(loaded.output(x), net.output(x))
    np.testing.assert_array_equal(loaded.updater_state, net.updater_state)
    assert (loaded.iteration, loaded.epoch) == (8, 2)
    np.testing.assert_array_equal(loaded.compute_update(x, y)[0], net.compute_update(x, y)[0])
    (tmp_path / "junk").write_bytes(b"junk")
    with pytest.raises(ModelFileError):
        TorchNetwork.load(tmp_path / "junk")


@pytest.mark.timeout(60)
def test_torch_mlp_trains_digits_to_97_percent() -> None:
    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    torch.manual_seed(0)
    module = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.2),
        torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10),
    )
    net = TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(64,),
                       optimizer=lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True))
    net.fit((x_train, y_train), epochs=25, batch_size=32)
    accuracy = float((net.predict(x_test) == y_test).mean())
    assert accuracy >= 0.97
    evaluation = net.evaluate((x_test, np.eye(10, dtype=np.float32)[y_test]))
    assert evaluation.accuracy() == pytest.approx(accuracy)


def test_pickle_keeps_params_backed_by_the_flat_buffer() -> None:
    import pickle

    x, y = _batch()
    net = _mlp()
    net.apply_update(net.compute_update(x, y)[0])
    twin = pickle.loads(pickle.dumps(net))
    np.testing.assert_array_equal(twin.output(x), net.output(x))
    twin.params[:] = 0
    assert all(torch.all(p == 0) for p in twin.module.parameters())
    assert np.any(net.params != 0)


def test_the_step_as_a_pair_encodes_as_the_step_itself() -> None:
    """The Spark task's host path (the step as (after, before), summed, scanned and encoded in one pass)
    against compute_update + encode_update: the same messages, residual and parameters, bit for bit."""
    from psrv.encoding import AdaptiveThreshold, ResidualEncoder, decode
    from psrv.spark.task.sharing import _load_on_host

    runs = []
    for paired in (True, False):
        net = _mlp(optimizer=lambda params: torch.optim.Adam(params, lr=1e-2))
        encoder = ResidualEncoder(net.num_params, threshold_algorithm=AdaptiveThreshold(3e-3, decay=0.5))
        sent = []
        for step in range(30):
            x, y = _batch(seed=step)
            if paired:
                after, before, _ = net.compute_update_pair(x, y, load=_load_on_host)
                message = encoder.encode_difference(after, before)
            else:
                message = encoder.encode_update(net.compute_update(x, y)[0])
            if message is not None:
                decode(message, net.params)
                sent.append(message)
        runs.append((sent, encoder.residual, net.params.copy(), net.iteration))
    (sent1, residual1, params1, it1), (sent2, residual2, params2, it2) = runs
    assert len(sent1) == len(sent2) > 5 and it1 == it2 == 30
    for a, b in zip(sent1, sent2, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(residual1.view(np.uint32), residual2.view(np.uint32))
    np.testing.assert_array_equal(params1.view(np.uint32), params2.view(np.uint32))


def test_a_step_from_the_replica_plus_the_residual_is_the_plain_step_taken_there() -> None:
    """step_from="own": the forward, backward and optimizer step run at live + residual (what the Spark
    task's load puts in the step buffer); the result equals a twin network whose live parameters ARE
    live + residual, bit for bit, and the live parameters are never written."""
    from psrv.spark.task.sharing import _load_with_residual

    def adam(params):
        return torch.optim.Adam(params, lr=1e-2)

    net, twin = _mlp(optimizer=adam), _mlp(optimizer=adam)
    residual = np.random.default_rng(3).normal(0, 1e-2, net.num_params).astype(np.float32)
    for step in range(5):
        x, y = _batch(seed=step)
        live = net.params.copy()
        twin.params[:] = live + residual  # the same float32 sum as the kernel's
        after, before, loss = net.compute_update_pair(
            x, y, from_loaded=True, load=lambda a, b, c: _load_with_residual(a, b, c, residual=residual))
        twin_after, twin_before, twin_loss = twin.compute_update_pair(x, y)
        assert loss == twin_loss
        np.testing.assert_array_equal(before.view(np.uint32), twin_before.view(np.uint32))
        np.testing.assert_array_equal(after.view(np.uint32), twin_after.view(np.uint32))
        np.testing.assert_array_equal(net.params.view(np.uint32), live.view(np.uint32))  # never written
        net.params[:] += 1e-3 * (after - before)  # the replica moves by something, as messages move it
    # the module computes with the live buffer again: writing params changes its output
    out = net.output(_batch()[0])
    net.params[:] = 0
    assert not np.array_equal(out, net.output(_batch()[0]))


def test_a_step_from_a_zero_residual_is_the_shared_step_bit_for_bit() -> None:
    from psrv.spark.task.sharing import _load_on_host, _load_with_residual

    nets = [_mlp(), _mlp()]
    zero = np.zeros(nets[0].num_params, dtype=np.float32)
    for step in range(3):
        x, y = _batch(seed=step)
        own = nets[0].compute_update_pair(
            x, y, from_loaded=True, load=lambda a, b, c: _load_with_residual(a, b, c, residual=zero))
        shared = nets[1].compute_update_pair(x, y, load=_load_on_host)
        for a, b in zip(own[:2], shared[:2], strict=True):
            np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))
        for net, (after, before, _) in zip(nets, (own, shared), strict=True):
            net.params[:] += after - before


def test_a_failed_step_from_the_step_buffer_leaves_the_module_on_the_live_parameters() -> None:
    from psrv.spark.task.sharing import _load_with_residual

    net = _mlp()
    zero = np.zeros(net.num_params, dtype=np.float32)
    pointers = [p.data_ptr() for p in net.module.parameters()]
    x, y = _batch()
    with pytest.raises(Exception):  # noqa: B017 - whatever the module raises for a wrong width
        net.compute_update_pair(x[:, :5], y, from_loaded=True,
                                load=lambda a, b, c: _load_with_residual(a, b, c, residual=zero))
    assert [p.data_ptr() for p in net.module.parameters()] == pointers


def test_the_device_paths_step_from_the_replica_plus_the_residual_is_the_plain_step_taken_there() -> None:
    """The GPU worker's path (compute_update_tensor, the residual a tensor) on CPU tensors: the step
    taken from live + residual equals a twin's whose live parameters are live + residual, bit for bit."""
    from psrv.nn.torch_flat import load_with

    net, twin = _mlp(), _mlp()
    residual = torch.from_numpy(np.random.default_rng(4).normal(0, 1e-2, net.num_params).astype(np.float32))
    for step in range(3):
        x, y = _batch(seed=step)
        live = net.params.copy()
        twin.params[:] = live + residual.numpy()
        update, loss = net.compute_update_tensor(x, y, from_loaded=True, load=load_with(residual))
        twin_update, twin_loss = twin.compute_update_tensor(x, y)
        assert loss == twin_loss
        np.testing.assert_array_equal(update.numpy().view(np.uint32), twin_update.numpy().view(np.uint32))
        np.testing.assert_array_equal(net.params.view(np.uint32), live.view(np.uint32))  # never written
        net.params[:] += update.numpy()
