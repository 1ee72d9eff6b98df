"""How the workers of a gradient-sharing fit step: where a step starts, their momentum, and how
many optimizer steps a message carries.

Checked on the driver when the master is built (a wrong value fails before any Spark job), and what the
driver tells the tasks about it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
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


def check_local_steps(value: Any) -> int:
    """``local_steps`` as a whole number >= 1, or a clear error (on the driver, before any Spark job)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise SparkConfigError(
            f"local_steps: expected a whole number >= 1 of optimizer steps a message, got {value!r}; 1 (the "
            "default) takes one step on each minibatch, K splits each minibatch into K pieces and sends the "
            "sum of K steps as one message (more compute, the same bytes)")
    return int(value)


def momentum_workers(scale: bool, partitions: int, parallelism: int, workers_per_node: int) -> int:
    """The power each worker's momentum is raised to (psrv.nn.momentum): the workers whose steps land on
    every replica side by side, one per task Spark runs at once times the local workers behind each;
    1 (the optimizer as given) without ``scale``."""
    return min(partitions, parallelism) * workers_per_node if scale else 1


__all__ = ["STEP_FROM", "check_local_steps", "check_scale_momentum", "check_step_from", "momentum_workers"]
