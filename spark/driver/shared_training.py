"""Gradient sharing on Spark (DL4J's SharedTrainingMaster): threshold-encoded updates over a ZeroMQ mesh.

The driver starts a controller holding the master copy of the parameters and ships the
configuration, CurveZMQ keys and initial parameters to the tasks. Each partition's task starts a
node pointed at the controller (which downloads the current parameters: a retried task catches up),
trains over its data with a prefetching iterator, encodes every update with its residual, applies
the encoded update locally and submits it, then leaves (psrv.spark.task.sharing, what this master
maps over the partitions). ``fit`` returns when the job ends; the
driver's network then holds the controller's parameters, the workers' averaged updater state and
the averaged threshold state. ``fit(epochs=N)`` runs one job per epoch but keeps one controller (its
keys, the master copy) for the whole call (``controller_for_call``, psrv.spark.driver.live_controller).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np
from psrv.encoding import ResidualClipping, shared_training_threshold
from psrv.encoding.thresholds import describe_threshold
from psrv.nn.data import FileDataSetLoader
from psrv.nn.protocol import TrainableNetwork
from psrv.spark import strategies
from psrv.spark.config import VoidConfiguration
from psrv.spark.data.batching import check_batch_size, rebatch
from psrv.spark.data.export import ExportCache, check_training_approach
from psrv.spark.data.storage_level import DEFAULT_STORAGE_LEVEL, check_storage_level
from psrv.spark.driver import shipping
from psrv.spark.driver.crowded_hosts import LOCAL_WORKERS_FIX, CrowdingWarnings, hosts_of
from psrv.spark.driver.job_errors import fatal_error
from psrv.spark.driver.live_controller import LiveController, start_controller
from psrv.spark.driver.master import driver_event, epoch_input
from psrv.spark.driver.partitioning import parse_repartition, repartition_rdd
from psrv.spark.driver.stepping import (
    check_local_steps,
    check_scale_momentum,
    check_step_from,
    choose_local_steps,
    momentum_workers,
    side_by_side,
)
from psrv.spark.driver.task_clock import TaskStartClock
from psrv.spark.errors import (
    ControllerUnreachableError,
    SparkConfigError,
    SparkInputError,
    TrainingJobError,
)
from psrv.spark.observe.metrics import check_loggers, publish_shared_fit
from psrv.spark.observe.progress import LiveProgress, check_progress
from psrv.spark.observe.stats import on_driver_clock
from psrv.spark.observe.worker_logs import relay_worker_logs
from psrv.spark.payload import NetworkPayload, add_buffers, lineage, mean_buffers, set_counters
from psrv.spark.task.failures import fatal_report
from psrv.spark.task.local_workers import check_workers_per_node
from psrv.spark.task.prefetch import check_prefetch_num_batches
from psrv.spark.task.results import WorkerResult
from psrv.spark.task.setup import WorkerSetup
from psrv.spark.task.sharing import SharingTrainer

if TYPE_CHECKING:
    from pyspark import RDD, Broadcast, SparkContext

log = logging.getLogger(__name__)

_DRAIN_QUIET_S = 0.5
_DRAIN_MIN_S = 2.0
# The driver's watchdog is a backstop: a task's own join deadline (join_timeout_ms from the node's start)
# fails it first. A task's Python worker may take tens of seconds to start and import torch on a busy
# executor, after Spark counts the task as started; the watchdog leaves it that long.
_TASK_STARTUP_SLACK_S = 60.0
_FATAL_POLL_S = 0.5  # how often the driver looks for a task's fatal error in the heartbeats


class SharedTrainingMaster:
    """Asynchronous data-parallel training by sharing threshold-encoded updates (gradient sharing).

    The default threshold, ``psrv.encoding.shared_training_threshold()``
    (``SampledQuantileThreshold(sparsity=0.03, byte_budget=0.01)``), takes tau from each worker's
    residual every step: about 3 % of the elements per message, which the packed wire form carries in
    about 7.6 bits each (under 1/100 of a dense exchange's bytes), and no dense first messages; on a
    model below about 2,000 parameters, where a message's header weighs more, fewer elements, so that
    a message stays within 1/100 of a dense update. DL4J's,
    ``threshold_algorithm=psrv.encoding.dl4j_threshold()`` (``AdaptiveThreshold(1e-3)``), starts at tau =
    1e-3 and sends bitmaps while Adam's first steps are larger than that. The residual post-processor is
    DL4J's ``ResidualClipping(5, 5)``. README's "How much a step learns" measures both.

    ``step_from="own"`` (the default) computes each worker's step where its own steps took it: its
    replica plus its residual (what it has not sent yet), so a worker never repeats a step the sparse
    messages have not yet carried; the replica itself only ever holds what was sent, so every replica
    still equals the master copy. ``step_from="shared"`` steps from the replica alone, as DL4J does.
    "own" needs a ``TorchNetwork`` (CPU or GPU, local workers included); a ``psrv.nn.Network`` steps from
    the replica and its task says so in its log (``last_fit["step_from"]`` counts the tasks of each kind).

    ``scale_momentum=True`` (the default) sets each worker's momentum to the one it was given raised to
    the power of the workers sharing (0.9 becomes 0.81 with 2 workers, 0.43 with 8): Adam's beta1 (any
    optimizer with ``betas``, or a ``psrv.nn`` Adam), and SGD's momentum (torch's ``SGD``, a ``psrv.nn``
    Nesterov) or RMSprop's with its learning rate times (1 - momentum ** N) / (1 - momentum), which
    keeps the step's size. With N workers every replica takes N steps in the time each worker takes
    one, and the coefficient that forgets like one process per minibatch is beta ** N
    (psrv.nn.momentum; README's "How much a step learns"). RMSprop with momentum also starts its square
    average at the first gradient's square, not at zero: torch's uncorrected zero start inflates the
    first steps, and a worker's start lasts N times as many of the cluster's minibatches.
    ``scale_momentum=False`` keeps the optimizer as given, as DL4J does: DL4J's behaviour as a whole is
    ``threshold_algorithm=dl4j_threshold(), step_from="shared", scale_momentum=False, local_steps=1``.
    The driver's network is never changed; ``last_fit["momentum"]`` says what the workers used.

    ``local_steps=K`` has each worker split every minibatch into K pieces, take K optimizer steps on
    them in turn (each from where the last left its point) and send their sum as one message: the bytes
    of one message a minibatch, the steps of minibatches K times smaller. With N workers each worker
    takes 1/N of one process's steps per epoch; K local steps give K times as many, at K forward,
    backward and optimizer passes of a piece where one step takes one of the whole minibatch (README's
    "Several optimizer steps a message"). ``local_steps="auto"`` (the default) takes 2 where they were
    measured to help and cost little: a ``TorchNetwork`` of at most 500,000 parameters whose optimizer is
    of Adam's kind, RMSprop, or SGD with at most 4 workers stepping side by side, on minibatches of 16 rows
    or more; 1 elsewhere (a larger model, SGD with more workers, another optimizer, a
    ``psrv.nn.Network``). The driver decides once per job and logs why (``last_fit["local_steps_rule"]``;
    ``last_fit["local_steps"]`` counts the tasks of each kind). A network whose step takes no
    ``local_steps`` takes one step a message, and its task says so in its log. Progress and
    ``network.iteration`` count minibatches (messages); the optimizer's own step count grows by K.

    ``workers_per_node=N`` trains N local workers in each task (one per GPU it holds, else threads)
    behind its one mesh member: their steps are summed before one message goes on the wire
    (psrv.spark.task.local_workers; README's "Several workers per node").
    """

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
        workers_per_node: int = 1,
        storage_level: Any = DEFAULT_STORAGE_LEVEL,
        step_from: str = "own",
        scale_momentum: bool = True,
        local_steps: int | str = "auto",
    ) -> None:
        self.conf = conf if conf is not None else VoidConfiguration()
        if not isinstance(self.conf, VoidConfiguration):
            raise SparkConfigError(f"conf: expected a VoidConfiguration, got {type(conf).__name__}")
        self.batch_size_per_worker = check_batch_size(batch_size_per_worker, "batch_size_per_worker")
        if num_workers is not None:
            check_batch_size(num_workers, "num_workers")
        self.num_workers = num_workers
        self.threshold_algorithm = threshold_algorithm if threshold_algorithm is not None \
            else shared_training_threshold()
        self.residual_post_processor = residual_post_processor if residual_post_processor is not None \
            else ResidualClipping(5, 5)
        for name, value in (("threshold_algorithm", self.threshold_algorithm),
                            ("residual_post_processor", self.residual_post_processor)):
            shipping.check_strategy(name, value)  # the Protocol's members, a state that travels
        self.worker_prefetch_num_batches = check_prefetch_num_batches(worker_prefetch_num_batches)
        self.rdd_training_approach = check_training_approach(rdd_training_approach)
        self.export_directory = export_directory
        self.storage_level = check_storage_level(storage_level)  # "direct" over several epochs
        self.repartition = parse_repartition(repartition)
        self.repartition_strategy = "balanced"  # every worker gets as many elements
        self.encoding_debug_mode = bool(encoding_debug_mode)
        self.collect_training_stats = bool(collect_training_stats)
        self.check_replicas = bool(check_replicas)
        self.loggers = check_loggers(loggers)  # metrics sinks (psrv.spark.observe.metrics), on the driver
        self.progress = check_progress(progress)  # live progress on stderr during fit (observe.progress)
        self.workers_per_node = check_workers_per_node(workers_per_node)  # trainers behind each member
        self._crowding = CrowdingWarnings(LOCAL_WORKERS_FIX)  # more tasks on a host than cores: said once
        self.step_from = check_step_from(step_from)
        self.scale_momentum = check_scale_momentum(scale_momentum)
        self.local_steps = check_local_steps(local_steps)
        self.training_stats: list[dict[str, Any]] = []
        self.last_score: float | None = None
        self.last_fit: dict[str, Any] = {}
        self._session_id = uuid.uuid4().hex
        self._exports = ExportCache()  # exports of the data fitted, reused by later fits
        self._live: LiveController | None = None  # the controller of the fit(epochs=N) call running now
        self.controller_starts = 0  # controllers this master started (one per fit(epochs=N) call)

    def delete_temp_files(self) -> int:
        """Remove the exports psrv wrote in its default location (never a user's export_directory)."""
        return self._exports.delete_temp_files()

    def __repr__(self) -> str:
        return (f"SharedTrainingMaster(batch_size_per_worker={self.batch_size_per_worker}, "
                f"mesh={self.conf.mesh_build_mode!r}, approach={self.rdd_training_approach!r})")

    def workers(self, spark_context: SparkContext) -> int:
        """``num_workers``, or Spark's default parallelism (the total executor cores)."""
        return self.num_workers or max(1, int(spark_context.defaultParallelism))

    # -- entry points ------------------------------------------------------------------------------
    def execute_training(self, spark_context: SparkContext, network: TrainableNetwork, rdd: RDD) -> None:
        paths, data = epoch_input(self, spark_context, rdd, self._exports, self.repartition)
        if paths is not None:
            self.train_epoch_on_paths(spark_context, network, paths, FileDataSetLoader())
        else:
            self.train_epoch_on_partitions(spark_context, network, data)

    def execute_training_paths(self, spark_context: SparkContext, network: TrainableNetwork, paths_rdd: RDD,
                               loader: Any | None = None) -> None:
        workers = self.workers(spark_context)
        data = repartition_rdd(paths_rdd, workers, self.repartition, "balanced")
        self._run(spark_context, network, data, loader or FileDataSetLoader())
        network.epoch = network.epoch + 1

    # -- one fit call, many epochs ----------------------------------------------------------------
    @contextmanager
    def controller_for_call(self, spark_context: SparkContext, network: TrainableNetwork) -> Iterator[None]:
        """Keep one controller (one set of keys, the master copy) for every epoch trained inside.

        ``SparkNetwork.fit(epochs=N)`` trains inside it: each epoch's job joins the running controller
        (psrv.spark.driver.live_controller). Outside it, each job starts and stops its own controller.
        """
        if self._live is not None:
            yield
            return
        live = self._start_controller(spark_context, network, kept=True)
        self._live = live
        try:
            yield
        finally:
            self._live = None
            live.controller.stop()

    def train_epoch_on_paths(self, spark_context: SparkContext, network: TrainableNetwork,
                             paths: Sequence[str],
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

    def train_epoch_on_partitions(self, spark_context: SparkContext, network: TrainableNetwork,
                                  data: RDD) -> None:
        """One epoch over data already partitioned for the workers (and cached) once per call."""
        batch_size = self.batch_size_per_worker
        self._run(spark_context, network, data.mapPartitions(lambda items: rebatch(items, batch_size)), None)
        network.epoch = network.epoch + 1

    def _start_controller(self, spark_context: SparkContext, network: TrainableNetwork,
                          kept: bool) -> LiveController:
        started = time.time()
        live = start_controller(self.conf, spark_context, network, kept)
        self.controller_starts += 1
        self.record_driver_event("controller_start", started, time.time(), kept=kept)
        return live

    # -- one distributed job -----------------------------------------------------------------------
    def _run(self, spark_context: SparkContext, network: TrainableNetwork, data: RDD,
             loader: Any | None) -> None:
        live = self._live if self._live is not None else self._start_controller(spark_context, network,
                                                                                 kept=False)
        live.begin_epoch(network)
        controller, address = live.controller, live.address
        chosen = (self.threshold_algorithm, self.residual_post_processor)
        for name, strategy in zip(("threshold_algorithm", "residual_post_processor"), chosen, strict=True):
            shipping.check_strategy(name, strategy, spark_context)  # the executors can import or rebuild it
        # "auto" is decided here, on the driver's network, once for every task of the job
        beside = side_by_side(data.getNumPartitions(), int(spark_context.defaultParallelism),
                              self.workers_per_node)
        local_steps, local_steps_rule = choose_local_steps(self.local_steps, network,
                                                           self.batch_size_per_worker, beside)
        log.info("gradient sharing: %s", local_steps_rule)
        threshold_rule = describe_threshold(self.threshold_algorithm, network.num_params)
        log.info("gradient sharing: %s", threshold_rule)
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
            session_id=f"{self._session_id}:{lineage(network)}",  # residuals belong to one network
            check_replicas=self.check_replicas,
            strategy_classes=strategies.classes_to_bytes(chosen),  # a user's classes travel by value
            workers_per_node=self.workers_per_node,
            step_from=self.step_from,
            momentum_workers=momentum_workers(self.scale_momentum, data.getNumPartitions(),
                                              int(spark_context.defaultParallelism), self.workers_per_node),
            local_steps=local_steps,
        )
        broadcast = spark_context.broadcast(setup)
        self._crowding.before_job(str(spark_context.master),  # the tasks that can run at once
                                  min(data.getNumPartitions(), int(spark_context.defaultParallelism)))
        started = time.time()
        try:
            job = data.mapPartitions(self.task_trainer(broadcast, loader))
            epoch = int(network.epoch) + 1  # 1-based, as the history and the checkpoint names count
            with LiveProgress.for_controller(controller, self.progress, epoch=epoch,
                                             description=f"psrv fit (epoch {epoch})") as shown:
                results = self._collect_with_watchdog(spark_context, job, controller, address,
                                                      live.joins_before, setup.job_id)
                shown.finish_with(sum(r.steps for r in results), sum(r.examples for r in results),
                                  len(results))
            # what the workers submitted (the node's ``updates_sent`` leaves out what it held while
            # rejoining and never got to send: counting it would hide exactly those)
            sent = sum(r.messages for r in results)
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
        self._finish(network, setup, results, sent, final, controller_counters, started,
                     local_steps_rule=local_steps_rule, threshold_rule=threshold_rule)
        live.end_epoch(network)
        self.last_fit["controller_reused"] = live.kept and live.epochs > 1

    def task_trainer(self, setup: Broadcast, loader: Any | None) -> SharingTrainer:
        """The function the training job maps over the partitions (a subclass may observe its tasks)."""
        return SharingTrainer(setup, loader)

    def _collect_with_watchdog(self, spark_context: SparkContext, job: RDD, controller: Any,
                               address: str, joins_before: int = 0, job_id: str | None = None
                               ) -> list[WorkerResult]:
        """Run the job; cancel it if no worker reached the controller within the join timeout, or as soon
        as a task reports a fatal error (the user's code raised, a NaN): Spark's retries would only
        raise it again, each after a task's start-up."""
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
        fatal: str | None = None
        next_look = time.monotonic()
        while thread.is_alive():
            thread.join(0.25)
            if fatal is None and job_id is not None and thread.is_alive() and time.monotonic() >= next_look:
                next_look = time.monotonic() + _FATAL_POLL_S
                with contextlib.suppress(Exception):  # a busy controller: look again next time
                    fatal = fatal_report(controller.node_stats(), job_id)
                if fatal is not None:
                    spark_context.cancelJobGroup(group)
            tasks_started = clock.started()
            if not unreachable and tasks_started is not None \
                    and time.monotonic() > tasks_started + self.conf.join_timeout_ms / 1000.0 \
                    + _TASK_STARTUP_SLACK_S \
                    and controller.counters_["joins"] == joins_before and thread.is_alive():
                unreachable = True
                spark_context.cancelJobGroup(group)
        thread.join()
        if fatal is not None and "error" in outcome:
            raise fatal_error(fatal, "cancelled the job") from outcome["error"]
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

    def _finish(self, network: TrainableNetwork, setup: WorkerSetup, results: list[WorkerResult], sent: int,
                final: np.ndarray, controller_counters: dict[str, Any], started: float,
                local_steps_rule: str = "", threshold_rule: str = "") -> None:
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
        # each local worker counts its own steps, as a member of its own would
        set_counters(network, setup.payload.iteration
                     + max((-(-r.steps // r.local_workers) for r in results), default=0), setup.payload.epoch)
        self.last_score = sum(r.loss_sum for r in results) / examples if examples else None
        bytes_sent = sum(r.bytes_sent for r in results)
        dense = steps * network.num_params * network.params.dtype.itemsize
        self.last_fit = {
            "workers": len(results), "local_workers": sum(r.local_workers for r in results),
            "steps": steps, "examples": examples,
            "messages": sum(r.messages for r in results),
            "bytes_sent": bytes_sent, "dense_bytes": dense, "score": self.last_score,
            # every frame the workers' nodes sent (updates in their wire form, heartbeats, join, leave),
            # and of it the heartbeats' (liveness and stats, about one a second per node)
            "wire_bytes": sum(int(r.counters.get("bytes_out", 0)) for r in results),
            "heartbeat_bytes": sum(int(r.counters.get("heartbeat_bytes_out", 0)) for r in results),
            "controller_updates_applied": controller_counters.get("updates_applied"),
            **_accounting(setup.job_id, results, sent, controller_counters),
            "threshold": float(self.threshold_algorithm.threshold),
            "step_from": dict(Counter(r.step_from for r in results)),
            "momentum_workers": setup.momentum_workers,
            "local_steps": dict(Counter(r.local_steps for r in results)),
            "local_steps_rule": local_steps_rule,
            "threshold_rule": threshold_rule,
            "momentum": next((r.momentum for r in results if r.momentum), []),
            "hosts": hosts_of(results),
            **_replica_summary(results),
        }
        self._crowding.after_fit(self.last_fit["hosts"])
        relay_worker_logs(record for r in results for record in r.logs)
        if self.collect_training_stats:
            for r in results:  # each worker's times onto the driver's clock (the controller's)
                counters = r.counters or {}
                self.training_stats.extend(on_driver_clock(r.events, counters.get("clock_offset_s"),
                                                           counters.get("clock_error_s")))
        publish_shared_fit(self.loggers, network, setup.payload.epoch + 1, results, self.last_fit,
                           controller_counters, time.time() - started)
        self.record_driver_event("training_job", started, time.time(), workers=len(results), steps=steps)
        log.info("gradient sharing fit: %s", self.last_fit)

    def record_driver_event(self, kind: str, start: float, end: float, **fields: Any) -> None:
        """Add a driver event to ``training_stats`` (with ``collect_training_stats``)."""
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
    stay applied (README), so they are counted apart; ``updates_missing`` is what the successful
    attempts submitted minus what of theirs (under every id their nodes held) the master applied,
    exactly: negative would mean an update applied twice, logged as the bug it is."""
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
    if from_finished > sent:
        log.error("the master applied %d updates of the finished tasks, which submitted only %d: an "
                  "update was applied twice; please report", from_finished, sent)
    return {
        "mesh_members": sum(1 for name in names.values() if name and name.startswith(prefix)),
        "updates_missing": sent - from_finished,
        "updates_applied_by_failed_attempts": by_failed,
        "retried_partitions": sorted(retried),
    }


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    for line in text.splitlines():
        if "Error" in line and ("psrv" in line or "Exception" in line):
            return line.strip()[:500]
    return (text.splitlines() or [repr(error)])[0][:500]


__all__ = ["SharedTrainingMaster"]
