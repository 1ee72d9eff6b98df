"""This worker's place in a launched job: ``init()``, ``rank()``, ``size()``, ``local_rank()``, leaving.

``init()`` reads what the launcher put in the environment (psrv.torch.environment). Joining the
controller needs the model, so it happens when the DistributedOptimizer is built: rank 0's parameters
become the master copy and every rank downloads it (Horovod's ``broadcast_parameters``). ``shutdown()``
leaves: it waits until the controller holds every update this worker sent, checks this replica against
the master copy and stops the node; the launchers call it when the training function returns.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from psrv.torch.environment import WorkerEnvironment
from psrv.torch.errors import SharingConfigError


@dataclass
class Session:
    """The launcher's description of this worker and the one optimizer that joined with it."""

    env: WorkerEnvironment
    optimizer: Any = None
    report: dict[str, Any] | None = None


_guard = threading.Lock()
_current: Session | None = None
#: the session that left last: its report is what the launcher collects when the function returns, also
#: when the function (or the Lightning strategy at the end of ``fit``) called ``shutdown()`` itself
_left: Session | None = None


def init() -> WorkerEnvironment:
    """Read the launcher's environment (once per process); raises LauncherRequiredError outside one."""
    global _current, _left
    with _guard:
        if _current is None:
            _current, _left = Session(WorkerEnvironment.from_variables()), None
        return _current.env


def current() -> Session:
    """This process's session (``init()`` first if it was not called)."""
    init()
    assert _current is not None
    return _current


def rank() -> int:
    """This worker's rank, 0 … size()-1 (rank 0's parameters start the master copy)."""
    return current().env.rank


def size() -> int:
    """How many workers the job has."""
    return current().env.size


def local_rank() -> int:
    """This worker's rank among the workers of its machine (pick a GPU with it)."""
    return current().env.local_rank


def device() -> str:
    """The device the launcher gave this worker ("cuda:1"; "cpu" when it gave none): move the model there
    with ``model.to(device())`` before wrapping its optimizer."""
    return current().env.device or "cpu"


def attach(optimizer: Any) -> Session:
    """Register the optimizer that joins the controller for this process (one per process)."""
    session = current()
    with _guard:
        if session.optimizer is not None and session.optimizer is not optimizer:
            raise SharingConfigError(
                "a DistributedOptimizer already joined in this process; psrv shares one model per worker: "
                "wrap one optimizer (with several param groups if needed) around the whole model")
        session.optimizer = optimizer
    return session


def shutdown() -> dict[str, Any] | None:
    """Leave the job: drain, check the replica, stop the node. Returns what the worker reports (None
    when no optimizer joined). Idempotent: a second call returns the same report; a later ``init()``
    starts a new session."""
    global _current, _left
    with _guard:
        session, _current = _current, None
        if session is None:
            return _left.report if _left is not None else None
    if session.optimizer is None:
        return None
    if session.report is None:
        session.report = session.optimizer.leave()
    with _guard:
        _left = session
    return session.report


def abandon() -> None:
    """Leave without draining (the training function failed): stop the node, forget the session."""
    global _current, _left
    with _guard:
        session, _current, _left = _current, None, None
    node = getattr(session.optimizer, "node", None) if session is not None else None
    if node is not None:
        node.stop(timeout_s=2.0)
        session.optimizer.node = None


__all__ = ["Session", "abandon", "attach", "current", "device", "init", "local_rank", "rank", "shutdown",
           "size"]
