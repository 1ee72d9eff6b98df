"""Momentum for N sharing workers: Adam's beta1 becomes the given one ** N, always from the given value."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from psrv.nn import Adam, Dense, Nesterov, Network, Output
from psrv.nn.errors import ConfigError
from psrv.nn.momentum import GIVEN_KEY, momentum_for_workers

torch = pytest.importorskip("torch")

from psrv.nn import TorchNetwork  # noqa: E402


def _two_groups(kind: type = torch.optim.Adam) -> torch.optim.Optimizer:
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    return kind([{"params": a.parameters(), "betas": (0.9, 0.999)},
                 {"params": b.parameters(), "betas": (0.8, 0.99)}], lr=1e-3)


@pytest.mark.parametrize("kind", [torch.optim.Adam, torch.optim.AdamW, torch.optim.NAdam, torch.optim.Adamax])
def test_every_group_gets_its_own_beta1_to_the_power_of_the_workers(kind) -> None:
    optimizer = _two_groups(kind)
    changes = momentum_for_workers(optimizer, 4)
    assert [(c.given, c.now) for c in changes] == [(0.9, 0.9 ** 4), (0.8, 0.8 ** 4)]
    assert [g["betas"] for g in optimizer.param_groups] == [(0.9 ** 4, 0.999), (0.8 ** 4, 0.99)]  # beta2 kept
    assert changes[0].name == f"{kind.__name__} betas[0]"


def test_a_second_call_starts_from_the_given_value_and_one_worker_restores_it() -> None:
    optimizer = _two_groups()
    momentum_for_workers(optimizer, 8)
    momentum_for_workers(optimizer, 2)  # not (0.9 ** 8) ** 2
    assert optimizer.param_groups[0]["betas"][0] == pytest.approx(0.81, abs=1e-15)
    momentum_for_workers(optimizer, 1)
    assert [g["betas"] for g in optimizer.param_groups] == [(0.9, 0.999), (0.8, 0.99)]


def test_the_given_value_travels_with_the_state_dict() -> None:
    optimizer = _two_groups()
    momentum_for_workers(optimizer, 4)
    again = _two_groups()
    again.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert again.param_groups[0][GIVEN_KEY] == 0.9 and again.param_groups[0]["betas"][0] == 0.9 ** 4
    momentum_for_workers(again, 1)
    assert again.param_groups[0]["betas"][0] == 0.9


def test_adam_steps_with_the_scaled_beta1_as_torch_does_with_it_given() -> None:
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    twin = copy.deepcopy(module)
    scaled = torch.optim.Adam(module.parameters(), lr=1e-2)
    momentum_for_workers(scaled, 3)
    reference = torch.optim.Adam(twin.parameters(), lr=1e-2, betas=(0.9 ** 3, 0.999))
    x = torch.randn(16, 4)
    for _ in range(5):
        for m, opt in ((module, scaled), (twin, reference)):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for p, q in zip(module.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                                  lambda ps: torch.optim.SGD(ps, lr=0.1),
                                  lambda ps: torch.optim.RMSprop(ps, lr=0.1, momentum=0.5),
                                  lambda ps: torch.optim.Adagrad(ps, lr=0.1)])
def test_optimizers_without_betas_are_left_as_given(make) -> None:
    optimizer = make(torch.nn.Linear(2, 2).parameters())
    before = copy.deepcopy(optimizer.param_groups[0])
    before.pop("params")
    assert momentum_for_workers(optimizer, 8) == []
    after = dict(optimizer.param_groups[0])
    after.pop("params")
    assert after == before


def test_a_torch_network_s_optimizer_is_set() -> None:
    network = TorchNetwork(torch.nn.Linear(4, 2), torch.nn.CrossEntropyLoss(), (4,),
                           optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-3, betas=(0.95, 0.999)))
    changes = momentum_for_workers(network, 2)
    assert [(c.name, c.given) for c in changes] == [("AdamW betas[0]", 0.95)]
    assert network.optimizer.param_groups[0]["betas"][0] == pytest.approx(0.95 ** 2, abs=1e-15)


def test_a_psrv_network_s_adam_is_set_and_restored_and_nesterov_is_left() -> None:
    network = Network([Dense(4), Output(2)], input_shape=(3,), updater=Adam(1e-3, beta1=0.9), seed=1)
    changes = momentum_for_workers(network, 4)
    assert [(c.name, c.given) for c in changes] == [("Adam beta1", 0.9)]
    assert network.updater.beta1 == pytest.approx(0.9 ** 4, abs=1e-15)
    x, y = np.ones((2, 3), np.float32), np.eye(2, dtype=np.float32)
    network.compute_update(x, y)  # the updater steps with it
    momentum_for_workers(network, 1)
    assert network.updater.beta1 == 0.9
    nesterov = Nesterov(0.1, momentum=0.9)
    assert momentum_for_workers(nesterov, 4) == [] and nesterov.momentum == 0.9


@pytest.mark.parametrize("workers", [0, -1, 2.0, True, None])
def test_a_worker_count_that_is_not_a_positive_int_is_refused(workers) -> None:
    with pytest.raises(ConfigError, match="workers must be an int >= 1"):
        momentum_for_workers(_two_groups(), workers)


def test_something_without_an_optimizer_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="expected a torch optimizer.*got dict"):
        momentum_for_workers({}, 2)


@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_the_master_refuses_a_scale_momentum_that_is_not_a_bool_on_the_driver(bad) -> None:
    from psrv.spark.driver.shared_training import SharedTrainingMaster
    from psrv.spark.errors import SparkConfigError

    assert SharedTrainingMaster().scale_momentum is True
    with pytest.raises(SparkConfigError, match=r"scale_momentum: expected True .* or False .*got"):
        SharedTrainingMaster(scale_momentum=bad)


def test_the_power_is_the_tasks_running_at_once_times_their_local_workers() -> None:
    from psrv.spark.driver.stepping import momentum_workers

    assert momentum_workers(True, partitions=4, parallelism=2, workers_per_node=1) == 2  # in two waves
    assert momentum_workers(True, partitions=2, parallelism=8, workers_per_node=3) == 6
    assert momentum_workers(False, partitions=8, parallelism=8, workers_per_node=2) == 1
