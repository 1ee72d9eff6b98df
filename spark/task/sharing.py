"""The task side of gradient sharing (DL4J's SharedFlatMap): what Spark runs on each partition.

A task starts a node pointed at the driver's controller (which downloads the current parameters: a
retried task catches up), trains over its data with a prefetching iterator, encodes every update with
its residual, applies the encoded update locally and submits it, checks its replica against the master
copy, waits until the controller acknowledged its updates, then leaves and returns a ``WorkerResult``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.encoding import ResidualEncoder
from psrv.encoding.codec import add_to_both, copy_to_both
from psrv.encoding.messages import compact
from psrv.nn._inputs import features_mask_of, step_arguments, takes_local_steps
from psrv.nn.errors import ConfigError
from psrv.nn.momentum import momentum_for_workers
from psrv.nn.protocol import TrainableNetwork, network_device
from psrv.nn.torch_flat import load_with
from psrv.spark import strategies
from psrv.spark.observe.progress import LossAverage, report_progress
from psrv.spark.observe.worker_logs import WorkerLogCapture
from psrv.spark.payload import buffers_of
from psrv.spark.task.device import task_gpus, wants_device_sharing
from psrv.spark.task.failures import check_finite, report_fatal, step_error
from psrv.spark.task.local_workers import LocalWorkers, deal
from psrv.spark.task.node import start_node, wait_acknowledged
from psrv.spark.task.prefetch import PrefetchingIterator
from psrv.spark.task.replica import check_replica
from psrv.spark.task.results import WorkerResult
from psrv.spark.task.setup import WorkerSetup
from psrv.spark.task.worker import (
    EventLog,
    host_and_cores,
    keep_residual,
    partition_id,
    path_loader,
    take_residual,
    task_source,
    timed_batches,
    training_network,
    worker_id,
)
from psrv.torch.device_sharing import DeviceSharing

if TYPE_CHECKING:
    from pyspark import Broadcast

log = logging.getLogger(__name__)

#: called after every step with the number of steps this task trained so far
StepCallback = Callable[[int], None]


def _attempt() -> int:
    from pyspark import TaskContext  # lazy: pyspark's task context, only inside a running task

    context = TaskContext.get()
    return int(context.attemptNumber()) if context is not None else 0


class SharingTask:
    """One attempt at one partition: its network, encoder, node and what it counted."""

    def __init__(self, setup: WorkerSetup, device_sharing: Callable[[TrainableNetwork], bool]) -> None:
        self.setup = setup
        self.started = time.time()  # wall clock: the driver counts the tasks a host ran at once
        self.part = partition_id()
        self.attempt = _attempt()
        self.capture = WorkerLogCapture(worker=worker_id(), partition=self.part,
                                        attempt=self.attempt).attach()
        self.events = EventLog(setup.collect_stats, worker=worker_id(), partition=self.part,
                               attempt=self.attempt, epoch=int(setup.payload.epoch) + 1)  # 1-based
        started = self.events.now()
        self.network = training_network(setup.payload)
        self.events.add("setup", started, self.events.now(), device=network_device(self.network))
        on_device = device_sharing(self.network)
        threshold_algorithm, post_processor = strategies.rebuild(
            setup.strategy_classes, [setup.threshold_state, setup.post_processor_state],
            [strategies.THRESHOLD, strategies.POST_PROCESSOR])  # a user's own classes too
        self.encoder = ResidualEncoder(
            self.network.num_params,
            dtype=self.network.params.dtype,
            threshold_algorithm=threshold_algorithm,
            post_processor=post_processor,
            debug=setup.debug,
            device=self.network.device if on_device else None,
        )
        self.sharing = DeviceSharing(self.network, self.encoder) if on_device else None
        self.steps = self.examples = self.messages = self.bytes_sent = 0
        self.loss_sum = 0.0
        self.loss_average = LossAverage()
        self.replica: dict[str, Any] | None = None
        self.counters: dict[str, Any] = {}
        self._join()
        self.step_from = self._step_from(getattr(setup, "step_from", "shared"))
        self.local_steps = self._local_steps(int(getattr(setup, "local_steps", 1)))
        count = int(getattr(setup, "workers_per_node", 1))
        self.local = LocalWorkers(self.network, setup.payload, count, self.node.lock, on_device,
                                  task_gpus() if on_device else (),
                                  offset=self._residual if self.step_from == "own" else None) \
            if count > 1 else None
        self.momentum = self._set_momentum(int(getattr(setup, "momentum_workers", 1)))

    def _set_momentum(self, workers: int) -> list[tuple[str, float, float]]:
        """Every local worker's momentum for ``workers`` workers sharing (1: as given; a network cached
        by an earlier fit gets its given coefficient back first), logged where it changes."""
        changes = []
        for network in [self.network] if self.local is None else self.local.networks:
            try:
                changes = momentum_for_workers(network, workers)
            except ConfigError:  # a network of the user's own kind, with no optimizer psrv knows
                log.info("momentum for %d workers: %s has no optimizer or updater psrv can set; kept",
                         workers, type(network).__name__)
                return []
        if workers > 1 and changes:
            log.info("momentum for %d workers sharing: %s", workers,
                     ", ".join(f"{c.name} {c.given:g} -> {c.now:.4g}" for c in changes))
        return [(c.name, c.given, c.now) for c in changes]

    def _step_from(self, wanted: str) -> str:
        """Where this task's steps start: "own" (the replica plus this worker's residual) where the
        network can step from a loaded step buffer, else "shared" (the replica), logged."""
        if wanted != "own":
            return "shared"
        if _steps_from_loaded(self.network) and (self.sharing is not None or _steps_in_pairs(self.network)):
            return "own"
        log.info("step_from='own' asked for; this task steps from its replica alone (%s has no step "
                 "buffer to step from)", type(self.network).__name__)
        return "shared"

    def _local_steps(self, wanted: int) -> int:
        """Optimizer steps a message: ``wanted`` where the network's step takes ``local_steps`` (a
        ``TorchNetwork``), else 1, logged."""
        if wanted <= 1:
            return 1
        if takes_local_steps(self.network):
            return wanted
        log.info("local_steps=%d asked for; this task takes one optimizer step a message (%s's "
                 "compute_update takes no local_steps)", wanted, type(self.network).__name__)
        return 1

    def _residual(self) -> Any:
        """What this node has not sent yet (a host array, or a tensor on the device)."""
        return self.encoder.residual

    def _join(self) -> None:
        """Start the node (a download of the master copy), then take the updater state and residual."""
        caught_up = self.events.now()
        self.node = start_node(self.setup, self.network, self.part, self.sharing)
        self.events.add("catch_up", caught_up, self.events.now(), restart=bool(self.node.restart))
        state = self.node.updater_state
        if state is not None and state.size == self.network.updater_state.size:
            self.network.set_updater_state(state)
        carried = take_residual(self.setup.session_id)
        if carried is not None and tuple(carried.shape) == tuple(self.encoder.residual.shape):
            if self.sharing is not None:
                self.sharing.set_residual(carried)
            else:
                self.encoder.residual[...] = carried
            self.events.add("residual_carried", self.events.now(), self.events.now(),
                            residual_abs_sum=float(np.abs(carried).sum()))

    def train(self, batches: Iterator[Any], on_step: StepCallback | None) -> None:
        """Every minibatch of the partition, then the replica check and the acknowledgement; the node
        leaves whatever happens."""
        try:
            with PrefetchingIterator(batches, self.setup.prefetch) as prefetched:
                timed = timed_batches(prefetched, self.events)
                if self.local is None:
                    for batch, step_start in timed:
                        self.step(batch, step_start)
                        if on_step is not None:
                            on_step(self.steps)
                else:  # several local workers: one round of their minibatches, one combined message
                    for group, step_start in deal(timed, self.local.count):
                        self.step_round(group, step_start)
                        if on_step is not None:
                            on_step(self.steps)
            self._before_leaving()
        except BaseException as exc:  # a fatal one reaches the driver in the heartbeat before we leave
            report_fatal(self.node, self.setup.job_id, exc, self.setup.transport.heartbeat_s)
            raise
        finally:
            if self.local is not None:
                self.local.close()
            leave_start = self.events.now()
            self.node.stop()
            self.events.add("leave", leave_start, self.events.now())
        keep_residual(self.setup.session_id, self.encoder.residual)

    def step(self, batch: Any, step_start: float) -> None:
        """Compute, encode, apply locally and submit one minibatch's update; record what it cost."""
        check_finite(batch, self.part, self.examples)
        pair = self.sharing is None and _steps_in_pairs(self.network)
        update, loss = self._compute(self.network, batch, self.examples, pair=pair,
                                     own=self.step_from == "own")
        self._send(update, loss, [batch], step_start, pair=pair)

    def step_round(self, batches: list[Any], step_start: float) -> None:
        """One minibatch per local worker, their steps summed into one update, encoded and sent once."""
        offset = self.examples
        for batch in batches:
            check_finite(batch, self.part, offset)
            offset += batch.num_examples
        outcomes = self.local.compute(batches, partial(self._compute, own=self.step_from == "own"),
                                      self.examples)
        update = self.local.combine([u for u, _ in outcomes])
        self._send(update, [float(loss) for _, loss in outcomes], batches, step_start)

    def _compute(self, network: TrainableNetwork, batch: Any, rows_before: int,
                 pair: bool = False, own: bool = False) -> tuple[Any, float]:
        """One worker's step on one minibatch (nothing applied); its errors classified. With ``pair``
        the step comes back as (after, before), for the encoder's one-pass sum, scan and encode. With
        ``own`` the replica's step is taken at the replica plus this node's residual, from a loaded copy
        (another local worker's parameters are that point already: ``LocalWorkers``' offset)."""
        compute = network.compute_update if self.sharing is None else network.compute_update_tensor
        if own and network is self.network and self.sharing is not None:  # the residual is a tensor there
            compute = partial(network.compute_update_tensor, from_loaded=True,
                              load=load_with(self.encoder.residual))
        elif own and network is self.network and pair:
            compute = partial(network.compute_update_pair, from_loaded=True,
                              load=partial(_load_with_residual, residual=self.encoder.residual))
        elif own and network is self.network:  # on the host, one step of a round: as one array
            compute = partial(_host_step_from_residual, network, residual=self.encoder.residual)
        elif pair:
            compute = partial(network.compute_update_pair, load=_load_on_host)
        if self.local_steps > 1:
            compute = partial(compute, local_steps=self.local_steps)
        try:
            *update, loss = compute(batch.features, batch.labels, batch.labels_mask,
                                    **step_arguments(compute, features_mask_of(batch)))
        except Exception as exc:  # noqa: BLE001 - classified: psrv's, a NaN loss, or the user's code
            raised = step_error(exc, self.part, rows_before, batch.num_examples)
            if raised is exc:
                raise
            raise raised from exc
        return (tuple(update) if pair else update[0]), loss

    def _send(self, update: Any, losses: Any, batches: list[Any], step_start: float,
              pair: bool = False) -> None:
        """Encode, apply locally and submit one update (of one minibatch, or one per local worker);
        ``losses`` is the step's loss, or each local worker's; ``update`` is (after, before) with ``pair``."""
        network, events = self.network, self.events
        examples = sum(int(b.num_examples) for b in batches)
        if isinstance(losses, list):  # the round's loss: each worker's, weighted by its rows
            loss_sum = sum(loss * int(b.num_examples) for loss, b in zip(losses, batches, strict=True))
            loss = loss_sum / max(1, examples)
        else:
            loss, loss_sum = losses, float(losses) * examples
        encode_start = events.now()
        message = self.encoder.encode_difference(*update) if pair else self.encoder.encode_update(update)
        encode_end = events.now()
        sent = self._submit(message) if message is not None else 0
        stats = self.encoder.last_stats
        if self.setup.debug and stats is not None:
            self.capture.debug_stats(int(network.iteration), stats)
        events.add("fit", step_start, encode_start, loss=float(loss), examples=examples,
                   iteration=int(network.iteration))
        elements = self.encoder.last_count if message is not None else 0  # what the encoder counted
        events.add("encode", encode_start, encode_end, iteration=int(network.iteration),
                   threshold=float(self.encoder.threshold_algorithm.threshold), bytes=sent,
                   elements=elements, sparsity=elements / max(1, network.num_params))
        self.steps += len(batches)
        self.examples += examples
        self.loss_sum += loss_sum
        report_progress(self.node, partition=self.part, epoch=int(network.epoch) + 1, steps=self.steps,
                        examples=self.examples, loss=self.loss_average.add(float(loss)))

    def _submit(self, message: Any) -> int:
        """Apply the encoded update locally and hand it to the node; returns the bytes sent."""
        iteration, epoch = int(self.network.iteration), int(self.network.epoch)
        if self.sharing is not None:  # on the device; its host copy is sent
            sent = self.sharing.submit(self.node, message, iteration, epoch)
        else:
            message = compact(message)  # the form it travels in, so the bytes counted are the wire's
            self.node.submit(message, iteration=iteration, epoch=epoch, apply_locally=True)
            sent = int(message.nbytes)
        self.messages += 1
        self.bytes_sent += sent
        return sent

    def _before_leaving(self) -> None:
        """The replica check (its snapshot also acknowledges this node's updates), then the wait for
        the controller's acknowledgement, then the node's counters."""
        events, transport = self.events, self.setup.transport
        if self.setup.check_replicas:
            check_start = events.now()
            self.replica = check_replica(self.node, transport.heartbeat_s, transport.missed_beats,
                                         self.sharing)
            events.add("replica_check", check_start, events.now(), status=self.replica["status"])
        flush_start = events.now()
        acknowledged = wait_acknowledged(self.node, transport.heartbeat_s, transport.missed_beats)
        events.add("flush", flush_start, events.now(), acknowledged=acknowledged)
        self.counters = self.node.counters()
        if self.setup.collect_stats:
            events.events.append({**events.common, "kind": "metrics", "time": events.now(),
                                  "iteration": int(self.network.iteration),
                                  "bytes_received": int(self.counters.get("bytes_in", 0)),
                                  "bytes_sent_total": int(self.counters.get("bytes_out", 0)),
                                  "updates_applied": int(self.counters.get("updates_applied", 0))})

    def result(self) -> WorkerResult:
        """What the driver gets back from this task."""
        local = self.local
        host, cores = host_and_cores()
        return WorkerResult(
            self.part, self.attempt, self.steps, self.examples, self.loss_sum, self.messages, self.bytes_sent,
            np.array(self.network.updater_state, copy=True) if local is None else local.updater_state(),
            self.encoder.threshold_algorithm.get_state(), self.events.events, self.counters,
            replica=self.replica, logs=self.capture.detach(),
            buffers=buffers_of(self.network) if self.local is None else self.local.buffers(),
            local_workers=1 if self.local is None else self.local.count, step_from=self.step_from,
            local_steps=self.local_steps,
            momentum=self.momentum, host=host, cores=cores, ran=(self.started, time.time()))


class SharingTrainer:
    """The function a gradient-sharing job maps over the partitions (shipped with cloudpickle).

    The loader travels here, not in the broadcast (plain pickle), so that a loader class defined in a
    notebook or ``__main__`` works too. ``on_step`` (None in production) is called after every step
    with the task's step count: a place to observe or interrupt a task from outside.
    """

    def __init__(self, setup: Broadcast, loader: Any | None, on_step: StepCallback | None = None) -> None:
        self.setup = setup
        self.loader = path_loader(loader)  # opens paths through psrv.spark.storage in the task
        self.on_step = on_step

    def device_sharing(self, network: TrainableNetwork) -> bool:
        """Whether this task shares from the network's device (a torch network off the CPU)."""
        return wants_device_sharing(network)

    def __call__(self, items: Iterator[Any]) -> Iterator[WorkerResult]:
        batches = task_source(items, self.loader)
        if batches is None:
            return  # nothing to train on: this task never joins
        task = SharingTask(self.setup.value, self.device_sharing)
        task.train(batches, self.on_step)
        yield task.result()


def _owner(network: Any, name: str) -> Any:
    """The class in the network's MRO that defines ``name`` (None if none does)."""
    return next((k for k in type(network).__mro__ if name in vars(k)), None)


def _steps_in_pairs(network: Any) -> bool:
    """Whether the network gives its step on the host as (after, before) by the same code as its
    ``compute_update`` (a subclass that overrides ``compute_update`` keeps its own)."""
    return (getattr(network, "on_host", False) is True and _owner(network, "compute_update_pair") is not None
            and _owner(network, "compute_update_pair") is _owner(network, "compute_update"))


def _steps_from_loaded(network: Any) -> bool:
    """Whether the network's ``compute_update_tensor`` can step from a loaded step buffer: the class that
    takes steps as pairs defines it (a subclass that overrides it keeps its own)."""
    tensor = _owner(network, "compute_update_tensor")
    return tensor is not None and tensor is _owner(network, "compute_update_pair")


def _load_on_host(live: Any, snapshot: Any, step_buffer: Any) -> None:
    """The live parameters into the step's snapshot and step buffer, one read for both."""
    copy_to_both(live.numpy(), snapshot.numpy(), step_buffer.numpy())


def _load_with_residual(live: Any, snapshot: Any, step_buffer: Any, residual: np.ndarray) -> None:
    """The live parameters plus the worker's residual into the step's snapshot and step buffer: the
    point the worker's own steps took it to, what was not sent yet included."""
    add_to_both(live.numpy(), residual, snapshot.numpy(), step_buffer.numpy())


def _host_step_from_residual(network: Any, features: Any, labels: Any, mask: Any = None,
                             features_mask: Any = None, *, residual: np.ndarray,
                             local_steps: int = 1) -> tuple[np.ndarray, float]:
    """A host network's step taken at its live parameters plus ``residual``, as one array."""
    update, loss = network.compute_update_tensor(features, labels, mask, features_mask, from_loaded=True,
                                                 load=partial(_load_with_residual, residual=residual),
                                                 local_steps=local_steps)
    return update.numpy(), loss


__all__ = ["SharingTask", "SharingTrainer", "StepCallback"]
