"""Momentum for N workers that share their steps: each worker's momentum becomes the given one ** N
(and RMSprop's square average starts at the first gradient's square, not at zero).

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

RMSprop's square average (torch's ``RMSprop`` with momentum): torch starts it at zero and
does not correct for that, so a step is inflated by up to ``1 / sqrt(1 - alpha ** t)`` (10x at the first
step with alpha 0.99) until the average has filled, about ``1 / (1 - alpha)`` steps. A worker counts only
its own steps, so with N workers that inflated start lasts N times as many of the cluster's minibatches,
on top of N steps taken from one point. For more than one worker, each parameter's square average starts
at its first gradient's square instead (what Adam's bias correction gives at its first step), through a
step pre-hook that acts only on parameters with no optimizer state yet and is idle once every one has
some. A state loaded or carried over from an earlier fit is never touched. In the quality harness it
took RMSprop on the 1 M-parameter MLP at 8 workers from 6.0 points behind one process to 2.6, the other
RMSprop rows within noise; starting at the inflation one process has at the same count of minibatches
(not kept) gave 3.4. RMSprop without momentum keeps torch's start: nothing scales its step for the
workers, and there the inflated start was worth up to 23.5 points (on the small CNN at 8 workers).

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

__all__ = ["MomentumChange", "lr_factor", "momentum_for_workers", "start_square_averages"]

#: where a torch param group keeps the coefficient its user gave
GIVEN_KEY = "psrv_momentum_given"
#: where a torch SGD or RMSprop param group keeps its learning rate as given, as set, and the factor
#: between them
LR_FACTOR_KEY = "psrv_lr_factor"
#: the attribute of a torch optimizer that holds the handle of its square-average start hook
SQUARE_START_KEY = "psrv_square_start"
#: the name of the square average's start in what momentum_for_workers returns: given 0 (zero), now 1
#: (the first gradient's square)
SQUARE_START_NAME = "square average's start, x the first gradient's square"


@dataclass(frozen=True)
class MomentumChange:
    """One coefficient set for ``workers`` workers: ``name`` (e.g. "Adam betas[0]"), given and now."""

    name: str
    given: float
    now: float


def momentum_for_workers(target: Any, workers: int) -> list[MomentumChange]:
    """Set the momentum of ``target`` (a torch optimizer, a network holding one as ``optimizer``, or a
    ``psrv.nn`` network or updater) to the given coefficient ``** workers`` (with SGD's learning rate
    scaled to keep its step size, and RMSprop's with momentum; RMSprop's square average starts at the
    first gradient's square); returns what it set (empty where there is no momentum to set: plain SGD,
    AdaGrad, RMSprop without momentum)."""
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
    if _square_average_groups(optimizer):
        started = start_square_averages(optimizer, workers > 1)
        changes.append(MomentumChange(f"{kind} {SQUARE_START_NAME}", 0.0, 1.0 if started else 0.0))
    return changes


def _square_average_groups(optimizer: Any) -> list[dict[str, Any]]:
    """torch RMSprop's param groups with momentum (``alpha`` and ``centered`` are RMSprop's alone)."""
    return [g for g in optimizer.param_groups if "alpha" in g and "centered" in g and g["momentum"] > 0]


def start_square_averages(optimizer: Any, on: bool = True) -> bool:
    """Have RMSprop's square average (with momentum) of every parameter without optimizer state start
    at its first gradient's square rather than at zero (``on``), or as torch starts it (``on=False``);
    returns whether the start is set. A step pre-hook, kept on the optimizer (``psrv_square_start``),
    acts before the step that would create the state; a state already there is never touched."""
    handle = getattr(optimizer, SQUARE_START_KEY, None)
    if handle is not None:
        handle.remove()
        setattr(optimizer, SQUARE_START_KEY, None)
    groups = _square_average_groups(optimizer)
    if not on or not groups:
        return False
    if any(not optimizer.state.get(p) for g in groups for p in g["params"]):
        setattr(optimizer, SQUARE_START_KEY, optimizer.register_step_pre_hook(_SquareStart()))
    return True


class _SquareStart:
    """The step pre-hook: the state torch's RMSprop would create, with ``square_avg`` at ``g * g``, so
    that its first update, ``alpha * avg + (1 - alpha) * g * g``, leaves ``g * g``. Once every
    parameter has state it does nothing (torch iterates its hooks while calling them, so a hook cannot
    remove itself)."""

    def __init__(self) -> None:
        self.done = False

    def __call__(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.done:
            return
        import torch

        scalar = torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32  # torch's
        waiting = False
        for group in _square_average_groups(optimizer):
            for p in group["params"]:
                if optimizer.state.get(p):
                    continue
                grad = p.grad
                if grad is None or grad.is_sparse or torch.is_complex(p):  # torch starts these its own way
                    waiting = waiting or grad is None
                    continue
                device = p.device if group.get("capturable") else None
                state = optimizer.state[p]
                state["step"] = torch.zeros((), dtype=scalar, device=device)
                state["square_avg"] = torch.mul(grad, grad).detach()
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["centered"]:
                    state["grad_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        self.done = not waiting


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
