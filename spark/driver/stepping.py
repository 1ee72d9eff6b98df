"""How the workers of a gradient-sharing fit step: where a step starts, their momentum, and how
many optimizer steps a message carries.

Checked on the driver when the master is built (a wrong value fails before any Spark job), and what the
driver tells the tasks about it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.nn._inputs import takes_local_steps
from psrv.spark.errors import SparkConfigError

#: where a worker's step starts: its replica plus its own residual, or its replica alone (DL4J's)
STEP_FROM = ("own", "shared")


def check_step_from(value: Any) -> str:
    """``step_from`` as "own" or "shared", or a clear error (on the driver, before any Spark job)."""
    if value not in STEP_FROM:
        raise SparkConfigError(
            f"step_from: expected one of {', '.join(repr(v) for v in STEP_FROM)}, got {value!r}; \"own\" "
            "(the default) steps from the replica plus the worker's unsent residual, \"shared\" from the "
            "replica alone (DL4J's behaviour)")
    return str(value)


def check_scale_momentum(value: Any) -> bool:
    """``scale_momentum`` as a bool, or a clear error (on the driver, before any Spark job)."""
    if not isinstance(value, bool):
        raise SparkConfigError(
            f"scale_momentum: expected True (each worker's momentum becomes beta ** workers, the "
            f"default) or False (the optimizer as given, DL4J's behaviour), got {value!r}")
    return value


#: ``local_steps="auto"`` (the default): two optimizer steps a message where they were measured to help
#: and cost little, else one (``choose_local_steps``)
AUTO = "auto"
#: "auto" takes two steps a message for models up to this many parameters: there the second step adds
#: under 2 ms of one CPU core to a step (a 400 k-parameter MLP: 3.1 ms, 4.5 ms with two), where on the
#: 1 M-parameter MLP it adds 6 ms (9.5 ms, 15.5) and on the 11 M one 100 ms (scripts/bench_local_steps.py)
AUTO_MAX_PARAMETERS = 500_000
#: ... and minibatches of at least this many rows, so that each piece holds 8 or more (measured down to 8:
#: 4 local steps of a 32-row minibatch)
AUTO_MIN_ROWS = 16
#: SGD takes two steps a message only up to this many workers stepping side by side: with more, two lost up
#: to 9 points in lock-step (8 workers), where up to 4 they gained on every task measured
AUTO_MAX_SGD_WORKERS = 4


def check_local_steps(value: Any) -> int | str:
    """``local_steps`` as "auto" or a whole number >= 1, or a clear error (on the driver, before any
    Spark job)."""
    if isinstance(value, str) and value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise SparkConfigError(
            f"local_steps: expected \"auto\" or a whole number >= 1 of optimizer steps a message, got "
            f"{value!r}; \"auto\" (the default) takes 2 where they help and cost little (a TorchNetwork "
            f"of at most {AUTO_MAX_PARAMETERS:,} parameters with Adam or RMSprop, or SGD with at most "
            f"{AUTO_MAX_SGD_WORKERS} workers side by side, minibatches of {AUTO_MIN_ROWS} rows or more) and "
            "1 elsewhere; 1 takes one step on each minibatch, K splits "
            "each minibatch into K pieces and sends the sum of K steps as one message (more compute, the "
            "same bytes)")
    return int(value)


def choose_local_steps(setting: int | str, network: Any, batch_rows: int,
                       workers: int = 1) -> tuple[int, str]:
    """The optimizer steps a message the workers take, and why: ``setting`` itself where it is a number;
    for "auto", 2 where every condition below holds, else 1. ``workers``: those stepping side by side.

    Two local steps a message were measured to help with adaptive optimizers (every Adam and RMSprop row
    of the quality harness, 2 to 8 workers, and Adam on Spark) and with SGD and momentum up to 4 workers,
    while with SGD at 8 they lost up to 9 points; they cost a second forward, backward and optimizer pass
    of half the rows, which is little only on a small model (README: "Several optimizer steps a message").
    """
    if setting != AUTO:
        return int(setting), f"local_steps={int(setting)}, as set"
    if not takes_local_steps(network):
        return 1, f"auto: 1 ({type(network).__name__}'s step takes no local_steps)"
    parameters = int(network.num_params)
    if parameters > AUTO_MAX_PARAMETERS:
        return 1, (f"auto: 1 ({parameters:,} parameters, over {AUTO_MAX_PARAMETERS:,}: there a second "
                   "step a message costs more compute than it is worth)")
    kind = optimizer_kind(network)
    if kind is None:
        optimizer = type(getattr(network, "optimizer", None)).__name__
        return 1, (f"auto: 1 ({optimizer} is neither Adam's kind, RMSprop nor SGD, the optimizers that two "
                   "local steps were measured to help)")
    if kind == "SGD" and workers > AUTO_MAX_SGD_WORKERS:
        return 1, (f"auto: 1 (SGD with {workers} workers side by side: with SGD two local steps helped up to "
                   f"{AUTO_MAX_SGD_WORKERS} and lost at 8)")
    if batch_rows < AUTO_MIN_ROWS:
        return 1, f"auto: 1 (minibatches of {batch_rows} rows; two steps need {AUTO_MIN_ROWS} or more)"
    return 2, (f"auto: 2 optimizer steps a message ({parameters:,} parameters, {kind}, minibatches of "
               f"{batch_rows} rows in pieces of {batch_rows - batch_rows // 2} and {batch_rows // 2})")


def optimizer_kind(network: Any) -> str | None:
    """The name of the network's torch optimizer where every param group of it is Adam's kind (it has
    ``betas``: Adam, AdamW, NAdam, RAdam, Adamax ...) or RMSprop's (``centered``); "SGD" where every group
    is torch SGD's (``dampening``); else None (AdaGrad, Adadelta, a mix, no torch optimizer)."""
    optimizer = getattr(network, "optimizer", None)
    groups = getattr(optimizer, "param_groups", None)
    if not groups:
        return None
    if all("betas" in group or "centered" in group for group in groups):
        return type(optimizer).__name__
    if all("dampening" in group for group in groups):
        return "SGD"
    return None


def side_by_side(partitions: int, parallelism: int, workers_per_node: int) -> int:
    """The workers whose steps land on every replica side by side: one per task Spark runs at once times
    the local workers behind each."""
    return min(partitions, parallelism) * workers_per_node


def momentum_workers(scale: bool, partitions: int, parallelism: int, workers_per_node: int) -> int:
    """The power each worker's momentum is raised to (psrv.nn.momentum): the workers side by side
    (``side_by_side``); 1 (the optimizer as given) without ``scale``."""
    return side_by_side(partitions, parallelism, workers_per_node) if scale else 1


__all__ = ["AUTO", "AUTO_MAX_PARAMETERS", "AUTO_MAX_SGD_WORKERS", "AUTO_MIN_ROWS", "STEP_FROM",
           "check_local_steps", "check_scale_momentum", "check_step_from", "choose_local_steps",
           "momentum_workers", "optimizer_kind", "side_by_side"]
