"""What a Spark task sends back to the driver: a sharing worker's result, an averaging round's sums."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from psrv.spark.payload import add_buffers


@dataclass
class WorkerResult:
    """One gradient-sharing task's outcome: counts, its final updater/threshold state, events, logs."""

    partition: int
    attempt: int
    steps: int
    examples: int
    loss_sum: float
    messages: int
    bytes_sent: int
    updater_state: np.ndarray
    threshold_state: dict
    events: list[dict[str, Any]]
    counters: dict[str, Any]
    replica: dict[str, Any] | None = None  # psrv.server.replica.ReplicaCheck.as_dict(), if checked
    logs: list[dict[str, Any]] = field(default_factory=list)  # psrv.spark.observe.worker_logs records
    buffers: dict[str, np.ndarray] | None = None  # the worker's final buffers (BatchNorm statistics)
    local_workers: int = 1  # trainers behind this task's one mesh member (workers_per_node)
    step_from: str = "shared"  # where its steps started: "own" (replica + its residual) or "shared"
    local_steps: int = 1  # the optimizer steps it took a message
    momentum: list[tuple[str, float, float]] = field(default_factory=list)  # (name, given, used) per group
    host: str = ""  # where it ran, and the cores its process could use (the driver's crowding check)
    cores: int = 0
    ran: tuple[float, float] = (0.0, 0.0)  # its start and end, seconds of its host's wall clock


class RoundResult:
    """Sums over the workers of one averaging round (so that tree aggregation is a plain add)."""

    __slots__ = ("params", "updater_state", "workers", "steps", "max_steps", "loss_sum", "examples", "events",
                 "logs", "buffers", "error")

    def __init__(self, params: np.ndarray, updater_state: np.ndarray | None, steps: int, loss_sum: float,
                 examples: int, events: list[dict[str, Any]],
                 buffers: dict[str, np.ndarray] | None = None) -> None:
        self.params = params
        self.updater_state = updater_state
        self.workers = 1
        self.steps = steps
        self.max_steps = steps
        self.loss_sum = loss_sum
        self.examples = examples
        self.events = events
        self.logs: list[dict[str, Any]] = []  # psrv.spark.observe.worker_logs records
        self.buffers = add_buffers(None, buffers)  # float64 sums by name, averaged like the params
        # a fatal error of a task ("UserCodeError: ..."): returned, not raised, so that Spark does not
        # run the task again only to raise it again; the driver raises it
        self.error: str | None = None


def add_results(left: RoundResult | None, right: RoundResult | None) -> RoundResult | None:
    """The sum of two round results (``left`` is updated in place); None is the neutral element."""
    if left is None:
        return right
    if right is None:
        return left
    left.params += right.params
    if left.updater_state is not None and right.updater_state is not None:
        left.updater_state += right.updater_state
    left.workers += right.workers
    left.steps += right.steps
    left.max_steps = max(left.max_steps, right.max_steps)
    left.loss_sum += right.loss_sum
    left.examples += right.examples
    left.events.extend(right.events)
    left.logs.extend(right.logs)
    left.buffers = add_buffers(left.buffers, right.buffers)
    left.error = left.error or right.error
    return left


__all__ = ["RoundResult", "WorkerResult", "add_results"]
