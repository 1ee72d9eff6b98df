"""The task side of parameter averaging: one round's training on one partition, summed for the driver.

A fatal error of a step (the user's module raised, a NaN in the data or the loss) is returned in the
round's result instead of raised: Spark would only run the task again and meet it again, each time
after a task's start-up; the driver raises it at this first attempt.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn._inputs import features_mask_of, step_arguments
from psrv.nn.errors import NNError
from psrv.nn.protocol import DeviceNetwork
from psrv.spark.errors import FatalSparkError
from psrv.spark.observe.worker_logs import WorkerLogCapture
from psrv.spark.payload import buffers_of
from psrv.spark.task.failures import check_finite, step_error
from psrv.spark.task.prefetch import PrefetchingIterator
from psrv.spark.task.results import RoundResult
from psrv.spark.task.worker import (
    EventLog,
    partition_id,
    path_loader,
    task_source,
    timed_batches,
    training_network,
    worker_id,
)

if TYPE_CHECKING:
    from pyspark import Broadcast


class RoundTrainer:
    """The function one averaging round maps over its partitions (shipped with cloudpickle): train
    every minibatch of the share from the broadcast parameters and return the sums."""

    def __init__(self, payload: Broadcast, loader: Any | None, prefetch: int, collect_stats: bool,
                 round_number: int) -> None:
        self.payload = payload
        self.loader = path_loader(loader)  # opens paths through psrv.spark.storage in the task
        self.prefetch = prefetch
        self.collect_stats = collect_stats
        self.round_number = round_number

    def __call__(self, items: Iterator[Any]) -> Iterator[RoundResult]:
        batches = task_source(items, self.loader)
        if batches is None:
            return  # an empty share: this worker sits the round out, the average skips it
        capture = WorkerLogCapture(worker=worker_id(), partition=partition_id()).attach()
        payload = self.payload.value
        part = partition_id()
        events = EventLog(self.collect_stats, worker=worker_id(), partition=part, round=self.round_number,
                          epoch=int(payload.epoch) + 1)  # 1-based, as the history and the progress count
        started = events.now()
        network = training_network(payload)
        events.add("setup", started, events.now())
        steps, loss_sum, examples = 0, 0.0, 0
        error: str | None = None
        with PrefetchingIterator(batches, self.prefetch) as prefetched:
            for batch, step_start in timed_batches(prefetched, events):
                try:
                    update, loss = _step(network, batch, part, examples)
                except (FatalSparkError, NNError) as exc:  # Spark's retry would raise it again
                    error = f"{type(exc).__name__}: {exc}"
                    break
                network.apply_update(update)
                events.add("fit", step_start, events.now(), loss=float(loss), examples=batch.num_examples,
                           iteration=int(network.iteration))
                steps += 1
                loss_sum += float(loss) * batch.num_examples
                examples += batch.num_examples
        with_updater = payload.updater_state is not None
        result = RoundResult(
            network.params.astype(np.float64),
            network.updater_state.astype(np.float64) if with_updater else None,
            steps, loss_sum, examples, events.events, buffers_of(network),
        )
        result.error = error
        result.logs = capture.detach()
        yield result


def _step(network: Any, batch: Any, partition: int, first_row: int) -> tuple[Any, float]:
    """One minibatch's update and loss; a NaN in the batch, a NaN loss or the user's code raising comes
    out as the fatal psrv error that names its rows (what gradient sharing's tasks raise too)."""
    check_finite(batch, partition, first_row)
    # a torch network keeps the step on its device (no host round trip per step)
    compute = network.compute_update_tensor if isinstance(network, DeviceNetwork) else network.compute_update
    try:
        return compute(batch.features, batch.labels, batch.labels_mask,
                       **step_arguments(compute, features_mask_of(batch)))
    except Exception as exc:  # noqa: BLE001 - classified: psrv's, a NaN loss, or the user's code
        raised = step_error(exc, partition, first_row, batch.num_examples)
        if raised is exc:
            raise
        raise raised from exc


__all__ = ["RoundTrainer"]
