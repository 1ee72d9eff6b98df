"""Each updater against its textbook formula, step by step; schedules; state as a flat vector."""

from __future__ import annotations

import math

import numpy as np
import pytest
from psrv.nn import AdaGrad, Adam, ExponentialSchedule, FixedSchedule, Nesterov, RmsProp, Sgd, StepSchedule
from psrv.nn.errors import ConfigError
from psrv.nn.updaters import updater_from_config

N = 7


def _grads(steps: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=N) for _ in range(steps)]


def _run(updater, grads):
    state = np.zeros(updater.state_size(N))
    outs = []
    for t, g in enumerate(grads):
        out = np.empty(N)
        updater.compute(g, state, t, 0, out)
        outs.append(out)
    return outs, state


def test_sgd() -> None:
    grads = _grads()
    outs, _ = _run(Sgd(0.05), grads)
    for g, u in zip(grads, outs, strict=True):
        np.testing.assert_allclose(u, -0.05 * g)


def test_nesterov() -> None:
    grads, lr, mu = _grads(), 0.1, 0.9
    outs, state = _run(Nesterov(lr, momentum=mu), grads)
    v = np.zeros(N)
    for g, u in zip(grads, outs, strict=True):
        v_prev = v.copy()
        v = mu * v - lr * g
        np.testing.assert_allclose(u, -mu * v_prev + (1 + mu) * v)
    np.testing.assert_allclose(state, v)


def test_adam() -> None:
    grads, lr, b1, b2, eps = _grads(), 0.01, 0.8, 0.95, 1e-7
    outs, state = _run(Adam(lr, beta1=b1, beta2=b2, epsilon=eps), grads)
    m, v = np.zeros(N), np.zeros(N)
    for t, (g, u) in enumerate(zip(grads, outs, strict=True), start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1**t), v / (1 - b2**t)
        # the DL4J/Kingma "efficient" form equals the bias-corrected one up to where eps sits
        expected = -lr * math.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
        np.testing.assert_allclose(u, expected, rtol=1e-10)
        np.testing.assert_allclose(u, -lr * m_hat / (np.sqrt(v_hat) + eps), rtol=1e-4)
    np.testing.assert_allclose(state, np.concatenate([m, v]))


def test_adagrad() -> None:
    grads, lr, eps = _grads(), 0.1, 1e-6
    outs, state = _run(AdaGrad(lr, epsilon=eps), grads)
    h = np.zeros(N)
    for g, u in zip(grads, outs, strict=True):
        h += g * g
        np.testing.assert_allclose(u, -lr * g / (np.sqrt(h) + eps))
    np.testing.assert_allclose(state, h)


def test_rmsprop() -> None:
    grads, lr, d, eps = _grads(), 0.01, 0.9, 1e-8
    outs, state = _run(RmsProp(lr, decay=d, epsilon=eps), grads)
    r = np.zeros(N)
    for g, u in zip(grads, outs, strict=True):
        r = d * r + (1 - d) * g * g
        np.testing.assert_allclose(u, -lr * g / np.sqrt(r + eps))
    np.testing.assert_allclose(state, r)


def test_schedules() -> None:
    assert FixedSchedule(0.3).value_at(100, 5) == 0.3
    step = StepSchedule(0.1, decay_rate=0.5, step=10)
    assert [step.value_at(i, 0) for i in (0, 9, 10, 25)] == [0.1, 0.1, 0.05, 0.025]
    by_epoch = StepSchedule(0.1, decay_rate=0.5, step=2, unit="epoch")
    assert by_epoch.value_at(1000, 3) == 0.05
    exp = ExponentialSchedule(0.2, gamma=0.9)
    assert exp.value_at(3, 0) == pytest.approx(0.2 * 0.9**3)
    # the schedule drives the updater
    upd = Sgd(StepSchedule(1.0, decay_rate=0.1, step=1))
    out = np.empty(1)
    upd.compute(np.ones(1), np.empty(0), 2, 0, out)
    assert out[0] == pytest.approx(-0.01)


@pytest.mark.parametrize(
    "updater",
    [Sgd(0.1), Nesterov(0.05, 0.8), Adam(ExponentialSchedule(1e-3, 0.99)), AdaGrad(0.2),
     RmsProp(StepSchedule(1e-3, 0.5, 3, unit="epoch"), decay=0.9)],
)
def test_config_round_trip(updater) -> None:
    import json

    config = json.loads(json.dumps(updater.get_config()))
    again = updater_from_config(config)
    assert type(again) is type(updater)
    assert again.get_config() == updater.get_config()
    g = _grads(3)
    np.testing.assert_array_equal(np.array(_run(updater, g)[0]), np.array(_run(again, g)[0]))


@pytest.mark.parametrize(
    "bad",
    [{"type": "nope"}, {"type": "adam", "beta1": 1.5}, {"type": "sgd", "learning_rate": -1},
     {"type": "sgd", "learning_rate": {"type": "step", "initial": 0.1}}, {"type": "sgd", "lr": 0.1}],
)
def test_bad_updater_config(bad) -> None:
    with pytest.raises(ConfigError):
        updater_from_config(bad)
