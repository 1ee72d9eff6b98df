"""What a gradient-sharing task is given: one picklable record, broadcast once per training job."""

from __future__ import annotations

from dataclasses import dataclass

from psrv.spark.payload import NetworkPayload
from psrv.transport import TransportConfig


@dataclass
class WorkerSetup:
    """Everything a task needs, broadcast once per fit (picklable, no sockets)."""

    job_id: str
    controller_address: str
    transport: TransportConfig  # for the nodes (keys included when secure)
    network_mask: str | None
    payload: NetworkPayload
    threshold_state: dict
    post_processor_state: dict
    prefetch: int
    debug: bool
    collect_stats: bool
    session_id: str = ""  # one training master: residuals carry over between its fits
    check_replicas: bool = True  # each task checks its final replica against the master
    strategy_classes: bytes = b""  # the threshold algorithm's and post-processor's classes (spark.strategies)
    workers_per_node: int = 1  # local workers behind the task's one node (spark.task.local_workers)
    step_from: str = "shared"  # "own": steps start at the replica plus the worker's residual (see the master)
    momentum_workers: int = 1  # each worker's momentum becomes the given one ** this (psrv.nn.momentum)
    local_steps: int = 1  # optimizer steps a message, each on a piece of the minibatch (see the master)


__all__ = ["WorkerSetup"]
