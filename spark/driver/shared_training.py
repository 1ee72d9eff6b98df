"""Gradient sharing on Spark (DL4J's SharedTrainingMaster): threshold-encoded updates over a ZeroMQ mesh.

The driver starts a controller holding the master copy of the parameters and ships the
configuration, CurveZMQ keys and initial parameters to the tasks. Each partition's task starts a
node pointed at the controller (which downloads the current parameters: a retried task catches up),
trains over its data with a prefetching iterator, encodes every update with its residual, applies
the encoded update locally and submits it, then leaves. ``fit`` returns when the job ends; the
driver's network then holds the controller's parameters, the workers' averaged updater state and
the averaged threshold state. ``fit(epochs=N)`` runs one job per epoch but keeps one controller (its
keys, the master copy) for the whole call (``controller_for_call``, psrv.spark.driver.live_controller).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.nn.data import FileDataSetLoader
from psrv.spark.config import VoidConfiguration
from psrv.spark.data.batching import check_batch_size, rebatch
from psrv.spark.data.export import ExportCache, check_training_approach, files_backed
from psrv.spark.driver.live_controller import LiveController, start_controller
from psrv.spark.driver.partitioning import parse_repartition, repartition_rdd
from psrv.spark.driver.task_clock import TaskStartClock
from psrv.spark.errors import (
    ControllerUnreachableError,
    SparkConfigError,
    SparkInputError,
    TrainingJobError,
)
from psrv.spark.observe.metrics import check_loggers, elements_sent, publish_shared_fit
from psrv.spark.observe.progress import LiveProgress, LossAverage, check_progress, report_progress
from psrv.spark.observe.worker_logs import WorkerLogCapture, relay_worker_logs
from psrv.spark.payload import NetworkPayload, add_buffers, buffers_of, lineage, mean_buffers, set_counters
from psrv.spark.task.device import DeviceSharing, wants_device_sharing
from psrv.spark.task.prefetch import PrefetchingIterator, check_prefetch_num_batches
from psrv.spark.task.worker import (
    EventLog,
    driver_event,
    keep_residual,
    partition_id,
    path_loader,
    take_residual,
    task_source,
    timed_batches,
    training_network,
    worker_id,
)

if TYPE_CHECKING:
    from pyspark import RDD, Broadcast, SparkContext

log = logging.getLogger(__name__)

_DRAIN_QUIET_S = 0.5
_DRAIN_MIN_S = 2.0
# The driver's watchdog is a backstop: a task's own join deadline (join_timeout_ms from the node's start)
# fails it first. A task's Python worker may take tens of seconds to start and import torch on a busy
# executor, after Spark counts the task as started; the watchdog leaves it that long.
_TASK_STARTUP_SLACK_S = 60.0


@dataclass
class WorkerSetup:
    """Everything a task needs, broadcast once per fit (picklable, no sockets)."""

    job_id: str
    controller_address: str
    transport: Any  # psrv.transport.TransportConfig for the nodes (keys included when secure)
    network_mask: str | None
    payload: NetworkPayload
    threshold_state: dict
    post_processor_state: dict
    prefetch: int
    debug: bool
    collect_stats: bool
    fault_kill_after_steps: int | None = None  # test-only: kill the first attempt of partition 0
    session_id: str = ""  # one training master: residuals carry over between its fits
    check_replicas: bool = True  # each task checks its final replica against the master (see below)
    extra: dict = field(default_factory=dict)


@dataclass
class WorkerResult:
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


def _maybe_kill(setup: WorkerSetup, steps: int) -> None:
    """The test-only fault hook: the first attempt of partition 0 dies like a crashed executor."""
    if setup.fault_kill_after_steps is None or steps != setup.fault_kill_after_steps:
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is not None and context.partitionId() == 0 and context.attemptNumber() == 0:
        log.warning("fault hook: killing the Python worker %s of partition 0 after %d steps",
                    os.getpid(), steps)
        os._exit(17)


def route_source_address(address: str) -> str | None:
    """The local IP this host would use to reach ``address`` ("host:port"), or None.

    A UDP socket's connect() sends nothing; it only asks the routing table which interface
    leads there — the address the controller can reach this node back at.
    """
    from psrv.spark.config import split_address

    try:
        host, port = split_address(address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((host, port or 9))
            return str(probe.getsockname()[0])
    except (OSError, ValueError):
        return None


def _start_node(setup: WorkerSetup, network: Any, part: int, sharing: Any = None) -> Any:
    from psrv.server.node import Node
    from psrv.transport import TransportError

    config = setup.transport.replace(node_name=f"{setup.job_id}-p{part}")
    if setup.network_mask is None and not os.environ.get("PSRV_IP", "").strip():
        # no mask given: bind the interface that routes to the controller (not loopback on a cluster)
        config = config.replace(host=route_source_address(setup.controller_address))
    if sharing is not None:  # a device network: the node decodes through hooks, downloads to the host
        node = Node(config, sharing.node_params, setup.controller_address, want_updater_state=True,
                    **sharing.node_hooks())
    else:
        node = Node(config, network.params, setup.controller_address, want_updater_state=True)
    try:
        node.start()
    except TransportError as exc:
        node.stop(timeout_s=2.0)
        raise ControllerUnreachableError(
            f"worker {worker_id()} (partition {part}) could not join the psrv controller at "
            f"{setup.controller_address} (network mask {setup.network_mask!r}; set VoidConfiguration."
            f"network_mask / controller_address, or PSRV_IP): {exc}"
        ) from exc
    return node


def _wait_acknowledged(node: Any, heartbeat_s: float, missed_beats: int) -> bool:
    """Stay in the mesh until the controller holds every update this node sent, so that nothing a
    relay dropped is lost when the task leaves (the node re-sends what the controller's watermark
    lacks after two silent beats). Bounded: two beats of waiting, the re-send quiet period, slack.
    """
    from psrv.transport import TransportError

    try:
        return node.wait_acknowledged(timeout_s=heartbeat_s * (missed_beats + 4))
    except TransportError as exc:  # the node stopped: leave without the acknowledgement, as before
        log.warning("worker %s: no acknowledgement of its updates before leaving: %s", worker_id(), exc)
        return False


def _check_replica(node: Any, heartbeat_s: float, missed_beats: int, sharing: Any = None) -> dict[str, Any]:
    """The central invariant, checked where it can break: this replica against the master copy
    (snapshot + the updates this replica holds beyond it; server/replica.py). Costs one download.
    A device network's live replica is its device parameters (copied to the host for the check)."""
    current = (lambda: sharing.network.params) if sharing is not None else None
    check = node.check_replica(timeout_s=heartbeat_s * (missed_beats + 4) + 5.0, current=current)
    if check.diverged:
        log.error("worker %s: its replica DIFFERS from the master copy: %s", worker_id(), check.detail)
    return check.as_dict()


def _partition_trainer(
    setup_broadcast: Broadcast, loader: Any | None
) -> Callable[[Iterator[Any]], Iterator[WorkerResult]]:
    # the loader travels in the closure (cloudpickle), not in the broadcast (plain pickle), so a
    # loader class defined in a notebook or __main__ works too
    loader = path_loader(loader)  # opens paths through psrv.spark.storage in the task

    def train(items: Iterator[Any]) -> Iterator[WorkerResult]:
        from psrv.encoding import ResidualEncoder, post_processor_from_state, threshold_algorithm_from_state
        from pyspark import TaskContext

        batches = task_source(items, loader)
        if batches is None:
            return  # nothing to train on: this task never joins
        setup: WorkerSetup = setup_broadcast.value
        part = partition_id()
        context = TaskContext.get()
        attempt = int(context.attemptNumber()) if context is not None else 0
        capture = WorkerLogCapture(worker=worker_id(), partition=part, attempt=attempt).attach()
        events = EventLog(setup.collect_stats, worker=worker_id(), partition=part, attempt=attempt,
                          epoch=int(setup.payload.epoch))
        started = events.now()
        network = training_network(setup.payload)
        events.add("setup", started, events.now(), device=str(getattr(network, "device", "cpu")))

        on_device = wants_device_sharing(network, bool(setup.extra.get("device_sharing")))
        encoder = ResidualEncoder(
            network.num_params,
            dtype=network.params.dtype,
            threshold_algorithm=threshold_algorithm_from_state(setup.threshold_state),
            post_processor=post_processor_from_state(setup.post_processor_state),
            debug=setup.debug,
            device=network.device if on_device else None,
        )
        sharing = DeviceSharing(network, encoder) if on_device else None
        caught_up = events.now()
        node = _start_node(setup, network, part, sharing)
        events.add("catch_up", caught_up, events.now(), restart=bool(node.restart))
        if node.updater_state is not None and node.updater_state.size == network.updater_state.size:
            network.set_updater_state(node.updater_state)
        carried = take_residual(setup.session_id)
        if carried is not None and tuple(carried.shape) == tuple(encoder.residual.shape):
            if sharing is not None:
                sharing.set_residual(carried)
            else:
                encoder.residual[...] = carried
            events.add("residual_carried", events.now(), events.now(),
                       residual_abs_sum=float(np.abs(carried).sum()))

        steps = examples = messages = bytes_sent = 0
        loss_sum = 0.0
        loss_average = LossAverage()
        try:
            with PrefetchingIterator(batches, setup.prefetch) as prefetched:
                for batch, step_start in timed_batches(prefetched, events):
                    compute = network.compute_update if sharing is None else network.compute_update_tensor
                    update, loss = compute(batch.features, batch.labels, batch.labels_mask)
                    encode_start = events.now()
                    message = encoder.encode_update(update)
                    encode_end = events.now()
                    sent = 0
                    if message is not None and sharing is not None:  # on the device; host copy sent
                        sent = sharing.submit(node, message, int(network.iteration), int(network.epoch))
                    elif message is not None:
                        node.submit(message, iteration=int(network.iteration), epoch=int(network.epoch),
                                    apply_locally=True)
                        sent = int(message.nbytes)
                    if message is not None:
                        messages += 1
                        bytes_sent += sent
                    stats = encoder.last_stats
                    if setup.debug and stats is not None:
                        capture.debug_stats(int(network.iteration), stats)
                    events.add("fit", step_start, encode_start, loss=float(loss), examples=batch.num_examples,
                               iteration=int(network.iteration))
                    elements = elements_sent(message) if message is not None and events.enabled else 0
                    events.add("encode", encode_start, encode_end, iteration=int(network.iteration),
                               threshold=float(encoder.threshold_algorithm.threshold), bytes=sent,
                               elements=elements, sparsity=elements / max(1, network.num_params))
                    steps += 1
                    examples += batch.num_examples
                    loss_sum += float(loss) * batch.num_examples
                    report_progress(node, partition=part, epoch=int(network.epoch), steps=steps,
                                    examples=examples, loss=loss_average.add(float(loss)))
                    _maybe_kill(setup, steps)
            replica = None
            if setup.check_replicas:  # first: its snapshot also acknowledges this node's updates
                check_start = events.now()
                replica = _check_replica(node, setup.transport.heartbeat_s, setup.transport.missed_beats,
                                         sharing)
                events.add("replica_check", check_start, events.now(), status=replica["status"])
            flush_start = events.now()
            acknowledged = _wait_acknowledged(node, setup.transport.heartbeat_s, setup.transport.missed_beats)
            events.add("flush", flush_start, events.now(), acknowledged=acknowledged)
            counters = node.counters()
            if setup.collect_stats:
                events.events.append({**events.common, "kind": "metrics", "time": events.now(),
                                      "iteration": int(network.iteration),
                                      "bytes_received": int(counters.get("bytes_in", 0)),
                                      "bytes_sent_total": int(counters.get("bytes_out", 0)),
                                      "updates_applied": int(counters.get("updates_applied", 0))})
        finally:
            leave_start = events.now()
            node.stop()
            events.add("leave", leave_start, events.now())
        keep_residual(setup.session_id, encoder.residual)
        yield WorkerResult(part, attempt, steps, examples, loss_sum, messages, bytes_sent,
                           np.array(network.updater_state, copy=True),
                           encoder.threshold_algorithm.get_state(), events.events, counters,
                           replica=replica, logs=capture.detach(), buffers=buffers_of(network))

    return train


class SharedTrainingMaster:
    """Asynchronous data-parallel training by sharing threshold-encoded updates (gradient sharing)."""

    def __init__(
        self,
        conf: VoidConfiguration | None = None,
        batch_size_per_worker: int = 32,
        num_workers: int | None = None,
        threshold_algorithm: Any = None,
        residual_post_processor: Any = None,
        worker_prefetch_num_batches: int = 2,
        rdd_training_approach: str = "export",
        export_directory: str | None = None,
        repartition: str = "always",
        encoding_debug_mode: bool = False,
        collect_training_stats: bool = False,
        check_replicas: bool = True,
        loggers: Any = None,
        progress: bool = True,
    ) -> None:
        from psrv.encoding import AdaptiveThreshold, ResidualClipping

        self.conf = conf if conf is not None else VoidConfiguration()
        if not isinstance(self.conf, VoidConfiguration):
            raise SparkConfigError(f"conf: expected a VoidConfiguration, got {type(conf).__name__}")
        self.batch_size_per_worker = check_batch_size(batch_size_per_worker, "batch_size_per_worker")
        if num_workers is not None:
            check_batch_size(num_workers, "num_workers")
        self.num_workers = num_workers
        self.threshold_algorithm = threshold_algorithm if threshold_algorithm is not None \
            else AdaptiveThreshold(1e-3)
        self.residual_post_processor = residual_post_processor if residual_post_processor is not None \
            else ResidualClipping(5, 5)
        for name, value in (("threshold_algorithm", self.threshold_algorithm),
                            ("residual_post_processor", self.residual_post_processor)):
            if not hasattr(value, "get_state"):
                raise SparkConfigError(f"{name}: expected a psrv.encoding strategy object, got {value!r}")
        self.worker_prefetch_num_batches = check_prefetch_num_batches(worker_prefetch_num_batches)
        self.rdd_training_approach = check_training_approach(rdd_training_approach)
        self.export_directory = export_directory
        self.repartition = parse_repartition(repartition)
        self.encoding_debug_mode = bool(encoding_debug_mode)
        self.collect_training_stats = bool(collect_training_stats)
        self.check_replicas = bool(check_replicas)
        self.loggers = check_loggers(loggers)  # metrics sinks (psrv.spark.observe.metrics), on the driver
        self.progress = check_progress(progress)  # live progress on stderr during fit (observe.progress)
        self.training_stats: list[dict[str, Any]] = []
        self.last_score: float | None = None
        self.last_fit: dict[str, Any] = {}
        self._fault_kill_after_steps: int | None = None  # test-only hook, see _maybe_kill
        self._session_id = uuid.uuid4().hex
        self._exports = ExportCache()  # exports of the data fitted, reused by later fits
        self._live: LiveController | None = None  # the controller of the fit(epochs=N) call running now
        self._controller_per_epoch = False  # benchmark hook: the old setup, one controller per epoch
        self.controller_starts = 0  # controllers this master started (one per fit(epochs=N) call)

    def delete_temp_files(self) -> int:
        """Remove the exports psrv wrote in its default location (never a user's export_directory)."""
        return self._exports.delete_temp_files()

    def __repr__(self) -> str:
        return (f"SharedTrainingMaster(batch_size_per_worker={self.batch_size_per_worker}, "
                f"mesh={self.conf.mesh_build_mode!r}, approach={self.rdd_training_approach!r})")

    def workers(self, spark_context: SparkContext) -> int:
        return self.num_workers or max(1, int(spark_context.defaultParallelism))

    # -- entry points ------------------------------------------------------------------------------
    def execute_training(self, spark_context: SparkContext, network: Any, rdd: RDD) -> None:
        workers = self.workers(spark_context)
        data = repartition_rdd(rdd, workers, self.repartition, "balanced")
        if self.rdd_training_approach == "export" and not files_backed(rdd):  # Parquet: read in the tasks
            started = time.time()
            paths = self._exports.minibatch_paths(rdd, data, self.batch_size_per_worker,
                                                  self.export_directory,
                                                  self.repartition)  # reused when this data was exported
            self._driver_event("export", started, time.time(), minibatches=len(paths))
            self.train_epoch_on_paths(spark_context, network, paths, FileDataSetLoader())
        else:
            self.train_epoch_on_partitions(spark_context, network, data)

    def execute_training_paths(self, spark_context: SparkContext, network: Any, paths_rdd: RDD,
                               loader: Any | None = None) -> None:
        workers = self.workers(spark_context)
        data = repartition_rdd(paths_rdd, workers, self.repartition, "balanced")
        self._run(spark_context, network, data, loader or FileDataSetLoader())
        network.epoch = network.epoch + 1

    # -- one fit call, many epochs ----------------------------------------------------------------
    @contextmanager
    def controller_for_call(self, spark_context: SparkContext, network: Any) -> Iterator[None]:
        """Keep one controller (one set of keys, the master copy) for every epoch trained inside.

        ``SparkNetwork.fit(epochs=N)`` trains inside it: each epoch's job joins the running controller
        (psrv.spark.driver.live_controller). Outside it, or with ``_controller_per_epoch`` (the old per-epoch
        setup, kept for the benchmark), each job starts and stops its own controller.
        """
        if self._live is not None or self._controller_per_epoch:
            yield
            return
        live = self._start_controller(spark_context, network, kept=True)
        self._live = live
        try:
            yield
        finally:
            self._live = None
            live.controller.stop()

    def train_epoch_on_paths(self, spark_context: SparkContext, network: Any, paths: list[str],
                             loader: Any | None = None) -> None:
        """One epoch over minibatch files listed on the driver (an export made once per call): shuffled
        as ``execute_training`` shuffles them, dealt to the workers without another Spark job."""
        if not paths:
            raise SparkInputError("fit: the data holds no minibatch (empty RDD)")
        workers = self.workers(spark_context)
        rng = np.random.default_rng([int(network.seed), int(network.epoch), 29])
        order = rng.permutation(len(paths))
        paths_rdd = spark_context.parallelize([paths[i] for i in order], min(workers, len(paths)))
        self._run(spark_context, network, paths_rdd, loader or FileDataSetLoader())
        network.epoch = network.epoch + 1

    def train_epoch_on_partitions(self, spark_context: SparkContext, network: Any, data: RDD) -> None:
        """One epoch over data already partitioned for the workers (and cached) once per call."""
        batch_size = self.batch_size_per_worker
        self._run(spark_context, network, data.mapPartitions(lambda items: rebatch(items, batch_size)), None)
        network.epoch = network.epoch + 1

    def _start_controller(self, spark_context: SparkContext, network: Any, kept: bool) -> LiveController:
        started = time.time()
        live = start_controller(self.conf, spark_context, network, kept)
        self.controller_starts += 1
        self._driver_event("controller_start", started, time.time(), kept=kept)
        return live

    # -- one distributed job -----------------------------------------------------------------------
    def _run(self, spark_context: SparkContext, network: Any, data: RDD, loader: Any | None) -> None:
        live = self._live if self._live is not None else self._start_controller(spark_context, network,
                                                                                 kept=False)
        live.begin_epoch(network)
        controller, address = live.controller, live.address
        setup = WorkerSetup(
            job_id=uuid.uuid4().hex[:8],
            controller_address=address,
            transport=self.conf.transport_config(host=None, port=0, keys=live.keys),
            network_mask=self.conf.network_mask,
            payload=NetworkPayload.from_network(network, with_updater=True),
            threshold_state=self.threshold_algorithm.get_state(),
            post_processor_state=self.residual_post_processor.get_state(),
            prefetch=self.worker_prefetch_num_batches,
            debug=self.encoding_debug_mode,
            collect_stats=self.collect_training_stats or bool(self.loggers),
            fault_kill_after_steps=self._fault_kill_after_steps,
            session_id=f"{self._session_id}:{lineage(network)}",  # residuals belong to one network
            check_replicas=self.check_replicas,
            extra={"device_sharing": bool(getattr(self, "_force_device_sharing", False))},  # test-only
        )
        broadcast = spark_context.broadcast(setup)
        started = time.time()
        try:
            job = data.mapPartitions(_partition_trainer(broadcast, loader))
            with LiveProgress.for_controller(controller, self.progress,
                                             description=f"psrv fit (epoch {int(network.epoch)})") as shown:
                results = self._collect_with_watchdog(spark_context, job, controller, address,
                                                      live.joins_before)
                shown.finish_with(sum(r.steps for r in results), sum(r.examples for r in results))
            sent = sum(int(r.counters.get("updates_sent", r.messages)) for r in results)
            # a kept controller keeps what arrives after the drain for the next epoch: no quiet period
            self._drain(controller, live.applied_before + sent, quiet_s=0.0 if live.kept else _DRAIN_QUIET_S)
            with controller.lock:
                final = np.array(controller.params, copy=True)
            controller_counters = live.epoch_counters()
            controller_counters["member_names"] = controller.member_names()
        finally:
            if not live.kept:
                controller.stop()
            broadcast.unpersist()
        self._finish(network, setup, results, sent, final, controller_counters, started)
        live.end_epoch(network)
        self.last_fit["controller_reused"] = live.kept and live.epochs > 1

    def _collect_with_watchdog(self, spark_context: SparkContext, job: RDD, controller: Any,
                               address: str, joins_before: int = 0) -> list[WorkerResult]:
        """Run the job; cancel it if no worker reached the controller within the join timeout."""
        group = f"psrv-shared-{uuid.uuid4().hex[:8]}"
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                spark_context.setJobGroup(group, "psrv gradient sharing", interruptOnCancel=True)
                outcome["results"] = job.collect()
            except BaseException as exc:  # handed to the driver thread
                outcome["error"] = exc

        thread = threading.Thread(target=run, name="psrv-shared-training-job", daemon=True)
        thread.start()
        clock = TaskStartClock(spark_context, group)  # the join timeout counts from the tasks' start
        unreachable = False
        while thread.is_alive():
            thread.join(0.25)
            tasks_started = clock.started()
            if not unreachable and tasks_started is not None \
                    and time.monotonic() > tasks_started + self.conf.join_timeout_ms / 1000.0 \
                    + _TASK_STARTUP_SLACK_S \
                    and controller.counters_["joins"] == joins_before and thread.is_alive():
                unreachable = True
                spark_context.cancelJobGroup(group)
        thread.join()
        if unreachable or (controller.counters_["joins"] == joins_before and "error" in outcome
                           and "ControllerUnreachableError" in str(outcome["error"])):
            raise ControllerUnreachableError(
                f"no worker reached the psrv controller at {address} within "
                f"{self.conf.join_timeout_ms / 1000.0:.0f} s (network mask {self.conf.network_mask!r}); "
                "check VoidConfiguration.controller_address / network_mask and firewalls"
            ) from outcome.get("error")
        if "error" in outcome:
            raise TrainingJobError(f"gradient-sharing job failed: {_first_line(outcome['error'])}") \
                from outcome["error"]
        return outcome["results"]

    def _drain(self, controller: Any, expected: int, quiet_s: float = _DRAIN_QUIET_S) -> None:
        """Wait until the controller applied ``expected`` updates in all (those the finished workers
        sent included), then ``quiet_s`` without a new one (late updates of failed attempts).

        Bounded by a few heartbeats: an update still missing then was lost in flight (see README).
        """
        deadline = time.monotonic() + max(_DRAIN_MIN_S, 3 * self.conf.heartbeat_ms / 1000.0)
        last, quiet_since = -1, time.monotonic()
        while time.monotonic() < deadline:
            applied = controller.counters_["updates_applied"]
            if applied != last:
                last, quiet_since = applied, time.monotonic()
            if applied >= expected and time.monotonic() - quiet_since >= quiet_s:
                return
            time.sleep(0.05)
        log.warning("controller applied %d of %d updates before the drain deadline", last, expected)

    def _finish(self, network: Any, setup: WorkerSetup, results: list[WorkerResult], sent: int,
                final: np.ndarray, controller_counters: dict[str, Any], started: float) -> None:
        network.set_params(final.astype(network.params.dtype))
        if results:
            updater = np.mean([r.updater_state for r in results], axis=0)
            network.set_updater_state(updater.astype(network.updater_state.dtype))
            algorithm = type(self.threshold_algorithm)
            self.threshold_algorithm = algorithm.average([r.threshold_state for r in results])
            # buffers (BatchNorm statistics) are not shared by the mesh: the driver gets their average
            # over the workers' final values (integer counters rounded)
            summed = None
            for r in results:
                summed = add_buffers(summed, r.buffers)
            if summed is not None:
                network.set_buffers(mean_buffers(summed, sum(r.buffers is not None for r in results)))
        self.last_worker_buffers = [r.buffers for r in results]  # what each worker reported (host copies)
        steps = sum(r.steps for r in results)
        examples = sum(r.examples for r in results)
        set_counters(network, setup.payload.iteration + max((r.steps for r in results), default=0),
                     setup.payload.epoch)
        self.last_score = sum(r.loss_sum for r in results) / examples if examples else None
        bytes_sent = sum(r.bytes_sent for r in results)
        dense = steps * network.num_params * network.params.dtype.itemsize
        self.last_fit = {
            "workers": len(results), "steps": steps, "examples": examples,
            "messages": sum(r.messages for r in results),
            "bytes_sent": bytes_sent, "dense_bytes": dense, "score": self.last_score,
            "controller_updates_applied": controller_counters.get("updates_applied"),
            **_accounting(setup.job_id, results, sent, controller_counters),
            "threshold": float(self.threshold_algorithm.threshold),
            **_replica_summary(results),
        }
        relay_worker_logs(record for r in results for record in r.logs)
        if self.collect_training_stats:
            for r in results:
                self.training_stats.extend(r.events)
        publish_shared_fit(self.loggers, network, setup.payload.epoch, results, self.last_fit,
                           controller_counters, time.time() - started)
        self._driver_event("training_job", started, time.time(), workers=len(results), steps=steps)
        log.info("gradient sharing fit: %s", self.last_fit)

    def _driver_event(self, kind: str, start: float, end: float, **fields: Any) -> None:
        if self.collect_training_stats:
            self.training_stats.append(driver_event(kind, start, end, **fields))


def _replica_summary(results: list[WorkerResult]) -> dict[str, Any]:
    """What the tasks' replica checks found; a divergence is logged loudly (it is a bug, never noise)."""
    checks = [(r.partition, r.replica) for r in results if r.replica is not None]
    compared = [(p, c) for p, c in checks if c["status"] in ("equal", "differs")]
    diverged = [(p, c) for p, c in compared if c["status"] == "differs"]
    worst = max((float(c["relative_l2"]) for _, c in compared if c["relative_l2"] is not None), default=None)
    if diverged:
        log.error(
            "REPLICA DIVERGENCE: %d of %d checked replicas differ from the master copy (worst relative L2 "
            "%.3g): %s. The updates of gradient sharing were not applied alike everywhere; please report.",
            len(diverged), len(compared), worst,
            "; ".join(f"partition {p}: {c['detail']}" for p, c in diverged[:8]),
        )
    unchecked = [(p, c) for p, c in checks if c["status"] not in ("equal", "differs")]
    if unchecked:
        log.warning("%d replica check(s) could not compare: %s", len(unchecked),
                    "; ".join(f"partition {p}: {c['status']} ({c['detail']})" for p, c in unchecked[:8]))
    return {
        "replicas_checked": len(compared),
        "replicas_diverged": len(diverged),
        "replicas_unchecked": len(unchecked),
        "replica_max_relative_l2": worst,
    }


def _accounting(job_id: str, results: list[WorkerResult], sent: int,
                controller_counters: dict[str, Any]) -> dict[str, Any]:
    """What the master copy holds, by attempt: a failed attempt's updates that reached the controller
    stay applied (README), so they are counted apart; ``updates_missing`` compares what the
    successful attempts sent with what of theirs the master applied."""
    applied = controller_counters.get("applied_by_origin") or {}
    names = controller_counters.get("member_names") or {}
    finished = {int(i) for r in results for i in r.counters.get("node_ids", ())}
    from_finished = sum(int(applied.get(i, 0)) for i in finished)
    prefix = f"{job_id}-p"
    failed_parts = {int(name[len(prefix):]) for i, name in names.items()
                    if i not in finished and name and name.startswith(prefix)
                    and name[len(prefix):].isdigit()}
    by_failed = sum(int(n) for i, n in applied.items() if int(i) not in finished)
    retried = {r.partition for r in results if r.attempt > 0} | failed_parts
    return {
        "updates_missing": max(0, sent - from_finished),
        "updates_applied_by_failed_attempts": by_failed,
        "retried_partitions": sorted(retried),
    }


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        if "Error" in line and ("psrv" in line or "Exception" in line):
            return line.strip()[:500]
    return (text.splitlines() or [repr(error)])[0][:500]


__all__ = ["SharedTrainingMaster", "VoidConfiguration", "WorkerResult", "WorkerSetup"]
