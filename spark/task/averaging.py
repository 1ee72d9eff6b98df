"""The task side of parameter averaging: one round's training on one partition, summed for the driver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn._inputs import features_mask_of, step_arguments
from psrv.nn.protocol import DeviceNetwork
from psrv.spark.observe.worker_logs import WorkerLogCapture
from psrv.spark.payload import buffers_of
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
        events = EventLog(self.collect_stats, worker=worker_id(), partition=partition_id(),
                          round=self.round_number)
        started = events.now()
        network = training_network(self.payload.value)
        events.add("setup", started, events.now())
        steps, loss_sum, examples = 0, 0.0, 0
        with PrefetchingIterator(batches, self.prefetch) as prefetched:
            for batch, step_start in timed_batches(prefetched, events):
                # a torch network keeps the step on its device (no host round trip per step)
                compute = network.compute_update_tensor if isinstance(network, DeviceNetwork) \
                    else network.compute_update
                update, loss = compute(batch.features, batch.labels, batch.labels_mask,
                                       **step_arguments(compute, features_mask_of(batch)))
                network.apply_update(update)
                events.add("fit", step_start, events.now(), loss=float(loss), examples=batch.num_examples,
                           iteration=int(network.iteration))
                steps += 1
                loss_sum += float(loss) * batch.num_examples
                examples += batch.num_examples
        with_updater = self.payload.value.updater_state is not None
        result = RoundResult(
            network.params.astype(np.float64),
            network.updater_state.astype(np.float64) if with_updater else None,
            steps, loss_sum, examples, events.events, buffers_of(network),
        )
        result.logs = capture.detach()
        yield result


__all__ = ["RoundTrainer"]
