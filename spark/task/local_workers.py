"""Several workers behind one mesh member (``workers_per_node``): one node, one residual, N trainers.

A task with ``workers_per_node=N`` keeps ONE node (one replica, one residual, one replay ring) and trains
N local workers: one per GPU the task holds, else N threads on its cores (torch and NumPy release the
GIL in their kernels). Each round deals up to N of the task's minibatches, one to each worker; every
worker steps from a snapshot of the node's replica taken under the node's lock, and their steps are
summed locally, in worker order, into one buffer that is encoded once and sent as one message. The
replica stays what the node alone writes (worker 0 trains on it, the others on copies), so an update the
I/O thread decodes during a round is never lost, and each step reaches the replica exactly once: in the
one encoded message, applied locally and sent as before.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
from psrv.nn.protocol import BufferedNetwork, TrainableNetwork
from psrv.spark.errors import SparkConfigError
from psrv.spark.payload import NetworkPayload, add_buffers, buffers_of, mean_buffers, takes_device

#: one worker's step: (its network, its minibatch, rows of the task before this batch) -> (update, loss)
ComputeStep = Callable[[TrainableNetwork, Any, int], tuple[Any, float]]

_extra_networks: dict[str, list[TrainableNetwork]] = {}
_extra_lock = threading.Lock()


def check_workers_per_node(value: Any) -> int:
    """``workers_per_node`` as an int >= 1, or a clear error (on the driver, before any Spark job)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < 1:
        raise SparkConfigError(
            f"workers_per_node: expected an int >= 1 (local workers behind each task's one mesh member), "
            f"got {value!r} ({type(value).__name__}); use 1 for one worker per Spark task, or the number of "
            "GPUs (or cores) each task holds")
    return int(value)


def deal(batches: Iterable[tuple[Any, float]], workers: int) -> Iterator[tuple[list[Any], float]]:
    """Rounds of up to ``workers`` minibatches (one per local worker) from ``timed_batches``' pairs,
    each with the start time of its first minibatch's step; the last round may be short."""
    group: list[Any] = []
    start = 0.0
    for batch, step_start in batches:
        if not group:
            start = step_start
        group.append(batch)
        if len(group) == workers:
            yield group, start
            group = []
    if group:
        yield group, start


def local_devices(main_device: Any, workers: int, held_gpus: Sequence[Any]) -> list[Any]:
    """The device of each local worker: the task's GPUs in turn when it holds several and worker 0's is
    the first of them, else worker 0's device for every worker (threads sharing it)."""
    if len(held_gpus) > 1 and main_device is not None and str(held_gpus[0]) == str(main_device):
        return [held_gpus[k % len(held_gpus)] for k in range(workers)]
    return [main_device] * workers


def _extra(payload: NetworkPayload, devices: Sequence[Any]) -> list[TrainableNetwork]:
    """Networks for workers 1..N-1 of the payload's architecture, built once per executor process and
    architecture (later tasks copy the payload's vectors in), like the task's own network."""
    key = json.dumps([payload.lineage, payload.config, [str(d) for d in devices]], sort_keys=True,
                     default=str)
    with _extra_lock:
        networks = _extra_networks.get(key)
    if networks is not None and all(n.params.shape == payload.params.shape for n in networks):
        for network in networks:
            payload.load_into(network)
        return networks
    with_device = takes_device(payload.factory)
    networks = [payload.build(device=d if with_device else None) for d in devices]
    with _extra_lock:
        _extra_networks.clear()  # one architecture at a time: bounded memory
        _extra_networks[key] = networks
    return networks


class LocalWorkers:
    """The N trainers of one node: a round of steps, their sum, their averaged states."""

    def __init__(self, network: TrainableNetwork, payload: NetworkPayload, count: int, lock: Any,
                 on_device: bool, held_gpus: Sequence[Any] = (),
                 offset: Callable[[], Any] | None = None) -> None:
        self.count = check_workers_per_node(count)
        self.offset = offset  # step_from="own": workers 1..N-1 start at the replica plus offset()
        self.lock = lock  # the node's: every replica snapshot is consistent with the updates it applied
        self.on_device = on_device
        main_device = getattr(network, "device", None) if on_device else None
        devices = local_devices(main_device, self.count, held_gpus) if on_device else [None] * self.count
        self.networks: list[TrainableNetwork] = [network, *_extra(payload, devices[1:])] \
            if self.count > 1 else [network]
        for worker in self.networks[1:]:
            worker.set_updater_state(np.array(network.updater_state, copy=True))  # the controller's state
        self._pool = ThreadPoolExecutor(self.count - 1, thread_name_prefix="psrv-local-worker") \
            if self.count > 1 else None
        self._total: Any = None

    def _snapshot(self, worker: TrainableNetwork) -> None:
        """The replica's current values (plus the offset, the node's residual, with step_from="own")
        into a worker's own parameters (worker 0 IS the replica)."""
        main = self.networks[0]
        with self.lock:
            replica = main.flat_params if self.on_device else main.params
            worker.set_params(replica if self.offset is None else replica + self.offset())

    def _run(self, worker: TrainableNetwork, batch: Any, offset: int,
             compute: ComputeStep) -> tuple[Any, float]:
        if worker is not self.networks[0]:
            self._snapshot(worker)
        return compute(worker, batch, offset)

    def compute(self, batches: Sequence[Any], compute: ComputeStep, offset: int) -> list[tuple[Any, float]]:
        """Each worker's (update, loss) on its minibatch of the round, in worker order; worker 0 runs on
        the calling thread. Every worker finishes before the first error (in worker order) is raised."""
        offsets = np.cumsum([offset] + [int(b.num_examples) for b in batches[:-1]]).tolist()
        futures: list[Future] = []
        if self._pool is not None:
            for k in range(1, len(batches)):
                futures.append(self._pool.submit(self._run, self.networks[k], batches[k], offsets[k],
                                                 compute))
        first: tuple[Any, float] | BaseException
        try:
            first = self._run(self.networks[0], batches[0], offsets[0], compute)
        except BaseException as exc:  # noqa: BLE001 - raised below, after the other workers finished
            first = exc
        outcomes: list[Any] = [first]
        for future in futures:
            try:
                outcomes.append(future.result())
            except BaseException as exc:  # noqa: BLE001 - raised below in worker order
                outcomes.append(exc)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        return outcomes

    def combine(self, updates: Sequence[Any]) -> Any:
        """The sum of the workers' steps, in worker order, in one reused buffer on worker 0's device
        (each worker's step may be a view of its own step buffer: copied out before its next step)."""
        first = updates[0]
        if self._total is None or self._total.shape != first.shape or self._total.dtype != first.dtype:
            self._total = first.clone() if hasattr(first, "clone") else np.array(first, copy=True)
        elif isinstance(self._total, np.ndarray):
            np.copyto(self._total, first)
        else:
            self._total.copy_(first)
        for update in updates[1:]:
            if isinstance(self._total, np.ndarray):
                self._total += update
            else:
                self._total.add_(update.to(self._total.device))
        return self._total

    def updater_state(self) -> np.ndarray:
        """The workers' updater states averaged (what the driver averages over the tasks)."""
        states = [np.asarray(n.updater_state) for n in self.networks]
        return states[0].copy() if len(states) == 1 else np.mean(states, axis=0).astype(states[0].dtype)

    def buffers(self) -> dict[str, np.ndarray] | None:
        """The workers' buffers (BatchNorm statistics) averaged, as the driver averages the tasks'."""
        if len(self.networks) == 1 or not isinstance(self.networks[0], BufferedNetwork):
            return buffers_of(self.networks[0])
        total = None
        for network in self.networks:
            total = add_buffers(total, buffers_of(network))
        return mean_buffers(total, len(self.networks)) if total is not None else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


__all__ = ["ComputeStep", "LocalWorkers", "check_workers_per_node", "deal", "local_devices"]
