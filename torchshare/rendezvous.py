"""The launcher's side of a job: where its workers find the controller and send back what they did.

A launcher (local processes or Spark tasks) starts a ``Rendezvous``: an authenticated listener
(``multiprocessing.connection``, an HMAC challenge with a key only the job's workers get). Rank 0 sends
its initial parameters when its DistributedOptimizer is built; the rendezvous then starts the controller
with them as the master copy (what Horovod's ``broadcast_parameters`` does) and tells every rank, which
joins and downloads it. A worker then reports once: its result (``done``) or its exception (``failed``);
the first failure aborts the job (waiting ranks are told at once, the launcher stops the others).

Requests are one tuple each on their own connection: ``("join", rank, params | None)`` -> ``("controller",
address, transport_config)`` or ``("abort", why)``; ``("done", rank, report)`` and ``("failed", rank,
exception_bytes, traceback_text)`` -> ``("ok",)``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

import numpy as np
from psrv.server import Controller
from psrv.torch.environment import WorkerEnvironment
from psrv.torch.errors import RendezvousError
from psrv.transport import TransportConfig

log = logging.getLogger(__name__)

#: how long a rank waits for rank 0's parameters (rank 0 builds its model and optimizer meanwhile)
JOIN_WAIT_S = 300.0


@dataclass
class Failure:
    """The first worker failure of a job: the rank, its pickled exception (None when it would not
    pickle) and its traceback as text."""

    rank: int
    exception: bytes | None
    text: str


@dataclass
class Rendezvous:
    """Listens for a job's workers, starts its controller from rank 0's parameters, collects reports."""

    size: int
    transport: TransportConfig = field(default_factory=TransportConfig)
    host: str = "127.0.0.1"
    controller: Controller | None = None
    reports: dict[int, dict[str, Any]] = field(default_factory=dict)
    failure: Failure | None = None

    def __post_init__(self) -> None:
        self.key = os.urandom(32)
        self._listener = Listener((self.host, 0), authkey=self.key)
        self.address = f"{self.host}:{self._listener.address[1]}"
        self._changed = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="psrv-rendezvous", daemon=True)
        self._thread.start()

    def environment(self, rank: int, local_rank: int | None = None, job: str = "psrv",
                    device: str | None = None) -> WorkerEnvironment:
        """What worker ``rank`` is told (its launcher puts ``.variables()`` in its environment)."""
        return WorkerEnvironment(self.address, self.key, rank, self.size,
                                 rank if local_rank is None else local_rank, job, device)

    # --- the listener -----------------------------------------------------------------------------

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception as exc:  # closed, or a stranger failed the challenge
                if self._closed:
                    return
                log.warning("rendezvous: refused a connection: %s", exc)
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            try:
                if not conn.poll(JOIN_WAIT_S):  # a client that connects and never asks holds no thread
                    log.warning("rendezvous: a connection sent nothing within %.0f s; closed", JOIN_WAIT_S)
                    return
                request = conn.recv()
                conn.send(self._handle(request))
            except (EOFError, OSError) as exc:
                log.warning("rendezvous: a worker's connection broke: %s", exc)
            except Exception as exc:  # a malformed request: say so, keep serving the others
                log.warning("rendezvous: bad request: %s", exc)
                with contextlib.suppress(OSError):
                    conn.send(("abort", f"bad request: {exc}"))

    def _handle(self, request: tuple[Any, ...]) -> tuple[Any, ...]:
        kind, rank = request[0], int(request[1])
        if kind == "join":
            return self._join(rank, request[2])
        with self._changed:
            if kind == "done":
                self.reports[rank] = request[2]
            elif kind == "failed":
                if self.failure is None:
                    self.failure = Failure(rank, request[2], request[3])
            else:
                raise ValueError(f"unknown request {kind!r}")
            self._changed.notify_all()
        return ("ok",)

    def _join(self, rank: int, params: np.ndarray | None) -> tuple[Any, ...]:
        with self._changed:
            if rank == 0 and self.controller is None and params is not None:
                self.controller = Controller(self.transport.replace(host=self.host, port=0),
                                             np.array(params, copy=True)).start()
                log.info("controller on %s: master copy of %d parameters from rank 0",
                         self.controller.address, params.size)
                self._changed.notify_all()
            deadline = time.monotonic() + JOIN_WAIT_S
            while self.controller is None and self.failure is None and not self._closed:
                if not self._changed.wait(max(0.0, min(1.0, deadline - time.monotonic()))) \
                        and time.monotonic() >= deadline:
                    return ("abort", f"rank 0 sent no parameters within {JOIN_WAIT_S:.0f} s")
            if self.controller is None:
                why = f"rank {self.failure.rank} failed" if self.failure else "the launcher stopped"
                return ("abort", why)
            return ("controller", self.controller.address, self.transport)

    # --- the launcher's view ------------------------------------------------------------------------

    def wait(self, timeout_s: float) -> bool:
        """Wait until every rank reported or one failed; False at the deadline."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while self.failure is None and len(self.reports) < self.size:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.5))
        return True

    def master_params(self) -> np.ndarray | None:
        """A copy of the controller's master copy (None when rank 0 never sent parameters)."""
        if self.controller is None:
            return None
        with self.controller.lock:
            return self.controller.params.copy()

    def close(self) -> None:
        """Stop the controller and the listener (idempotent)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
        self._listener.close()
        if self.controller is not None:
            self.controller.stop()


def ask(env: WorkerEnvironment, request: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
    """Send one request to the launcher's rendezvous and wait (up to ``timeout_s``) for its answer."""
    host, _, port = env.rendezvous.rpartition(":")
    try:
        with Client((host, int(port)), authkey=env.key) as conn:
            conn.send(request)
            if not conn.poll(timeout_s):
                raise RendezvousError(f"the launcher at {env.rendezvous} did not answer within {timeout_s} s")
            return conn.recv()
    except (OSError, EOFError) as exc:
        raise RendezvousError(f"cannot reach the launcher at {env.rendezvous}: {exc}") from exc


__all__ = ["JOIN_WAIT_S", "Failure", "Rendezvous", "ask"]
