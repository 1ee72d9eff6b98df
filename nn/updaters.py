"""Updaters turn a gradient into the step to ADD to the parameters, on flat vectors.

Each updater keeps its state (momentum, moment estimates ...) in one flat vector, so a joining worker
can download it and a master can average it. The learning rate follows a schedule of the iteration or
epoch (fixed, step, exponential), as DL4J's ISchedule does.

Formulas (g = gradient, lr = scheduled learning rate, t = iteration + 1):
  Sgd:       u = -lr g
  Nesterov:  v' = mu v - lr g;  u = -mu v + (1 + mu) v'          (DL4J's Nesterovs form)
  Adam:      m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2;
             u = -lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps)
  AdaGrad:   h = h + g^2;  u = -lr g / (sqrt(h) + eps)
  RmsProp:   r = d r + (1-d) g^2;  u = -lr g / sqrt(r + eps)
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import numpy as np
from psrv.nn.errors import ConfigError
from psrv.nn.named import build_named

# --- learning-rate schedules -----------------------------------------------------------------------


class Schedule:
    kind: ClassVar[str] = ""

    def value_at(self, iteration: int, epoch: int) -> float:
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        raise NotImplementedError


def _unit(unit: str) -> str:
    if unit not in ("iteration", "epoch"):
        raise ConfigError(f"schedule unit must be 'iteration' or 'epoch', got {unit!r}")
    return unit


def _positive(value: Any, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what} must be a number, got {value!r}") from exc
    if not math.isfinite(v) or v <= 0:
        raise ConfigError(f"{what} must be a finite number > 0, got {value!r}")
    return v


class FixedSchedule(Schedule):
    kind = "fixed"

    def __init__(self, value: float) -> None:
        self.value = _positive(value, "learning rate")

    def value_at(self, iteration: int, epoch: int) -> float:
        return self.value

    def get_config(self) -> dict[str, Any]:
        return {"type": self.kind, "value": self.value}


class StepSchedule(Schedule):
    """value = initial * decay_rate ** floor(t / step), t the iteration or epoch."""

    kind = "step"

    def __init__(self, initial: float, decay_rate: float, step: int, unit: str = "iteration") -> None:
        self.initial = _positive(initial, "initial learning rate")
        self.decay_rate = _positive(decay_rate, "decay_rate")
        self.step = int(_positive(step, "step"))
        self.unit = _unit(unit)

    def value_at(self, iteration: int, epoch: int) -> float:
        t = iteration if self.unit == "iteration" else epoch
        return self.initial * self.decay_rate ** (t // self.step)

    def get_config(self) -> dict[str, Any]:
        return {"type": self.kind, "initial": self.initial, "decay_rate": self.decay_rate,
                "step": self.step, "unit": self.unit}


class ExponentialSchedule(Schedule):
    """value = initial * gamma ** t, t the iteration or epoch."""

    kind = "exponential"

    def __init__(self, initial: float, gamma: float, unit: str = "iteration") -> None:
        self.initial = _positive(initial, "initial learning rate")
        self.gamma = _positive(gamma, "gamma")
        self.unit = _unit(unit)

    def value_at(self, iteration: int, epoch: int) -> float:
        t = iteration if self.unit == "iteration" else epoch
        return self.initial * self.gamma**t

    def get_config(self) -> dict[str, Any]:
        return {"type": self.kind, "initial": self.initial, "gamma": self.gamma, "unit": self.unit}


_SCHEDULES: dict[str, type[Schedule]] = {
    c.kind: c for c in (FixedSchedule, StepSchedule, ExponentialSchedule)
}


def schedule_from_config(spec: Any) -> Schedule:
    """A schedule from a number (fixed), a Schedule, or a config dict."""
    if isinstance(spec, Schedule):
        return spec
    if isinstance(spec, int | float) and not isinstance(spec, bool):
        return FixedSchedule(spec)
    if isinstance(spec, dict) and spec.get("type") in _SCHEDULES:
        kwargs = {k: v for k, v in spec.items() if k != "type"}
        try:
            return _SCHEDULES[spec["type"]](**kwargs)
        except TypeError as exc:
            raise ConfigError(f"bad schedule options {spec!r}: {exc}") from exc
    raise ConfigError(f"learning rate must be a number, a Schedule or a schedule dict, got {spec!r}")


# --- updaters --------------------------------------------------------------------------------------


class Updater:
    kind: ClassVar[str] = ""
    #: state vectors per parameter (state size = slots * num_params)
    slots: ClassVar[int] = 0
    #: what the schedule's value is multiplied by: 1, except on a sharing worker whose momentum was
    #: lowered for the workers sharing (psrv.nn.momentum), which keeps the step's size with it
    lr_factor: float = 1.0

    def __init__(self, learning_rate: float | Schedule | dict = 0.1) -> None:
        self.schedule = schedule_from_config(learning_rate)

    def state_size(self, num_params: int) -> int:
        return self.slots * num_params

    def learning_rate(self, iteration: int, epoch: int) -> float:
        return self.schedule.value_at(iteration, epoch) * self.lr_factor

    def compute(
        self, grad: np.ndarray, state: np.ndarray, iteration: int, epoch: int, out: np.ndarray
    ) -> None:
        """Write the step to add into ``out`` and advance ``state`` (both flat, like ``grad``)."""
        raise NotImplementedError

    def _options(self) -> dict[str, Any]:
        return {}

    def get_config(self) -> dict[str, Any]:
        lr = self.schedule
        lr_config = lr.value if isinstance(lr, FixedSchedule) else lr.get_config()
        return {"type": self.kind, "learning_rate": lr_config, **self._options()}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items() if k != "type")
        return f"{type(self).__name__}({args})"


class Sgd(Updater):
    kind = "sgd"

    def compute(self, grad, state, iteration, epoch, out):
        np.multiply(grad, -self.learning_rate(iteration, epoch), out=out)


class Nesterov(Updater):
    kind = "nesterov"
    slots = 1

    def __init__(self, learning_rate: float | Schedule | dict = 0.1, momentum: float = 0.9) -> None:
        super().__init__(learning_rate)
        if not 0.0 <= float(momentum) < 1.0:
            raise ConfigError(f"Nesterov momentum must be in [0, 1), got {momentum!r}")
        self.momentum = float(momentum)

    def compute(self, grad, state, iteration, epoch, out):
        mu, lr = self.momentum, self.learning_rate(iteration, epoch)
        v = state
        np.multiply(v, -mu, out=out)             # out = -mu v_prev
        v *= mu
        v -= lr * grad                           # v = mu v_prev - lr g
        out += (1.0 + mu) * v

    def _options(self):
        return {"momentum": self.momentum}


class Adam(Updater):
    kind = "adam"
    slots = 2

    def __init__(
        self,
        learning_rate: float | Schedule | dict = 1e-3,
        beta1: float = 0.9,
        beta2: float = 0.999,
        epsilon: float = 1e-8,
    ) -> None:
        super().__init__(learning_rate)
        for name, b in (("beta1", beta1), ("beta2", beta2)):
            if not 0.0 <= float(b) < 1.0:
                raise ConfigError(f"Adam {name} must be in [0, 1), got {b!r}")
        self.beta1, self.beta2 = float(beta1), float(beta2)
        self.epsilon = _positive(epsilon, "Adam epsilon")

    def compute(self, grad, state, iteration, epoch, out):
        n = grad.size
        m, v = state[:n], state[n:]
        b1, b2, t = self.beta1, self.beta2, iteration + 1
        m *= b1
        m += (1.0 - b1) * grad
        v *= b2
        np.multiply(grad, grad, out=out)
        out *= 1.0 - b2
        v += out
        alpha = self.learning_rate(iteration, epoch) * math.sqrt(1.0 - b2**t) / (1.0 - b1**t)
        np.sqrt(v, out=out)
        out += self.epsilon
        np.divide(m, out, out=out)
        out *= -alpha

    def _options(self):
        return {"beta1": self.beta1, "beta2": self.beta2, "epsilon": self.epsilon}


class AdaGrad(Updater):
    kind = "adagrad"
    slots = 1

    def __init__(self, learning_rate: float | Schedule | dict = 0.1, epsilon: float = 1e-6) -> None:
        super().__init__(learning_rate)
        self.epsilon = _positive(epsilon, "AdaGrad epsilon")

    def compute(self, grad, state, iteration, epoch, out):
        h = state
        np.multiply(grad, grad, out=out)
        h += out
        np.sqrt(h, out=out)
        out += self.epsilon
        np.divide(grad, out, out=out)
        out *= -self.learning_rate(iteration, epoch)

    def _options(self):
        return {"epsilon": self.epsilon}


class RmsProp(Updater):
    kind = "rmsprop"
    slots = 1

    def __init__(
        self, learning_rate: float | Schedule | dict = 1e-3, decay: float = 0.95, epsilon: float = 1e-8
    ) -> None:
        super().__init__(learning_rate)
        if not 0.0 <= float(decay) < 1.0:
            raise ConfigError(f"RmsProp decay must be in [0, 1), got {decay!r}")
        self.decay = float(decay)
        self.epsilon = _positive(epsilon, "RmsProp epsilon")

    def compute(self, grad, state, iteration, epoch, out):
        r, d = state, self.decay
        r *= d
        np.multiply(grad, grad, out=out)
        out *= 1.0 - d
        r += out
        np.add(r, self.epsilon, out=out)
        np.sqrt(out, out=out)
        np.divide(grad, out, out=out)
        out *= -self.learning_rate(iteration, epoch)

    def _options(self):
        return {"decay": self.decay, "epsilon": self.epsilon}


UPDATER_TYPES: dict[str, type[Updater]] = {c.kind: c for c in (Sgd, Nesterov, Adam, AdaGrad, RmsProp)}


def updater_from_config(config: dict[str, Any] | Updater) -> Updater:
    if isinstance(config, Updater):
        return config
    if not isinstance(config, dict) or config.get("type") not in UPDATER_TYPES:
        raise ConfigError(f"unknown updater {config!r}; expected a dict with type in {sorted(UPDATER_TYPES)}")
    options = {k: v for k, v in config.items() if k != "type"}
    return build_named(UPDATER_TYPES, config["type"], options, "updater")


__all__ = [
    "AdaGrad",
    "Adam",
    "ExponentialSchedule",
    "FixedSchedule",
    "Nesterov",
    "RmsProp",
    "Schedule",
    "Sgd",
    "StepSchedule",
    "UPDATER_TYPES",
    "Updater",
    "schedule_from_config",
    "updater_from_config",
]
