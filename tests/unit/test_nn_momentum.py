"""Momentum for N sharing workers: Adam's beta1 and SGD's and RMSprop's momentum become the given one
** N (their lr scaled so a gradient's step keeps its size), always from the given value."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from psrv.nn import Adam, Dense, Nesterov, Network, Output
from psrv.nn.errors import ConfigError
from psrv.nn.momentum import (
    GIVEN_KEY,
    LR_FACTOR_KEY,
    SQUARE_START_KEY,
    SQUARE_START_NAME,
    lr_factor,
    momentum_for_workers,
    start_square_averages,
)

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
        start_square_averages(reference)
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
    assert [(c.name, c.given, c.now) for c in changes][::2] == [
        ("RMSprop momentum", 0.8, 0.8 ** 4), (f"RMSprop {SQUARE_START_NAME}", 0.0, 1.0)]
    assert changes[1].name == "RMSprop lr"
    assert group["momentum"] == pytest.approx(0.8 ** 4, abs=1e-15)
    assert group["lr"] == pytest.approx(1e-3 * (1 - 0.8 ** 4) / 0.2, rel=1e-14)
    assert group["alpha"] == 0.95  # its second moment's coefficient stays as given
    assert momentum_for_workers(optimizer, 1)[-1].now == 0.0  # torch's own start again
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


# --- RMSprop with momentum: the square average starts at the first gradient's square -----------------

def _rmsprop(module: torch.nn.Module, **options) -> torch.optim.RMSprop:
    return torch.optim.RMSprop(module.parameters(), **{"lr": 1e-3, "momentum": 0.9, **options})


def _loss_step(module: torch.nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> None:
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    optimizer.zero_grad()
    module(x).pow(2).mean().backward()
    optimizer.step()


def _linear() -> torch.nn.Module:
    torch.manual_seed(3)
    return torch.nn.Linear(4, 3).double()


def test_rmsprop_s_first_step_divides_by_the_gradient_s_own_size_not_by_a_tenth_of_it() -> None:
    """torch's zero start makes the first square average (1 - alpha) g^2, and the step lr g /
    (sqrt(0.01) |g|): 10x the settled size. Started for 4 workers, the average is g^2 exactly and the
    first step is lr' g / (|g| + eps), lr' the scaled lr."""
    module = _linear()
    optimizer = _rmsprop(module)
    momentum_for_workers(optimizer, 4)
    before = [p.detach().clone() for p in module.parameters()]
    x = torch.randn(8, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    module(x).pow(2).mean().backward()
    grads = [p.grad.detach().clone() for p in module.parameters()]
    optimizer.step()
    lr = optimizer.param_groups[0]["lr"]
    for p, b, g in zip(module.parameters(), before, grads, strict=True):
        assert torch.equal(optimizer.state[p]["square_avg"], g * g)
        torch.testing.assert_close(p.detach(), b - lr * g / (g.abs() + 1e-8), rtol=1e-15, atol=0)


@pytest.mark.parametrize("centered", [False, True])
def test_the_started_state_is_the_one_torch_builds_but_for_the_square_average(centered: bool) -> None:
    """Keys, shapes, dtypes and devices as torch's own start, so checkpoints, updater_state and
    load_state_dict see nothing new; only ``square_avg`` differs."""
    a, b = _linear(), _linear()
    started, plain = _rmsprop(a, centered=centered), _rmsprop(b, centered=centered)
    start_square_averages(started)
    for module, optimizer in ((a, started), (b, plain)):
        _loss_step(module, optimizer, 0)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        mine, theirs = started.state[p], plain.state[q]
        assert sorted(mine) == sorted(theirs)
        for key in theirs:
            assert (mine[key].shape, mine[key].dtype, mine[key].device) == \
                (theirs[key].shape, theirs[key].dtype, theirs[key].device), key
        assert torch.equal(mine["step"], theirs["step"])
        assert not torch.equal(mine["square_avg"], theirs["square_avg"])
    again = _rmsprop(_linear(), centered=centered)
    again.load_state_dict(copy.deepcopy(started.state_dict()))  # torch takes it as its own


def test_one_worker_is_torch_s_own_start_bit_for_bit() -> None:
    a, b = _linear(), _linear()
    set_back, plain = _rmsprop(a), _rmsprop(b)
    momentum_for_workers(set_back, 4)
    assert getattr(set_back, SQUARE_START_KEY) is not None
    momentum_for_workers(set_back, 1)
    assert getattr(set_back, SQUARE_START_KEY) is None and not set_back._optimizer_step_pre_hooks
    for seed in range(3):
        for module, optimizer in ((a, set_back), (b, plain)):
            _loss_step(module, optimizer, seed)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_state_already_there_is_never_started_again() -> None:
    """A resumed worker (state loaded) or a network carried over from an earlier fit: no hook, and it
    steps as an optimizer with the same values and state, bit for bit."""
    first = _linear()
    earlier = _rmsprop(first)
    _loss_step(first, earlier, 0)
    a, b = copy.deepcopy(first), copy.deepcopy(first)
    resumed, reference = _rmsprop(a), _rmsprop(b, lr=1e-3 * lr_factor(0.9, 4), momentum=0.9 ** 4)
    for optimizer in (resumed, reference):
        optimizer.load_state_dict(copy.deepcopy(earlier.state_dict()))
    reference.param_groups[0].update(lr=1e-3 * lr_factor(0.9, 4), momentum=0.9 ** 4)
    changes = momentum_for_workers(resumed, 4)
    assert changes[-1].now == 1.0 and getattr(resumed, SQUARE_START_KEY, None) is None  # none to start
    for seed in (1, 2):
        for module, optimizer in ((a, resumed), (b, reference)):
            _loss_step(module, optimizer, seed)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_parameter_without_a_gradient_yet_is_started_at_its_first_one_and_then_the_hook_is_idle() -> None:
    first, second = torch.nn.Linear(4, 3).double(), torch.nn.Linear(3, 2).double()
    optimizer = torch.optim.RMSprop([*first.parameters(), *second.parameters()], lr=1e-3, momentum=0.9)
    momentum_for_workers(optimizer, 2)
    x = torch.randn(5, 4, dtype=torch.float64)
    first(x).sum().backward()  # `second` has no gradient yet: torch skips it, and so does the start
    optimizer.step()
    (hook,) = optimizer._optimizer_step_pre_hooks.values()
    assert not hook.done and not any(optimizer.state.get(p) for p in second.parameters())
    filled = {p: optimizer.state[p]["square_avg"].clone() for p in first.parameters()}
    optimizer.zero_grad()
    second(first(x)).sum().backward()
    grads = {p: p.grad.detach().clone() for p in [*first.parameters(), *second.parameters()]}
    optimizer.step()
    assert hook.done
    for p in second.parameters():
        assert torch.equal(optimizer.state[p]["square_avg"], grads[p] * grads[p])
    for p, average in filled.items():  # those with state went on as torch's own
        expected = average * 0.99 + 0.01 * grads[p] * grads[p]
        torch.testing.assert_close(optimizer.state[p]["square_avg"], expected, rtol=1e-14, atol=0)


def test_rmsprop_without_momentum_and_other_optimizers_get_no_start() -> None:
    for optimizer in (torch.optim.RMSprop(_linear().parameters(), lr=1e-3), _sgd(momentum=0.9),
                      _two_groups()):
        assert all(c.name != f"{type(optimizer).__name__} {SQUARE_START_NAME}"
                   for c in momentum_for_workers(optimizer, 4))
        assert getattr(optimizer, SQUARE_START_KEY, None) is None and not optimizer._optimizer_step_pre_hooks


def test_a_torch_network_s_started_state_round_trips_through_updater_state() -> None:
    """Save and resume: a network given another's updater state (which creates its state with a zero
    step first) goes on as the other does, bit for bit; the start acts once, never on a resume."""
    def network() -> TorchNetwork:
        torch.manual_seed(5)
        return TorchNetwork(torch.nn.Linear(4, 3), torch.nn.CrossEntropyLoss(), (4,),
                            optimizer=lambda ps: torch.optim.RMSprop(ps, lr=1e-3, momentum=0.9))

    rng = np.random.default_rng(0)
    onehot = np.eye(3, dtype=np.float32)
    batches = [(rng.normal(size=(8, 4)).astype(np.float32), onehot[rng.integers(0, 3, 8)]) for _ in range(4)]
    saved, resumed = network(), network()
    for net in (saved, resumed):
        momentum_for_workers(net, 4)
    for x, y in batches[:2]:
        saved.apply_update(saved.compute_update(x, y)[0])
    resumed.set_params(saved.params)
    resumed.set_updater_state(saved.updater_state)
    np.testing.assert_array_equal(resumed.updater_state, saved.updater_state)
    for x, y in batches[2:]:
        for net in (saved, resumed):
            net.apply_update(net.compute_update(x, y)[0])
    np.testing.assert_array_equal(resumed.params, saved.params)
