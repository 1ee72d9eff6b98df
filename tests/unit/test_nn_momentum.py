"""Momentum for N sharing workers: Adam's beta1 and SGD's and RMSprop's momentum become the given one
** N (their lr scaled so a gradient's step keeps its size), always from the given value."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from psrv.nn import Adam, Dense, Nesterov, Network, Output
from psrv.nn.errors import ConfigError
from psrv.nn.momentum import GIVEN_KEY, LR_FACTOR_KEY, lr_factor, momentum_for_workers

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


@pytest.mark.parametrize("kind", ["adam", "sgd", "rmsprop", "rmsprop-centered"])
def test_the_scaled_optimizer_steps_as_torch_does_with_the_scaled_values_given(kind: str) -> None:
    torch.manual_seed(0)
    module = torch.nn.Linear(4, 3)
    twin = copy.deepcopy(module)
    if kind == "adam":
        scaled = torch.optim.Adam(module.parameters(), lr=1e-2)
        momentum_for_workers(scaled, 3)
        reference = torch.optim.Adam(twin.parameters(), lr=1e-2, betas=(0.9 ** 3, 0.999))
    elif kind.startswith("rmsprop"):
        centered = kind.endswith("centered")
        scaled = torch.optim.RMSprop(module.parameters(), lr=1e-3, momentum=0.9, centered=centered)
        momentum_for_workers(scaled, 3)
        reference = torch.optim.RMSprop(twin.parameters(), lr=1e-3 * lr_factor(0.9, 3), momentum=0.9 ** 3,
                                        centered=centered)
    else:
        scaled = torch.optim.SGD(module.parameters(), lr=1e-2, momentum=0.9, nesterov=True)
        momentum_for_workers(scaled, 3)
        reference = torch.optim.SGD(twin.parameters(), lr=1e-2 * lr_factor(0.9, 3), momentum=0.9 ** 3,
                                    nesterov=True)
    x = torch.randn(16, 4)
    for _ in range(5):
        for m, opt in ((module, scaled), (twin, reference)):
            opt.zero_grad()
            m(x).pow(2).mean().backward()
            opt.step()
    for p, q in zip(module.parameters(), twin.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("make", [lambda ps: torch.optim.SGD(ps, lr=0.1),
                                  lambda ps: torch.optim.RMSprop(ps, lr=0.1),
                                  lambda ps: torch.optim.Adagrad(ps, lr=0.1)])
def test_optimizers_without_momentum_to_scale_are_left_as_given(make) -> None:
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


def test_a_psrv_network_s_adam_is_set_and_restored() -> None:
    network = Network([Dense(4), Output(2)], input_shape=(3,), updater=Adam(1e-3, beta1=0.9), seed=1)
    changes = momentum_for_workers(network, 4)
    assert [(c.name, c.given) for c in changes] == [("Adam beta1", 0.9)]
    assert network.updater.beta1 == pytest.approx(0.9 ** 4, abs=1e-15)
    x, y = np.ones((2, 3), np.float32), np.eye(2, dtype=np.float32)
    network.compute_update(x, y)  # the updater steps with it
    momentum_for_workers(network, 1)
    assert network.updater.beta1 == 0.9


# --- SGD with momentum: momentum ** N, and the lr scaled so the step keeps its size -------------------

def _sgd(lr: float = 0.05, **options) -> torch.optim.SGD:
    return torch.optim.SGD(torch.nn.Linear(3, 2).parameters(), lr=lr, **options)


@pytest.mark.parametrize("options", [{"momentum": 0.9}, {"momentum": 0.8, "nesterov": True},
                                     {"momentum": 0.9, "dampening": 0.5}])
def test_sgd_gets_momentum_to_the_power_of_the_workers_and_its_lr_scaled(options) -> None:
    optimizer = _sgd(**options)
    given = options["momentum"]
    changes = momentum_for_workers(optimizer, 4)
    group = optimizer.param_groups[0]
    factor = (1 - given ** 4) / (1 - given)
    assert group["momentum"] == pytest.approx(given ** 4, abs=1e-15)
    assert group["lr"] == pytest.approx(0.05 * factor, rel=1e-15)
    assert lr_factor(given, 4) == pytest.approx(factor, rel=1e-15)
    assert [(c.name, c.given) for c in changes] == [("SGD momentum", given), ("SGD lr", 0.05)]
    assert group["dampening"] == options.get("dampening", 0)
    assert group["nesterov"] == options.get("nesterov", False)


def test_sgd_a_second_call_starts_from_the_given_values_and_one_worker_restores_them_exactly() -> None:
    optimizer = _sgd(lr=0.01, momentum=0.9)
    momentum_for_workers(optimizer, 8)
    momentum_for_workers(optimizer, 2)  # not from the 8-worker values
    group = optimizer.param_groups[0]
    assert group["momentum"] == pytest.approx(0.81, abs=1e-15)
    assert group["lr"] == pytest.approx(0.019, rel=1e-14)
    momentum_for_workers(optimizer, 1)
    assert group["momentum"] == 0.9 and group["lr"] == 0.01  # bit for bit


def test_sgd_an_lr_scheduler_that_multiplies_in_place_keeps_its_effect() -> None:
    """StepLR halves the lr each step: after two steps at 4 workers, one worker's lr is the given one / 4."""
    optimizer = _sgd(lr=0.08, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    momentum_for_workers(optimizer, 4)
    for _ in range(2):
        optimizer.step()
        scheduler.step()
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.02 * lr_factor(0.9, 4), rel=1e-14)
    changes = momentum_for_workers(optimizer, 1)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.02, rel=1e-14)
    assert changes[1].given == pytest.approx(0.02, rel=1e-14)


def test_sgd_a_tensor_lr_stays_the_same_tensor() -> None:
    optimizer = _sgd(lr=torch.tensor(0.05), momentum=0.9)
    lr = optimizer.param_groups[0]["lr"]
    momentum_for_workers(optimizer, 2)
    assert optimizer.param_groups[0]["lr"] is lr and float(lr) == pytest.approx(0.05 * 1.9, rel=1e-6)


def test_sgd_the_given_values_travel_with_the_state_dict() -> None:
    optimizer = _sgd(lr=0.01, momentum=0.9)
    momentum_for_workers(optimizer, 4)
    again = _sgd(lr=0.01, momentum=0.9)
    again.load_state_dict(copy.deepcopy(optimizer.state_dict()))
    assert again.param_groups[0][GIVEN_KEY] == 0.9 and again.param_groups[0][LR_FACTOR_KEY][0] == 0.01
    momentum_for_workers(again, 1)
    assert again.param_groups[0]["momentum"] == 0.9 and again.param_groups[0]["lr"] == 0.01


def test_rmsprop_with_momentum_gets_it_to_the_power_of_the_workers_with_its_lr_scaled_and_restored() -> None:
    optimizer = torch.optim.RMSprop(torch.nn.Linear(3, 2).parameters(), lr=1e-3, momentum=0.8, alpha=0.95)
    changes = momentum_for_workers(optimizer, 4)
    group = optimizer.param_groups[0]
    assert [(c.name, c.given) for c in changes] == [("RMSprop momentum", 0.8), ("RMSprop lr", 1e-3)]
    assert group["momentum"] == pytest.approx(0.8 ** 4, abs=1e-15)
    assert group["lr"] == pytest.approx(1e-3 * (1 - 0.8 ** 4) / 0.2, rel=1e-14)
    assert group["alpha"] == 0.95  # its second moment's coefficient stays as given
    momentum_for_workers(optimizer, 1)
    assert group["momentum"] == 0.8 and group["lr"] == 1e-3  # bit for bit


@pytest.mark.parametrize(("make", "steps", "settled"), [
    (lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9), 400, [0.1, -0.2, 0.05]),
    (lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True), 400, [0.1, -0.2, 0.05]),
    # RMSprop normalizes the gradient: its step settles at lr * sign(g) / (1 - momentum)
    (lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9, eps=1e-12), 3000, [0.01, -0.01, 0.01]),
], ids=["sgd", "nesterov", "rmsprop"])
def test_scaled_moves_as_far_per_gradient_as_given_once_its_momentum_has_built_up(
        make, steps: int, settled: list[float]) -> None:
    """The property the lr factor is for: under a constant gradient g, the step with momentum ** 4 and
    the scaled lr settles at the size of the given optimizer's, lr * g / (1 - momentum) (SGD)."""
    last = []
    for workers in (1, 4):
        p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        optimizer = make([p])
        momentum_for_workers(optimizer, workers)
        for _ in range(steps):
            before = p.detach().clone()
            p.grad = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
            optimizer.step()
        last.append((p.detach() - before).numpy())
    np.testing.assert_allclose(last[1], last[0], rtol=1e-9)
    np.testing.assert_allclose(last[0], -np.array(settled), rtol=1e-9)


def test_a_psrv_nesterov_gets_momentum_to_the_power_and_its_lr_scaled_and_is_restored() -> None:
    network = Network([Dense(4), Output(2)], input_shape=(3,), updater=Nesterov(0.1, momentum=0.9), seed=1)
    reference = Nesterov(0.1 * lr_factor(0.9, 4), momentum=0.9 ** 4)
    changes = momentum_for_workers(network, 4)
    assert [(c.name, c.given) for c in changes] == [("Nesterov momentum", 0.9), ("Nesterov lr factor", 1.0)]
    updater = network.updater
    assert updater.momentum == pytest.approx(0.9 ** 4, abs=1e-15)
    assert updater.learning_rate(0, 0) == pytest.approx(reference.learning_rate(0, 0), rel=1e-15)
    grad = np.linspace(-1, 1, 6)
    mine, theirs = np.zeros(6), np.zeros(6)
    out_mine, out_theirs = np.empty(6), np.empty(6)
    for step in range(3):
        updater.compute(grad, mine, step, 0, out_mine)
        reference.compute(grad, theirs, step, 0, out_theirs)
    np.testing.assert_allclose(out_mine, out_theirs, rtol=1e-14)
    momentum_for_workers(network, 1)
    assert updater.momentum == 0.9 and updater.learning_rate(0, 0) == 0.1
    assert momentum_for_workers(Nesterov(0.1, momentum=0.0), 4) == []


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
