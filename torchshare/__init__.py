"""psrv for your own training loop: a gradient-sharing optimizer and the launchers that run it.

``DistributedOptimizer(optimizer, model)`` makes any torch optimizer share its steps (threshold-encoded,
over psrv's mesh); ``init()``, ``rank()``, ``size()``, ``local_rank()`` tell a worker its place;
``psrv.run(train_fn, num_workers=N)`` (the same function as ``psrv.torch.run``; and
``psrv run -n N script.py``) runs the function on N local processes, ``psrv.spark.run`` on Spark tasks.
Needs the ``torch`` extra (imported when ``DistributedOptimizer`` is first used, so that the launchers
and ``psrv.spark`` load without it).
"""

from __future__ import annotations

from typing import Any

from psrv.torch.errors import (
    LauncherRequiredError,
    RendezvousError,
    SharingConfigError,
    TorchShareError,
    WorkerFailedError,
)
from psrv.torch.launch import RunResult, run
from psrv.torch.session import device, init, local_rank, rank, shutdown, size


def __getattr__(name: str) -> Any:
    if name == "DistributedOptimizer":
        from psrv.torch.optimizer import DistributedOptimizer  # lazy: imports torch (the optional extra)

        return DistributedOptimizer
    if name == "PsrvStrategy":
        from psrv.torch.lightning import PsrvStrategy  # lazy: imports lightning (the optional extra)

        return PsrvStrategy
    raise AttributeError(f"module 'psrv.torch' has no attribute {name!r}")


__all__ = [
    "DistributedOptimizer",
    "LauncherRequiredError",
    "PsrvStrategy",
    "RendezvousError",
    "RunResult",
    "SharingConfigError",
    "TorchShareError",
    "WorkerFailedError",
    "device",
    "init",
    "local_rank",
    "rank",
    "run",
    "shutdown",
    "size",
]
