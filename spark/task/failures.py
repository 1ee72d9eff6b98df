"""A task's fatal failures: said with the row where they happened, and reported to the driver at once.

A non-finite value in a minibatch, a loss that became NaN, or an exception from the user's own module
cannot be cured by Spark running the task again. The task names the row (its position among the rows
this task trains, and the partition), puts the error in its node's heartbeat (``train_fatal``) so the
driver learns of it within a beat or two and cancels the job instead of letting Spark retry every task,
and only then fails: while it waits it still runs, so Spark starts no second attempt of it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from psrv.nn.errors import NNError, NonFiniteLossError
from psrv.spark.errors import FatalSparkError, SparkError, SparkInputError, UserCodeError

__all__ = ["FATAL_GAUGE", "JOB_GAUGE", "check_finite", "fatal_report", "fatal_wait_s", "first_non_finite",
           "report_fatal", "step_error"]

FATAL_GAUGE = "train_fatal"
JOB_GAUGE = "train_job"
#: how long a task with a fatal error waits for the driver's cancellation before it fails anyway: the
#: next beat carries the error, the driver looks every half second and cancels, and a loaded host
#: stretches each of these (a wait of 1.5 beats was seen to run out first, and Spark retried the task)
FATAL_WAIT_BEATS = 6
FATAL_WAIT_MIN_S = 3.0


def first_non_finite(arrays: Any) -> tuple[int, tuple[int, ...], float] | None:
    """(row, index within the row, value) of the first NaN/inf of a batch's array(s), or None."""
    for array in arrays if isinstance(arrays, list | tuple) else [arrays]:
        if array is None:
            continue
        values = np.asarray(array)
        if values.dtype.kind not in "fc" or values.ndim == 0:
            continue
        bad = ~np.isfinite(values)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            return where[0], where[1:], float(values[where])
    return None


def check_finite(batch: Any, partition: int, first_row: int) -> None:
    """Refuse a minibatch holding NaN/inf, naming the row (``first_row`` is the batch's first row's
    position among the rows this task trains) and the column."""
    for what, arrays in (("features", batch.features), ("labels", batch.labels)):
        found = first_non_finite(arrays)
        if found is not None:
            row, index, value = found
            raise SparkInputError(
                f"non-finite value {value} in the {what} of row {first_row + row} of partition {partition} "
                f"(as this task reads its rows; index {list(index)} within the row): remove or impute "
                "NaN/inf before training (e.g. DataFrame.na.drop() or na.fill())")


def step_error(exc: BaseException, partition: int, first_row: int, rows: int) -> BaseException:
    """What a training step's exception is for the driver: psrv's own errors as they are, a NaN loss
    with its rows, anything else as the user's code's error (with the user's exception first)."""
    span = f"rows {first_row}..{first_row + rows - 1} of partition {partition}"
    if isinstance(exc, NonFiniteLossError):
        return SparkInputError(f"{exc} at the minibatch of {span} (its inputs are finite): lower the "
                               "learning rate or check the loss")
    if isinstance(exc, SparkError | NNError):
        return exc
    first = (str(exc).strip().splitlines() or [""])[0][:500]
    return UserCodeError(f"{type(exc).__name__}: {first} (raised by the network's own code at the minibatch "
                         f"of {span})")


def fatal_wait_s(heartbeat_s: float) -> float:
    """How long ``report_fatal`` keeps a failing task running for the driver to cancel the job."""
    return max(FATAL_WAIT_MIN_S, FATAL_WAIT_BEATS * heartbeat_s)


def report_fatal(node: Any, job_id: str, error: BaseException, heartbeat_s: float) -> None:
    """Put a fatal error in the node's heartbeat, then keep the task running (its node beating) until
    the driver's cancellation ends it, or at most ``fatal_wait_s``: a task that failed before the driver
    cancelled would be started again by Spark, only to raise the same error. Without a cancellation
    (the driver never heard) the task fails after the wait and Spark's retries go on as before."""
    if not isinstance(error, FatalSparkError | NNError):
        return
    gauges = node.counters_.gauges
    gauges[JOB_GAUGE] = job_id
    gauges[FATAL_GAUGE] = f"{type(error).__name__}: {error}"[:2000]
    time.sleep(fatal_wait_s(heartbeat_s))


def fatal_report(nodes: Sequence[Mapping[str, Any]], job_id: str) -> str | None:
    """On the driver: the first fatal error a task of job ``job_id`` reported in its heartbeat."""
    for node in nodes:
        stats = node.get("stats") or {}
        if stats.get(JOB_GAUGE) == job_id and isinstance(stats.get(FATAL_GAUGE), str):
            return str(stats[FATAL_GAUGE])
    return None
