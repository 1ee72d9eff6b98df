"""The network contract of gradient sharing (DESIGN.md): ``compute_update`` returns the step and
never writes ``params``; an update the node's I/O thread decodes into ``params`` while a step is being
computed is never lost. Checked for every network kind: psrv.nn.Network and TorchNetwork. The contracts as
types too: every network against the Protocols of psrv.nn.protocol, both training masters against
psrv.spark.driver.master.TrainingMaster (isinstance, and each member's kind and signature)."""

from __future__ import annotations

import inspect
import threading
import time
from typing import Generic, Protocol

import numpy as np
import pytest
from psrv.encoding import FixedThreshold, ResidualEncoder, decode
from psrv.nn import Adam, Dense, Network, Output
from psrv.nn.protocol import BufferedNetwork, DeviceNetwork, MultiIONetwork, TrainableNetwork

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


# --------------------------------------------------------------------------------------------------
# the contracts as types: every implementation against its Protocol
# --------------------------------------------------------------------------------------------------
def _members(protocol: type) -> dict[str, object]:
    """The members a Protocol declares (its own and those of the Protocols it extends)."""
    members: dict[str, object] = {}
    for base in reversed(protocol.__mro__):
        if base in (object, Protocol, Generic) or not getattr(base, "_is_protocol", False):
            continue
        for name in getattr(base, "__annotations__", {}):
            members.setdefault(name, None)
        for name, value in vars(base).items():
            if not name.startswith("_"):
                members[name] = value
    return members


def _parameters(function) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(function).parameters.values() if p.name not in ("self", "cls")]


def _signature_problems(name: str, declared, implemented) -> list[str]:
    """An implementation fits a declared method when it takes every declared parameter by the same name
    and kind (with a default where one is declared) and needs nothing more."""
    problems = []
    mine = {p.name: p for p in _parameters(implemented)}
    for p in _parameters(declared):
        got = mine.pop(p.name, None)
        if got is None:
            problems.append(f"{name}: no parameter {p.name!r}")
        elif got.kind != p.kind:
            problems.append(f"{name}: {p.name!r} is {got.kind.description}, declared {p.kind.description}")
        elif p.default is not inspect.Parameter.empty and got.default is inspect.Parameter.empty:
            problems.append(f"{name}: {p.name!r} needs a default")
    for p in mine.values():
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is inspect.Parameter.empty:
            problems.append(f"{name}: extra required parameter {p.name!r}")
    return problems


def _contract_problems(instance: object, protocol: type) -> list[str]:
    problems = [] if isinstance(instance, protocol) else [f"not an instance of {protocol.__name__}"]
    cls = type(instance)
    for name, declared in _members(protocol).items():
        implemented = inspect.getattr_static(cls, name, None)
        if isinstance(declared, property):
            if not isinstance(implemented, property):
                problems.append(f"{name}: declared a property, got {type(implemented).__name__}")
            elif declared.fset is not None and implemented.fset is None:
                problems.append(f"{name}: declared settable, the property is read-only")
        elif isinstance(declared, classmethod):
            if not isinstance(implemented, classmethod):
                problems.append(f"{name}: declared a classmethod")
            else:
                problems += _signature_problems(name, declared.__func__, implemented.__func__)
        elif callable(declared):
            if not callable(implemented):
                problems.append(f"{name}: not a method")
            else:
                problems += _signature_problems(name, declared, implemented)
        elif not hasattr(instance, name):  # a data attribute
            problems.append(f"{name}: missing")
    return problems


NETWORK_PROTOCOLS = {
    "network": (TrainableNetwork,),
    "torch": (TrainableNetwork, DeviceNetwork, BufferedNetwork, MultiIONetwork),
    "torch-optimizer-instance": (TrainableNetwork, DeviceNetwork, BufferedNetwork, MultiIONetwork),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_network_implements_its_protocols(kind: str) -> None:
    net = KINDS[kind]()
    for protocol in NETWORK_PROTOCOLS[kind]:
        assert _contract_problems(net, protocol) == [], protocol.__name__
    if kind == "network":  # capabilities it does not claim are not there either
        assert not isinstance(net, DeviceNetwork | BufferedNetwork | MultiIONetwork)


def _masters() -> dict[str, object]:
    from psrv.spark import ParameterAveragingTrainingMaster, SharedTrainingMaster

    return {"sharing": SharedTrainingMaster(), "averaging": ParameterAveragingTrainingMaster()}


@pytest.mark.parametrize("kind", ["averaging", "sharing"])
def test_every_training_master_implements_the_protocol(kind: str) -> None:
    from psrv.spark.driver.master import TrainingMaster

    assert _contract_problems(_masters()[kind], TrainingMaster) == []


def test_the_contract_check_sees_a_wrong_signature() -> None:
    class Partial:
        seed = 0

        def compute_update(self, features, labels):  # no mask
            return features, 0.0

    problems = _contract_problems(Partial(), TrainableNetwork)
    assert "not an instance of TrainableNetwork" in problems
    assert "compute_update: no parameter 'mask'" in problems
    assert "params: declared a property, got NoneType" in problems
