"""What a Spark task needs for a network on a device (GPU): which device, and gradient sharing there.

``task_device()`` picks the task's device: ``PSRV_DEVICE`` when set (e.g. "cpu"), else the GPU Spark
assigned to the task (``TaskContext.resources()["gpu"]``, with ``spark.task.resource.gpu.amount``), else
"auto": ``cuda:<partition % number of GPUs>`` where CUDA is available, else the CPU. It logs which.

``DeviceSharing`` (psrv.torch.device_sharing, shared with psrv.torch's DistributedOptimizer) is a device
worker's side of gradient sharing: residual and encoding on the device, only the message on the host.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from psrv.nn.protocol import DeviceNetwork, TrainableNetwork
from psrv.nn.torch_adapter import resolve_device

log = logging.getLogger(__name__)

#: environment variable that overrides the device of every task ("cpu", "cuda:0", "auto")
DEVICE_ENV = "PSRV_DEVICE"


def _visible_index(address: str) -> int | None:
    """The CUDA index of a GPU address Spark assigned (an index into CUDA_VISIBLE_DEVICES when set)."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if visible:
        return visible.index(address) if address in visible else None
    try:
        return int(address)
    except ValueError:
        return None


def task_device() -> Any:
    """The torch device this task's network lives on (see the module docstring); logged."""
    import torch

    override = os.environ.get(DEVICE_ENV, "").strip()
    if override:
        device = resolve_device(override)
        log.info("task device %s (from %s=%s)", device, DEVICE_ENV, override)
        return device
    context = None
    try:
        from pyspark import TaskContext

        context = TaskContext.get()
    except ImportError:  # pragma: no cover - pyspark is a dependency
        pass
    gpus = context.resources().get("gpu") if context is not None else None
    addresses = list(getattr(gpus, "addresses", None) or [])
    if addresses:
        index = _visible_index(addresses[0])
        if torch.cuda.is_available() and index is not None and index < torch.cuda.device_count():
            device = torch.device("cuda", index)
            log.info("task device %s (Spark assigned GPU %s)", device, addresses[0])
            return device
        log.warning("Spark assigned GPU %s, which torch cannot use here (CUDA available: %s, devices: %d); "
                    "choosing automatically", addresses[0], torch.cuda.is_available(),
                    torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if torch.cuda.is_available():
        partition = int(context.partitionId()) if context is not None else 0
        device = torch.device("cuda", partition % torch.cuda.device_count())
        log.info("task device %s (auto: no GPU assigned by Spark; partition %d of a host with %d GPUs)",
                 device, partition, torch.cuda.device_count())
        return device
    log.info("task device cpu (auto: CUDA is not available)")
    return torch.device("cpu")


def task_gpus() -> list[Any]:
    """Every GPU Spark assigned to this task that torch can use here, in Spark's order (empty on a CPU
    task): where ``workers_per_node`` puts one local worker each."""
    try:
        import torch
        from pyspark import TaskContext
    except ImportError:
        return []
    context = TaskContext.get()
    gpus = context.resources().get("gpu") if context is not None else None
    if gpus is None or not torch.cuda.is_available():
        return []
    indices = [_visible_index(address) for address in list(getattr(gpus, "addresses", None) or [])]
    return [torch.device("cuda", i) for i in indices if i is not None and i < torch.cuda.device_count()]


def wants_device_sharing(network: TrainableNetwork, force: bool = False) -> bool:
    """True for a torch network off the CPU (or on it when ``force``: how CI exercises this path)."""
    return isinstance(network, DeviceNetwork) and (force or not network.on_host)


__all__ = ["DEVICE_ENV", "task_device", "task_gpus", "wants_device_sharing"]
