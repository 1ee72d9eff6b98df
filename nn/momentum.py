"""Momentum for N workers that share their steps: each worker's Adam beta1 becomes beta1 ** N.

One process's momentum forgets at ``beta`` per minibatch. When N workers share their steps, every
replica moves by the N workers' steps in the time each worker takes one, and each worker's momentum
still forgets at ``beta`` per step of its own: per minibatch the whole cluster has seen, it forgets N
times more slowly. The residual of threshold encoding holds steps back and releases them later, which
adds momentum of its own. Setting each worker's coefficient to ``beta ** N`` restores one process's
forgetting rate per minibatch. Measured with the quality harness (README, "How much a step learns"),
it is what closes most of the gap to one process at 4 and 8 workers.

Only the first-moment coefficient of adaptive optimizers changes: ``betas[0]`` of every torch param
group that has ``betas`` (Adam, AdamW, NAdam, RAdam, Adamax ...) and ``beta1`` of a ``psrv.nn`` updater.
Adam's step does not grow with beta1 (its bias correction normalizes the average), so the coefficient
changes how fast the step forgets and nothing else. SGD's momentum is left as given: there it also
sets the step's size (lr / (1 - momentum)), and lowering it measured worse in the harness. The
coefficient the user gave is kept beside it (``psrv_momentum_given`` in a param group, an attribute on an
updater), so a second call, with any worker count, starts from the given value again and ``workers=1``
restores it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psrv.nn.errors import ConfigError
from psrv.nn.updaters import Updater

__all__ = ["MomentumChange", "momentum_for_workers"]

#: where a torch param group keeps the coefficient its user gave
GIVEN_KEY = "psrv_momentum_given"


@dataclass(frozen=True)
class MomentumChange:
    """One coefficient set for ``workers`` workers: ``name`` (e.g. "Adam betas[0]"), given and now."""

    name: str
    given: float
    now: float


def momentum_for_workers(target: Any, workers: int) -> list[MomentumChange]:
    """Set the momentum of ``target`` (a torch optimizer, a network holding one as ``optimizer``, or a
    ``psrv.nn`` network or updater) to the given coefficient ``** workers``; returns what it set (empty
    where there is no first-moment coefficient to set: SGD, AdaGrad, RMSprop)."""
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


def _torch(optimizer: Any, workers: int) -> list[MomentumChange]:
    changes = []
    kind = type(optimizer).__name__
    for group in optimizer.param_groups:
        if isinstance(group.get("betas"), tuple | list):
            given = float(group.setdefault(GIVEN_KEY, float(group["betas"][0])))
            now = given ** workers
            group["betas"] = (now, *tuple(group["betas"])[1:])
            changes.append(MomentumChange(f"{kind} betas[0]", given, now))
    return changes


def _native(updater: Any, workers: int) -> list[MomentumChange]:
    value = getattr(updater, "beta1", None)
    if not isinstance(value, float):
        return []
    given = float(getattr(updater, "momentum_given", value))
    updater.momentum_given = given
    updater.beta1 = given ** workers
    return [MomentumChange(f"{type(updater).__name__} beta1", given, updater.beta1)]
