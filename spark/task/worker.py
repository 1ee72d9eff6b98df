"""What runs inside a Spark task: a per-executor training network, worker identity, timed events."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
from psrv.nn.protocol import TrainableNetwork
from psrv.spark import storage
from psrv.spark.data.batching import as_batch
from psrv.spark.payload import NetworkPayload, takes_device
from psrv.spark.task.device import task_device

_training_networks: dict[str, TrainableNetwork] = {}
_lock = threading.Lock()
_CACHE_SIZE = 4
_cached: OrderedDict[str, TrainableNetwork] = OrderedDict()
_cached_lock = threading.Lock()


def worker_id() -> str:
    """host:pid of the Python worker running this task (one row per worker in the stats timeline)."""
    return f"{socket.gethostname()}:{os.getpid()}"


def host_and_cores() -> tuple[str, int]:
    """(host name, cores this process may run on): where a task ran, for the driver's check that no
    host ran more sharing tasks than it has cores (psrv.spark.driver.crowded_hosts)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this platform
        cores = os.cpu_count() or 1
    return socket.gethostname(), max(1, cores)


def partition_id() -> int:
    """The Spark partition this task works on (-1 outside a Spark task)."""
    from pyspark import TaskContext  # lazy: pyspark's task context, only inside a running task

    context = TaskContext.get()
    return int(context.partitionId()) if context is not None else -1


def training_network(payload: NetworkPayload) -> TrainableNetwork:
    """A network of the payload's architecture holding the payload's parameters, updater state, counters.

    Built once per executor process, driver-side network (the payload's lineage) and device (a torch
    network on the task's device, see psrv.spark.task.device); later tasks of the same network only copy the
    vectors and buffers in. Another network, even of the same architecture, is built afresh from its own
    payload, so nothing of the previous one (optimizer state, buffers) leaks into it.
    """
    device = task_device() if takes_device(payload.factory) else None
    key = json.dumps([payload.lineage, payload.config, str(device)], sort_keys=True, default=str)
    with _lock:
        network = _training_networks.get(key)
    if network is not None and _fits(network, payload):
        payload.load_into(network)
        if payload.updater_state is None:
            network.set_updater_state(np.zeros_like(network.updater_state))
        return network
    network = payload.build(device=device)
    with _lock:
        _training_networks.clear()  # one network at a time: bounded memory
        _training_networks[key] = network
    return network


def cached_network(payload: NetworkPayload) -> TrainableNetwork:
    """The network of ``payload`` for evaluation and inference, built once per executor process (keyed
    by the payload's id; read-only use)."""
    with _cached_lock:
        network = _cached.get(payload.key)
        if network is not None:
            _cached.move_to_end(payload.key)
            return network
    network = payload.build(device=task_device() if takes_device(payload.factory) else None)
    with _cached_lock:
        _cached[payload.key] = network
        while len(_cached) > _CACHE_SIZE:
            _cached.popitem(last=False)
    return network


def _fits(network: TrainableNetwork, payload: NetworkPayload) -> bool:
    """Whether the payload's vectors can be copied into a network built earlier (else: rebuild)."""
    if network.params.shape != payload.params.shape:
        return False
    state = payload.updater_state
    return state is None or state.size == network.updater_state.size


# What a Python worker had not sent yet when its last task of a training master ended; the next
# task of the same master in this process starts from it, so no update mass is dropped between
# epochs (a task on another process starts from zero, as after a crash). Module-level, so that
# closures shipped to executors refer to these functions by name (a lock cannot be pickled).
_carried_residuals: dict[str, Any] = {}
_residual_lock = threading.Lock()


def take_residual(session_id: str) -> Any | None:
    with _residual_lock:
        return _carried_residuals.pop(session_id, None)


def keep_residual(session_id: str, residual: Any) -> None:
    if not isinstance(residual, np.ndarray):  # a device residual (torch): kept on the host between tasks
        residual = residual.detach().cpu().numpy()
    with _residual_lock:
        _carried_residuals.clear()  # one training master per process at a time: bounded memory
        _carried_residuals[session_id] = np.array(residual, copy=True)


class EventLog:
    """Per-worker wall-clock events ({worker, partition, kind, start, end, ...}); off when disabled."""

    def __init__(self, enabled: bool, **common: Any) -> None:
        self.enabled = enabled
        self.common = common
        self.events: list[dict[str, Any]] = []

    def add(self, kind: str, start: float, end: float, **fields: Any) -> None:
        if self.enabled:
            self.events.append({**self.common, "kind": kind, "start": start, "end": end, **fields})

    def now(self) -> float:
        return time.time()


@dataclass(frozen=True)
class PathLoader:
    """A user's loader as it travels to the tasks, with the driver's storage options.

    A loader with ``load_stream(stream, path)`` (psrv's own, or a user's) is handed a readable stream
    opened through the storage layer, so it reads any URI the cluster reaches; a loader with only
    ``load(path)`` gets the path, as before (it must then open the path itself).
    """

    loader: Any
    options: dict[str, dict[str, Any]]

    def load(self, path: str) -> Any:
        storage.configure(self.options)
        if hasattr(self.loader, "load_stream"):
            with storage.open_input(path) as stream:
                return self.loader.load_stream(stream, path)
        return self.loader.load(path)


def path_loader(loader: Any | None) -> PathLoader | None:
    """On the driver: wrap ``loader`` for the tasks (None stays None)."""
    if loader is None or isinstance(loader, PathLoader):
        return loader
    return PathLoader(loader, storage.current_options())


def task_source(items: Iterable[Any], loader: Any | None) -> Iterator[Any] | None:
    """A partition's minibatches (``loader.load(path)`` for each path when a loader is given), or
    None when the partition is empty (such a task does no setup at all)."""
    items = iter(items)
    first = next(items, None)
    if first is None:
        return None
    source = chain((first,), items)
    return (loader.load(path) for path in source) if loader is not None else source


def timed_batches(batches: Iterable[Any], events: EventLog) -> Iterator[tuple[Any, float]]:
    """Each minibatch (a DataSet, or a MultiDataSet of several inputs/outputs) with the time its step
    starts; the wait for it is a "wait" event."""
    iterator = iter(batches)
    while True:
        wait_start = events.now()
        batch = next(iterator, None)
        if batch is None:
            return
        batch = as_batch(batch)
        step_start = events.now()
        events.add("wait", wait_start, step_start)
        yield batch, step_start


__all__ = [
    "EventLog", "PathLoader", "cached_network", "host_and_cores", "keep_residual", "partition_id",
    "path_loader", "take_residual", "task_source", "timed_batches", "training_network", "worker_id",
]
