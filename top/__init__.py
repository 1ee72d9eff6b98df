"""psrv: gradient-sharing training of neural networks on Apache Spark over a ZeroMQ mesh.

The top-level package holds the version and ``run`` (your own training function on N local worker
processes), so that ``import psrv`` stays light (no numba, Spark or torch): ``run`` imports
``psrv.torch`` when it is called. The work lives in ``psrv.encoding``, ``psrv.transport``,
``psrv.server``, ``psrv.nn``, ``psrv.torch`` and ``psrv.spark`` (each its own folder of the source tree,
mapped here by ``pyproject.toml``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from psrv._version import __version__

if TYPE_CHECKING:
    from psrv.torch.launch import RunResult
    from psrv.transport import TransportConfig


def run(train_fn: Callable[..., Any], *args: Any, num_workers: int = 2,
        devices: Sequence[str] | str | None = None, transport: TransportConfig | None = None,
        job: str = "psrv", **kwargs: Any) -> RunResult:
    """Run ``train_fn(*args, **kwargs)`` on ``num_workers`` local processes sharing their steps.

    Several workers on one machine without Spark (Deeplearning4j's ``ParallelWrapper`` job; torchrun's
    shape): one CUDA device per worker where CUDA exists (``devices`` overrides: one per worker, or
    "cpu"), else the cores shared. Inside, the function wraps its optimizer in
    ``psrv.torch.DistributedOptimizer`` (or trains a Lightning ``Trainer`` with
    ``psrv.torch.lightning.PsrvStrategy``). Returns a ``psrv.torch.RunResult``: rank 0's return value,
    the master copy, each worker's report. ``psrv.spark.run`` runs the same function on Spark tasks.
    """
    from psrv.torch.launch import run as run_local  # lazy: keeps `import psrv` light (torch, zmq, numba)

    return run_local(train_fn, *args, num_workers=num_workers, devices=devices, transport=transport,
                     job=job, **kwargs)


__all__ = ["__version__", "run"]
