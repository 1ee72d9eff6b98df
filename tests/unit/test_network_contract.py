"""The network contract of gradient sharing (DESIGN.md, issue 9): ``compute_update`` returns the step and
never writes ``params``; an update the node's I/O thread decodes into ``params`` while a step is being
computed is never lost. Checked for every network kind: psrv.nn.Network and TorchNetwork."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from psrv.encoding import FixedThreshold, ResidualEncoder, decode
from psrv.nn import Adam, Dense, Network, Output

GRID = 2.0**-12  # params on this grid, updates of +-2^-10: every float32 sum is exact in any order


def _network():
    return Network([Dense(32, activation="relu"), Output(10)], input_shape=(64,), updater=Adam(1e-2), seed=1)


def _torch_network(optimizer=None):
    torch = pytest.importorskip("torch")
    from psrv.nn.torch_adapter import TorchNetwork

    torch.manual_seed(1)
    module = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    if optimizer == "instance":  # an optimizer the user built on module.parameters() before wrapping
        optimizer = torch.optim.SGD(module.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    return TorchNetwork(module, torch.nn.CrossEntropyLoss(), input_shape=(64,), optimizer=optimizer)


KINDS = {"network": _network, "torch": _torch_network,
         "torch-optimizer-instance": lambda: _torch_network("instance")}


def _batch(seed: int, n: int = 32):
    rng = np.random.default_rng(seed)
    return rng.random((n, 64), dtype=np.float32), rng.integers(0, 10, n)


def _on_grid(net) -> np.ndarray:
    net.set_params((np.round(net.params / GRID) * GRID).astype(np.float32))
    return net.params.astype(np.float64)


def _messages(size: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(5)
    encoder = ResidualEncoder(size, threshold_algorithm=FixedThreshold(2.0**-10))
    out = []
    while len(out) < count:
        message = encoder.encode_update((rng.standard_normal(size) * 2.0**-10).astype(np.float32))
        if message is not None:
            out.append(message)
    return out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_compute_update_never_writes_params(kind: str) -> None:
    net = KINDS[kind]()
    before = net.params.copy()
    for step in range(4):
        update, _ = net.compute_update(*_batch(step))
        np.testing.assert_array_equal(net.params, before)
        assert np.any(update != 0)


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_updates_decoded_during_steps_are_never_lost(kind: str) -> None:
    """A thread decodes 300 messages into params (as the node's I/O thread does, under a lock the
    training thread never takes) while compute_update runs in a loop: params end exactly at the
    start plus every decoded message."""
    net = KINDS[kind]()
    start = _on_grid(net)
    messages = _messages(net.num_params, 300)
    expected = start.copy()
    for message in messages:
        decode(message, expected)
    lock, done = threading.Lock(), threading.Event()

    def io_thread() -> None:
        for message in messages:
            with lock:
                decode(message, net.params)
            time.sleep(0.0003)  # spread over many steps, as updates arrive from other workers
        done.set()

    if hasattr(net, "optimizer"):  # widen the optimizer step, where the old copy-back erased decodes
        net.optimizer.register_step_post_hook(lambda *_: time.sleep(0.001))
    thread = threading.Thread(target=io_thread)
    thread.start()
    steps = 0
    while not done.is_set() or steps < 5:
        net.compute_update(*_batch(steps))
        steps += 1
    thread.join(30)
    np.testing.assert_array_equal(net.params.astype(np.float64), expected)


def test_torch_update_decoded_inside_the_step_is_kept() -> None:
    """Deterministic: hooks add a message into params during the forward pass and right after the
    optimizer's step, in the middle of compute_update (where the old snapshot/copy-back erased it)."""
    net = _torch_network()
    start = _on_grid(net)
    first, second = _messages(net.num_params, 2)
    handles = [net.module[2].register_forward_hook(lambda *_: decode(first, net.params)),
               net.optimizer.register_step_post_hook(lambda *_: decode(second, net.params))]
    try:
        update, _ = net.compute_update(*_batch(0))
    finally:
        for handle in handles:
            handle.remove()
    expected = start.copy()
    decode(first, expected)
    decode(second, expected)
    np.testing.assert_array_equal(net.params.astype(np.float64), expected)
    assert np.all(np.isfinite(update)) and np.any(update != 0)


def test_torch_optimizer_instance_steps_like_torch_without_touching_params() -> None:
    """An optimizer built on module.parameters() (with weight decay: it reads the params) is steered to
    the step buffer; its steps equal plain torch's, and its state round-trips through updater_state."""
    torch = pytest.importorskip("torch")
    net = _torch_network("instance")
    torch.manual_seed(1)
    plain = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-3)
    for step in range(3):
        x, y = _batch(step)
        update, _ = net.compute_update(x, y)
        net.apply_update(update)
        plain_opt.zero_grad()
        torch.nn.functional.cross_entropy(plain(torch.from_numpy(x)),
                                          torch.nn.functional.one_hot(torch.from_numpy(y), 10).float()
                                          ).backward()
        plain_opt.step()
        flat = torch.cat([p.detach().reshape(-1) for p in plain.parameters()]).numpy()
        np.testing.assert_allclose(net.params, flat, rtol=1e-5, atol=1e-6)
    state = net.updater_state
    assert state.size == net.num_params  # momentum buffers of the step parameters
    other = _torch_network("instance")
    other.set_updater_state(state)
    np.testing.assert_array_equal(other.updater_state, state)
