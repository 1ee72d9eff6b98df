"""``psrv.run(train_fn, *args, num_workers=N)``: N local worker processes, no Spark (ParallelWrapper's job).

The launching process holds the rendezvous and, once rank 0 sent its initial parameters, the controller
(the master copy). Each worker is a fresh Python process running ``train_fn`` with its place in the
environment; one CUDA device each when GPUs exist, else the cores shared between them. ``run`` returns
rank 0's return value, the master copy and every worker's report; a worker that raises stops the others
and its own exception is raised here, with its traceback as the cause.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from psrv.torch.errors import SharingConfigError, WorkerFailedError
from psrv.torch.rendezvous import Failure, Rendezvous
from psrv.torch.worker import dump_call, pickler
from psrv.transport import TransportConfig

log = logging.getLogger(__name__)

#: how long a worker that exited without a report may still have one in flight
REPORT_GRACE_S = 3.0
#: how long stopped workers get before they are killed
REAP_S = 5.0
#: a worker process's program (not ``-m psrv.torch.worker``: the package imports that module first)
_WORKER = "import sys; from psrv.torch.worker import main; sys.exit(main(sys.argv[1:]))"


@dataclass
class RunResult:
    """What a launcher returns: rank 0's value, the master copy, each rank's report, the controller's
    counters (``applied_by_origin``: how many updates of each node the master copy holds)."""

    value: Any
    params: np.ndarray | None
    reports: list[dict[str, Any]] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_hub(cls, hub: Rendezvous, num_workers: int) -> RunResult:
        """What every launcher returns once all ranks reported to ``hub``."""
        reports = [hub.reports[rank] for rank in range(num_workers)]
        value = reports[0].pop("value", None)
        counters = hub.controller.counters() if hub.controller is not None else {}
        return cls(pickler().loads(value) if value is not None else None, hub.master_params(), reports,
                   counters)

    def load_into(self, model: Any) -> Any:
        """Copy the master copy into ``model``'s trainable parameters (in ``model.parameters()`` order,
        the order the workers' flat vector has); returns the model."""
        import torch

        if self.params is None:
            raise SharingConfigError("load_into: no master copy (no worker built a DistributedOptimizer)")
        params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in params)
        if total != self.params.size:
            raise SharingConfigError(f"load_into: the master copy has {self.params.size} parameters, "
                                     f"the model {total}: pass the same architecture")
        flat = torch.from_numpy(np.array(self.params, copy=True))
        with torch.no_grad():
            torch.nn.utils.vector_to_parameters(flat.to(params[0].dtype), params)
        return model


def check_workers(num_workers: Any, train_fn: Any) -> int:
    """The worker count, or a clear error before anything starts."""
    if not callable(train_fn):
        raise SharingConfigError(f"train_fn: expected a function, got {type(train_fn).__name__}")
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise SharingConfigError(f"num_workers: expected a positive int, got {num_workers!r}")
    return num_workers


def worker_devices(num_workers: int, devices: Sequence[str] | str | None) -> list[str | None]:
    """One device per rank: the given list, "cpu", or (None/"auto") a CUDA device per rank when CUDA
    is available (round robin), else None (the model's own device, the CPU)."""
    if devices is None or devices == "auto":
        try:
            import torch

            count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        except ImportError:  # pragma: no cover - psrv.torch needs torch
            count = 0
        return [f"cuda:{rank % count}" if count else None for rank in range(num_workers)]
    if isinstance(devices, str):
        return [devices] * num_workers
    if len(devices) != num_workers:
        raise SharingConfigError(f"devices: expected one per worker ({num_workers}), got {len(devices)}")
    return [str(d) for d in devices]


def raise_failure(failure: Failure) -> None:
    """Raise the worker's own exception, with its traceback (as text) as the cause."""
    cause = WorkerFailedError(f"rank {failure.rank} failed:\n{failure.text}")
    if failure.exception is not None:
        try:
            exc = pickler().loads(failure.exception)
        except Exception:
            exc = None
        if isinstance(exc, BaseException):
            raise exc from cause
    raise cause


def _reap(procs: list[subprocess.Popen]) -> None:
    """Stop every worker still running: terminate, then kill after REAP_S."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + REAP_S
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(REAP_S)


def _watch(hub: Rendezvous, procs: list[subprocess.Popen], timeout_s: float | None = None) -> bool:
    """Until every rank reported or one failed (a raised exception, or a process that died silently);
    with ``timeout_s``, at most that long. False when the time ran out first."""
    silent_since: dict[int, float] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while not hub.wait(0.2):
        if deadline is not None and time.monotonic() > deadline:
            return False
        for rank, proc in enumerate(procs):
            if proc.poll() is not None and rank not in hub.reports:
                first = silent_since.setdefault(rank, time.monotonic())
                if time.monotonic() - first > REPORT_GRACE_S and hub.failure is None:
                    hub.failure = Failure(rank, None, f"worker process exited with code {proc.returncode} "
                                                      "without reporting (killed, or it called os._exit)")
                    return True
    return True


def run(train_fn: Callable[..., Any], *args: Any, num_workers: int = 2,
        devices: Sequence[str] | str | None = None, transport: TransportConfig | None = None,
        job: str = "psrv", **kwargs: Any) -> RunResult:
    """Run ``train_fn(*args, **kwargs)`` on ``num_workers`` local processes sharing their steps.

    Inside, the function calls ``psrv.torch.init()`` (optional) and wraps its optimizer in
    ``psrv.torch.DistributedOptimizer``. ``devices``: one per worker ("cuda:1", "cpu"), or None for one
    CUDA device per worker where CUDA exists, else the CPU (the cores are shared: each worker gets
    ``OMP_NUM_THREADS`` = cores / workers unless it is set). ``transport``: the mesh's settings.
    """
    num_workers = check_workers(num_workers, train_fn)
    places = worker_devices(num_workers, devices)
    payload = dump_call(train_fn, args, kwargs)
    hub = Rendezvous(num_workers, transport or TransportConfig(), host="127.0.0.1")
    threads = str(max(1, (os.cpu_count() or 1) // num_workers))
    procs: list[subprocess.Popen] = []
    try:
        with tempfile.TemporaryDirectory(prefix="psrv-run-") as tmp:
            path = os.path.join(tmp, "payload.pkl")
            with open(path, "wb") as f:
                f.write(payload)
            for rank in range(num_workers):
                env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", threads),
                       "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),  # import what we import
                       **hub.environment(rank, job=job, device=places[rank]).variables()}
                procs.append(subprocess.Popen([sys.executable, "-c", _WORKER, path], env=env))
            _watch(hub, procs)
        if hub.failure is not None:
            _reap(procs)
            raise_failure(hub.failure)
        deadline = time.monotonic() + REAP_S
        for proc in procs:  # every rank reported and left: what remains is the interpreter's exit
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.info("worker pid %d still exiting %.0f s after its report; stopping it", proc.pid, REAP_S)
        _reap(procs)
        return RunResult.from_hub(hub, num_workers)
    finally:
        _reap(procs)
        hub.close()


__all__ = ["REAP_S", "REPORT_GRACE_S", "RunResult", "check_workers", "raise_failure", "run",
           "worker_devices"]
