"""The task side of ``psrv.spark.run``: one Spark task is one worker of the user's training function.

The task learns its rank from its partition, its local rank from the barrier stage's task addresses,
its device as every psrv task does (``task_device``: the GPU Spark assigned, else the CPU), sets the
launcher's environment and runs the function through psrv.torch's worker (which joins, leaves, and
reports to the driver's rendezvous).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from typing import Any

from psrv.spark.task.device import task_device
from psrv.spark.task.node import route_source_address
from psrv.torch.environment import WorkerEnvironment
from psrv.torch.worker import run_worker

log = logging.getLogger(__name__)


def _local_rank(context: Any, rank: int) -> int:
    """How many lower ranks run on this task's host (a barrier stage knows every task's address)."""
    try:
        hosts = [info.address.rsplit(":", 1)[0] for info in context.getTaskInfos()]
    except Exception:  # not a barrier task: every rank alone on its host
        return 0
    return sum(1 for other in range(rank) if hosts[other] == hosts[rank])


class RunTask:
    """What ``psrv.spark.run`` maps over its ``num_workers`` partitions (shipped with cloudpickle)."""

    def __init__(self, payload: bytes, place: WorkerEnvironment) -> None:
        self.payload = payload
        self.place = place

    def __call__(self, _items: Iterator[Any]) -> Iterator[int]:
        from pyspark import BarrierTaskContext  # lazy: pyspark's task context, only inside a running task

        context = BarrierTaskContext.get()
        rank = int(context.partitionId())
        device = task_device()
        env = dataclasses.replace(self.place, rank=rank, local_rank=_local_rank(context, rank),
                                  device=str(device) if device.type != "cpu" else None)
        if not os.environ.get("PSRV_IP", "").strip():  # bind the interface that routes to the driver
            source = route_source_address(env.rendezvous)
            if source:
                os.environ["PSRV_IP"] = source
        run_worker(env, self.payload)
        yield rank


__all__ = ["RunTask"]
