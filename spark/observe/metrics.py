"""Metrics sinks: what a fit measured, handed to TensorBoard, MLflow or any object with ``on_metrics``.

A sink is anything with ``on_metrics(step, epoch, metrics)`` (and optionally ``close()``); the
training masters call it on the driver after each fit (gradient sharing) or averaging round, with
one call per global step that has something to say. Metric names are ``group/name``:

- ``master/…``  the driver's view: ``loss`` (mean over the fit's examples), ``threshold``,
  ``updates_applied`` (to the master copy), ``bytes_sent`` / ``bytes_received`` (the controller's
  sockets), ``examples_per_s``, ``workers``
- ``worker/p<partition>/…``  per step: ``loss``, ``threshold``, ``sparsity`` (elements sent /
  parameters), ``bytes_sent`` (the encoded message); at the worker's last step its totals
  ``bytes_sent_total``, ``bytes_received``, ``updates_applied``
- ``validation/…``  whatever :func:`log_validation` is given (accuracy, f1, …)

Sinks run on the driver only, so they never travel to the executors.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from psrv.encoding import message_info
from psrv.spark.errors import SparkConfigError
from psrv.spark.observe.progress import check_progress
from psrv.spark.observe.stats import validation_sample

log = logging.getLogger(__name__)

__all__ = [
    "MLflowLogger",
    "MetricsLogger",
    "TensorBoardLogger",
    "check_loggers",
    "elements_sent",
    "emit",
    "log_validation",
    "master_metrics",
    "publish_validation",
    "worker_step_metrics",
]


@runtime_checkable
class MetricsLogger(Protocol):
    """The sink interface: ``on_metrics(step, epoch, {"group/name": value, ...})``."""

    def on_metrics(self, step: int, epoch: int, metrics: Mapping[str, float]) -> None: ...


def check_loggers(loggers: Any) -> list[Any]:
    """The loggers as a list; a clear error (on the driver, before any job) for anything else."""
    if loggers is None:
        return []
    if isinstance(loggers, MetricsLogger) or not isinstance(loggers, Iterable) or isinstance(loggers, str):
        loggers = [loggers]
    out = list(loggers)
    for item in out:
        if not callable(getattr(item, "on_metrics", None)):
            raise SparkConfigError(
                f"loggers: expected objects with on_metrics(step, epoch, metrics), got {item!r}; use "
                "psrv.spark.observe.metrics.TensorBoardLogger(log_dir) or MLflowLogger(), or your own class"
            )
    return out


def elements_sent(message: Any) -> int:
    """How many elements an encoded message carries: a sparse message says so in its header (word 0,
    form word 3 == 0); a bitmap's must be counted (validating the whole message)."""
    array = np.asarray(message)
    if array.dtype == np.int32 and array.ndim == 1 and array.size >= 4 and int(array[3]) == 0:
        return int(array[0])
    return int(message_info(message).count)


def _finite(value: Any) -> bool:
    return isinstance(value, int | float | np.floating | np.integer) and not isinstance(value, bool) \
        and math.isfinite(float(value))


def emit(loggers: Sequence[Any], calls: Iterable[tuple[int, int, Mapping[str, Any]]]) -> None:
    """Hand every (step, epoch, metrics) to every logger; non-finite values are left out, and a
    failing sink is logged once per call batch, never fails the fit."""
    if not loggers:
        return
    failed: set[int] = set()
    for step, epoch, metrics in calls:
        clean = {str(k): float(v) for k, v in metrics.items() if _finite(v)}
        if not clean:
            continue
        for index, sink in enumerate(loggers):
            if index in failed:
                continue
            try:
                sink.on_metrics(int(step), int(epoch), clean)
            except Exception as exc:  # a sink's problem must not lose the trained network
                failed.add(index)
                log.warning("metrics logger %r failed at step %d: %s", sink, step, exc)
    for index, sink in enumerate(loggers):
        flush = getattr(sink, "flush", None)
        if index not in failed and callable(flush):
            with contextlib.suppress(Exception):
                flush()


def worker_step_metrics(events: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """Per global step, the per-worker metrics the workers' timed events carry ("fit", "encode",
    and the closing "metrics" sample), named ``worker/p<partition>/<name>``."""
    by_step: dict[int, dict[str, float]] = defaultdict(dict)
    for record in events:
        iteration = record.get("iteration")
        if not _finite(iteration):
            continue
        step = int(iteration)
        prefix = f"worker/p{record.get('partition', '?')}"
        kind = record.get("kind")
        values = by_step[step]
        if kind == "fit" and _finite(record.get("loss")):
            values[f"{prefix}/loss"] = float(record["loss"])
        elif kind == "encode":
            names = (("threshold", "threshold"), ("sparsity", "sparsity"), ("bytes", "bytes_sent"))
            for source, name in names:
                if _finite(record.get(source)):
                    values[f"{prefix}/{name}"] = float(record[source])
        elif kind == "metrics":
            for name in ("bytes_sent_total", "bytes_received", "updates_applied"):
                if _finite(record.get(name)):
                    values[f"{prefix}/{name}"] = float(record[name])
    return {step: values for step, values in sorted(by_step.items()) if values}


def master_metrics(summary: Mapping[str, Any], counters: Mapping[str, Any] | None = None,
                   seconds: float | None = None) -> dict[str, float]:
    """The driver's metrics of one fit from the master's summary (``last_fit``) and the controller's
    counters."""
    out: dict[str, float] = {}
    for source, name in (("score", "loss"), ("threshold", "threshold"), ("workers", "workers"),
                         ("examples", "examples"), ("controller_updates_applied", "updates_applied"),
                         ("updates_missing", "updates_missing")):
        if _finite(summary.get(source)):
            out[f"master/{name}"] = float(summary[source])
    if counters:
        for source, name in (("bytes_out", "bytes_sent"), ("bytes_in", "bytes_received")):
            if _finite(counters.get(source)):
                out[f"master/{name}"] = float(counters[source])
    if seconds and seconds > 0 and _finite(summary.get("examples")):
        out["master/examples_per_s"] = float(summary["examples"]) / seconds
    return out


def log_validation(loggers: Any, step: int, epoch: int, evaluation: Any, prefix: str = "validation") -> dict:
    """Hand validation results to the sinks: an Evaluation (accuracy, precision, recall, f1), a
    RegressionEvaluation (mse, mae, rmse, r2, averaged over columns) or a plain dict of numbers.
    Returns the metrics it sent."""
    metrics = evaluation_metrics(evaluation)
    emit(check_loggers(loggers), [(step, epoch, {f"{prefix}/{k}": v for k, v in metrics.items()})])
    return metrics


def publish_validation(master: Any, network: Any, epoch: int, metrics: Mapping[str, float]) -> dict:
    """An epoch's validation metrics (their ``val_*`` entries) to the master's loggers as
    ``validation/<name>``, and to its training statistics (the report's validation chart) when it
    collects them. ``epoch`` is 1-based. Returns what it sent."""
    found = {k.removeprefix("val_"): float(v) for k, v in metrics.items()
             if k.startswith("val_") and _finite(v)}
    if not found:
        return found
    step = int(getattr(network, "iteration", epoch))
    log_validation(list(getattr(master, "loggers", None) or []), step, epoch, found)
    if getattr(master, "collect_training_stats", False):
        master.training_stats.append(validation_sample(time.time(), step, epoch, **found))
    return found


def evaluation_metrics(evaluation: Any) -> dict[str, float]:
    """Numbers worth plotting from an evaluation object or dict (what exists of them)."""
    if isinstance(evaluation, Mapping):
        return {str(k): float(v) for k, v in evaluation.items() if _finite(v)}
    out: dict[str, float] = {}
    for name in ("accuracy", "precision", "recall", "f1", "mean_squared_error", "mean_absolute_error",
                 "root_mean_squared_error", "r_squared", "mse", "mae", "rmse", "r2"):
        method = getattr(evaluation, name, None)
        if method is None:
            continue
        with contextlib.suppress(Exception):
            value = method() if callable(method) else method
            if isinstance(value, np.ndarray | list | tuple):
                value = float(np.mean(value))
            if _finite(value):
                out[name] = float(value)
    return out


def group_calls(step_metrics: Mapping[int, Mapping[str, float]], epoch: int,
                final_step: int, final: Mapping[str, float]) -> list[tuple[int, int, dict[str, float]]]:
    """The on_metrics calls of one fit, in step order; the master's metrics ride on ``final_step``."""
    calls = {step: dict(values) for step, values in step_metrics.items()}
    calls.setdefault(final_step, {}).update(final)
    return [(step, epoch, values) for step, values in sorted(calls.items()) if values]


# -- sinks --------------------------------------------------------------------------------------------

_TAG = re.compile(r"[^A-Za-z0-9_\-./ ]")


class TensorBoardLogger:
    """Scalars into a TensorBoard event file under ``log_dir`` (one tag per metric name).

    Uses ``torch.utils.tensorboard`` (needs the ``tensorboard`` package) or else ``tensorboardX``:
    ``pip install 'psrv[tensorboard]'``. View with ``tensorboard --logdir LOG_DIR``.
    """

    def __init__(self, log_dir: str, *, flush_secs: int = 10) -> None:
        self.log_dir = os.path.abspath(log_dir)
        self._writer = _summary_writer(self.log_dir, flush_secs)

    def __repr__(self) -> str:
        return f"TensorBoardLogger({self.log_dir!r})"

    def on_metrics(self, step: int, epoch: int, metrics: Mapping[str, float]) -> None:
        for name, value in metrics.items():
            self._writer.add_scalar(name, float(value), global_step=int(step))
        self._writer.add_scalar("epoch", float(epoch), global_step=int(step))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def _summary_writer(log_dir: str, flush_secs: int) -> Any:
    problems = []
    try:
        from torch.utils.tensorboard import SummaryWriter

        return SummaryWriter(log_dir=log_dir, flush_secs=flush_secs)
    except ImportError as exc:
        problems.append(f"torch.utils.tensorboard: {exc}")
    try:
        from tensorboardX import SummaryWriter

        return SummaryWriter(logdir=log_dir, flush_secs=flush_secs)
    except ImportError as exc:
        problems.append(f"tensorboardX: {exc}")
    raise SparkConfigError(
        "TensorBoardLogger needs torch + tensorboard, or tensorboardX; install with "
        f"pip install 'psrv[tensorboard]' ({'; '.join(problems)})"
    )


class MLflowLogger:
    """Metrics into an MLflow run (``mlflow.log_metrics`` with ``step``): the active run, or one this
    logger starts in ``experiment`` on ``tracking_uri`` (e.g. ``file:///tmp/mlruns`` or a server).
    ``pip install 'psrv[mlflow]'``. ``close()`` ends a run it started."""

    def __init__(self, tracking_uri: str | None = None, experiment: str | None = "psrv",
                 run_name: str | None = None, run_id: str | None = None) -> None:
        try:
            import mlflow
        except ImportError as exc:
            raise SparkConfigError(f"MLflowLogger needs mlflow: pip install 'psrv[mlflow]' ({exc})") from exc
        self._client = mlflow.MlflowClient(tracking_uri=tracking_uri)
        self._started = False
        if run_id is None:
            active = mlflow.active_run() if tracking_uri is None else None
            if active is not None:
                run_id = active.info.run_id
            else:
                found = self._client.get_experiment_by_name(experiment or "Default")
                experiment_id = found.experiment_id if found is not None \
                    else self._client.create_experiment(experiment or "Default")
                run = self._client.create_run(experiment_id, run_name=run_name)
                run_id = run.info.run_id
                self._started = True
        self.run_id = run_id

    def __repr__(self) -> str:
        return f"MLflowLogger(run_id={self.run_id!r})"

    def on_metrics(self, step: int, epoch: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(_TAG.sub("_", name), float(value), now, int(step)) for name, value in metrics.items()]
        batch.append(Metric("epoch", float(epoch), now, int(step)))
        for start in range(0, len(batch), 1000):  # MLflow's per-request limit
            self._client.log_batch(self.run_id, metrics=batch[start:start + 1000])

    def close(self) -> None:
        if self._started:
            self._client.set_terminated(self.run_id)
            self._started = False


@contextlib.contextmanager
def watching(master: Any, loggers: Any = None, progress: Any = None) -> Iterator[None]:
    """For one ``SparkNetwork.fit``: add ``loggers`` to the master's and override its ``progress``."""
    extra = check_loggers(loggers)
    before_loggers = list(master.loggers or [])
    before_progress = master.progress
    if extra:
        master.loggers = before_loggers + extra
    if progress is not None:
        master.progress = check_progress(progress)
    try:
        yield
    finally:
        if extra:
            master.loggers = before_loggers
        if progress is not None:
            master.progress = before_progress


def publish_shared_fit(loggers: Sequence[Any], network: Any, epoch: int, results: Sequence[Any],
                       summary: Mapping[str, Any], counters: Mapping[str, Any], seconds: float) -> None:
    """The sinks' calls for one gradient-sharing fit: every worker's steps, then the master's metrics
    at the network's iteration after the fit."""
    if not loggers:
        return
    events = [record for result in results for record in result.events]
    final = master_metrics(summary, counters, seconds)
    encodes = [r for r in events if r.get("kind") == "encode" and _finite(r.get("elements"))]
    if encodes and int(network.num_params) > 0:
        final["master/sparsity"] = sum(float(r["elements"]) for r in encodes) / (
            len(encodes) * int(network.num_params))
    calls = group_calls(worker_step_metrics(events), int(epoch), int(network.iteration), final)
    emit(loggers, calls)


def publish_round(loggers: Sequence[Any], network: Any, epoch: int, events: Sequence[Mapping[str, Any]],
                  summary: Mapping[str, Any], seconds: float) -> None:
    """The sinks' calls for one parameter-averaging round (workers' steps, then the averaged loss)."""
    if not loggers:
        return
    calls = group_calls(worker_step_metrics(events), int(epoch), int(network.iteration),
                        master_metrics(summary, None, seconds))
    emit(loggers, calls)
