"""Momentum for N workers that share their steps: each worker's momentum becomes the given one ** N.

One process's momentum forgets at ``beta`` per minibatch. When N workers share their steps, every
replica moves by the N workers' steps in the time each worker takes one, and each worker's momentum
still forgets at ``beta`` per step of its own: per minibatch the whole cluster has seen, it forgets N
times more slowly. The residual of threshold encoding holds steps back and releases them later, which
adds momentum of its own. Setting each worker's coefficient to ``beta ** N`` restores one process's
forgetting rate per minibatch. Measured with the quality harness (README, "How much a step learns"),
it is what closes most of the gap to one process at 4 and 8 workers.

Adaptive optimizers: the first-moment coefficient, ``betas[0]`` of every torch param group that has
``betas`` (Adam, AdamW, NAdam, RAdam, Adamax ...) and ``beta1`` of a ``psrv.nn`` ``Adam``. Adam's step
does not grow with beta1 (its bias correction normalizes the average), so nothing else changes.

SGD with momentum (torch's ``SGD``, plain or Nesterov, and ``psrv.nn``'s ``Nesterov``) and torch's
``RMSprop`` with momentum: there the momentum also sets the step's size, ``lr / (1 - momentum)`` times
the (for RMSprop: normalized) gradient once the momentum has built up. Lowering the momentum alone
shrinks every step (it lost up to 19 points in the harness), so the learning rate is scaled with it,
by ``(1 - momentum ** N) / (1 - momentum)``: each minibatch then moves the model as far as in one
process, and its momentum forgets as fast. Optimizers with neither (plain SGD, AdaGrad, RMSprop without
momentum) are left as given.

What the user gave is kept beside it (``psrv_momentum_given`` and ``psrv_lr_factor`` in a torch param
group; attributes on a ``psrv.nn`` updater), so a second call, with any worker count, starts from the
given values again and ``workers=1`` restores them. The learning rate is kept as a factor, so a torch LR
scheduler that multiplies ``lr`` in place (StepLR, ExponentialLR, MultiStepLR ...) keeps its effect; one
that sets ``lr`` from the values it saw when built (LambdaLR, OneCycleLR) overrides the factor unless it
is built after this call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psrv.nn.errors import ConfigError
from psrv.nn.updaters import Updater

__all__ = ["MomentumChange", "lr_factor", "momentum_for_workers"]

#: where a torch param group keeps the coefficient its user gave
GIVEN_KEY = "psrv_momentum_given"
#: where a torch SGD or RMSprop param group keeps its learning rate as given, as set, and the factor
#: between them
LR_FACTOR_KEY = "psrv_lr_factor"


@dataclass(frozen=True)
class MomentumChange:
    """One coefficient set for ``workers`` workers: ``name`` (e.g. "Adam betas[0]"), given and now."""

    name: str
    given: float
    now: float


def momentum_for_workers(target: Any, workers: int) -> list[MomentumChange]:
    """Set the momentum of ``target`` (a torch optimizer, a network holding one as ``optimizer``, or a
    ``psrv.nn`` network or updater) to the given coefficient ``** workers`` (with SGD's learning rate
    scaled to keep its step size, and RMSprop's with momentum); returns what it set (empty where there
    is no momentum to set: plain SGD, AdaGrad, RMSprop without momentum)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError(f"momentum_for_workers: workers must be an int >= 1, got {workers!r}")
    updater = getattr(target, "updater", target)  # a psrv.nn network's, or the updater itself
    if isinstance(updater, Updater):
        return _native(updater, workers)
    optimizer = target if hasattr(target, "param_groups") else getattr(target, "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "param_groups"):
        raise ConfigError(
            f"momentum_for_workers: expected a torch optimizer, a network with one, or a psrv.nn network "
            f"or updater, got {type(target).__name__}")
    return _torch(optimizer, workers)


def lr_factor(momentum: float, workers: int) -> float:
    """What SGD's learning rate is multiplied by when its ``momentum`` becomes ``momentum ** workers``:
    ``(1 - momentum ** workers) / (1 - momentum)``, so that ``lr / (1 - momentum)``, the step a
    gradient makes once the momentum has built up, stays as given."""
    return (1.0 - momentum ** workers) / (1.0 - momentum)


def _torch(optimizer: Any, workers: int) -> list[MomentumChange]:
    changes = []
    kind = type(optimizer).__name__
    for group in optimizer.param_groups:
        if isinstance(group.get("betas"), tuple | list):
            given = float(group.setdefault(GIVEN_KEY, float(group["betas"][0])))
            now = given ** workers
            group["betas"] = (now, *tuple(group["betas"])[1:])
            changes.append(MomentumChange(f"{kind} betas[0]", given, now))
        elif "dampening" in group or "centered" in group:  # SGD's groups, RMSprop's
            changes.extend(_torch_heavy_ball(kind, group, workers))
    return changes


def _torch_heavy_ball(kind: str, group: dict[str, Any], workers: int) -> list[MomentumChange]:
    """An SGD param group (it alone has ``dampening``) or an RMSprop one (``centered``), whose momentum
    buffer is ``momentum * buffer + step direction`` and moves the parameters by ``lr * buffer``:
    momentum ** workers, the lr scaled to match. No momentum is left untouched, and so is a momentum of
    1 or more, which torch takes but whose step has no finite size to keep."""
    given = float(group.get(GIVEN_KEY, group["momentum"]))
    if not 0.0 < given < 1.0:
        return []
    group[GIVEN_KEY] = given
    lr = float(group["lr"])
    unscaled, was_set, before = group.get(LR_FACTOR_KEY, (lr, lr, 1.0))
    # the lr as given: exactly, unless something (an LR scheduler) changed it since it was scaled
    given_lr = unscaled if lr == was_set else lr / before
    factor = lr_factor(given, workers)
    now = given_lr * factor  # exactly given_lr when factor is 1
    group["momentum"] = given ** workers
    if hasattr(group["lr"], "fill_"):  # a tensor lr (capturable, fused) stays the same tensor
        group["lr"].fill_(now)
    else:
        group["lr"] = now
    group[LR_FACTOR_KEY] = (given_lr, float(group["lr"]), factor)
    return [MomentumChange(f"{kind} momentum", given, group["momentum"]),
            MomentumChange(f"{kind} lr", given_lr, float(group["lr"]))]


def _native(updater: Any, workers: int) -> list[MomentumChange]:
    if isinstance(getattr(updater, "beta1", None), float):
        given = float(getattr(updater, "momentum_given", updater.beta1))
        updater.momentum_given = given
        updater.beta1 = given ** workers
        return [MomentumChange(f"{type(updater).__name__} beta1", given, updater.beta1)]
    if isinstance(getattr(updater, "momentum", None), float):  # Nesterov: its lr scaled as SGD's
        given = float(getattr(updater, "momentum_given", updater.momentum))
        if given <= 0.0:
            return []
        updater.momentum_given = given
        updater.momentum = given ** workers
        updater.lr_factor = lr_factor(given, workers)
        name = type(updater).__name__
        return [MomentumChange(f"{name} momentum", given, updater.momentum),
                MomentumChange(f"{name} lr factor", 1.0, updater.lr_factor)]
    return []
