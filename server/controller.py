"""The controller: ``ControllerMachine`` (the protocol) driven by one I/O loop (transport/loop.py).

``Controller(config, params).start()``; ``address`` is what nodes join. The public API is the one
the transport always had: start/stop/context manager, address, running, error, wait, counters(),
status(), node_stats(), member_names(), call(), params, updater_state, lock, mesh, seen.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from typing import Any

import numpy as np
from psrv.server.controller_machine import ControllerMachine
from psrv.server.identity import new_session
from psrv.server.locked import LockedMachine
from psrv.server.mesh import CONTROLLER_ID
from psrv.server.outside_params import ApplyHook, OutsideParams
from psrv.server.warmup import check_params, params_checksum, warm_up_decode
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters
from psrv.transport.loop import Loop

__all__ = ["CHECKSUM_MIN_INTERVAL_S", "Controller"]

CHECKSUM_MIN_INTERVAL_S = 1.0


class Controller:
    """Root of the mesh, holder of the master copy; see server/controller_machine.py."""

    role = "controller"

    def __init__(
        self,
        config: TransportConfig,
        params: np.ndarray,
        *,
        updater_state: np.ndarray | None = None,
        lock: threading.RLock | None = None,
        apply: ApplyHook | None = None,
    ) -> None:
        self.config = config
        self.params = check_params(params)
        self.lock = lock if lock is not None else threading.RLock()
        self.node_id = CONTROLLER_ID
        self.counters_ = Counters()
        self.log = logging.getLogger("psrv.transport.controller")
        self.session = new_session()
        self.machine = ControllerMachine(
            config,
            self.params,
            updater_state=updater_state,
            params_outside=apply is not None,
            session=self.session,
            counters=self.counters_,
            wall_clock=time.time,
            log=self.log,
        )
        self.machine.status_counters = self.counters
        self._loop = Loop(
            config,
            # every handle under the lock its callers hold; with an ``apply`` hook, its Apply actions too
            LockedMachine(self.machine, self.lock, under_lock=None if apply is None
                          else OutsideParams(apply, self.counters_, self.log).carry_out),
            role=self.role,
            counters=self.counters_,
            params_nbytes=self.params.nbytes,
            warm_up=functools.partial(warm_up_decode, self.params.dtype) if apply is None else None,
            throttle=True,
            log=self.log,
        )
        self._checksum: tuple[int, float, dict[str, Any]] | None = None  # (master version, when, sums)
        self._checksum_running = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Controller:
        """Bind, start the I/O thread and wait until it listens (raises what went wrong)."""
        self._loop.start(10.0)
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Say SHUTDOWN to every member, let queued frames out (linger), close everything. Idempotent."""
        self._loop.stop(timeout_s)

    def __enter__(self) -> Controller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str | None:
        return self._loop.address

    @property
    def running(self) -> bool:
        return self._loop.running

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the controller (None while running or after a clean stop)."""
        return self._loop.error

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the controller stops; re-raise the error that stopped it. False on timeout."""
        return self._loop.wait(timeout_s)

    def call(self, fn: Any, timeout_s: float = 10.0) -> Any:
        """Run ``fn`` on the I/O thread (which owns the machine and sockets) and return its result."""
        return self._loop.call(fn, timeout_s)

    # ------------------------------------------------------------------ state (read on the I/O thread)
    @property
    def updater_state(self) -> np.ndarray | None:
        return self.machine.updater_state

    @updater_state.setter
    def updater_state(self, value: np.ndarray | None) -> None:
        self.machine.updater_state = value

    @property
    def mesh(self) -> Any:
        return self.machine.mesh

    @property
    def seen(self) -> Any:
        return self.machine.seen

    @property
    def membership(self) -> Any:
        return self.machine.members

    @property
    def loop_stats(self) -> Any:
        return self._loop.stats

    @property
    def _reassembler(self) -> Any:  # the tests' view of the reassembly budget
        return self._loop.reassembler

    def _receive(self, frames: list[Any], identity: bytes | None, _sock: Any = None) -> None:
        """One raw message through the receive path (tests; call it on the I/O thread)."""
        self._loop.receive(frames, identity)

    def routing_id_to(self, node_id: int) -> bytes:
        """The routing id this controller's connection to member ``node_id`` presents."""
        return self.machine.routing_id_to(node_id)

    # ------------------------------------------------------------------ queries
    def counters(self) -> dict[str, Any]:
        """The counters and the master copy's checksum (``checksum_updates``: the update count it is of).

        The checksum (three passes over the model) is computed again only once the master changed.
        Above checksum_max_params, asked on the I/O thread (a `status` request), it is computed on a
        copy in a background thread at most once per CHECKSUM_MIN_INTERVAL_S and the status shows the
        latest one finished (None before the first): nodes polling `status` during a join burst made
        the I/O thread spend seconds on it. Asked from another thread it is exact."""
        snap = self.counters_.snapshot()
        snap["node_id"] = self.node_id
        snap["address"] = self.address
        version, now = self.counters_["updates_applied"], time.monotonic()
        cached = self._checksum
        if cached is None or cached[0] != version:
            large = self.params.size > self.config.checksum_max_params
            if large and self._loop.on_loop_thread:
                due = cached is None or now - cached[1] >= CHECKSUM_MIN_INTERVAL_S
                if due and not self._checksum_running:
                    self._checksum_running = True
                    threading.Thread(target=self._checksum_copy, name="psrv-checksum", daemon=True).start()
            else:
                with self.lock:
                    version = self.counters_["updates_applied"]
                    cached = self._checksum = (version, now, params_checksum(self.params))
        if cached is None:
            snap.update({"params_sum": None, "params_abs_sum": None, "params_crc32": None})
            snap["checksum_updates"] = None
        else:
            snap.update(cached[2])
            snap["checksum_updates"] = cached[0]
        return snap

    def _checksum_copy(self) -> None:
        """Off the I/O thread: copy the master under the lock (milliseconds), sum the copy."""
        try:
            with self.lock:
                version = self.counters_["updates_applied"]
                copy = self.params.copy()
            self._checksum = (version, time.monotonic(), params_checksum(copy))
        finally:
            self._checksum_running = False

    def member_names(self) -> dict[int, str | None]:
        """Every node id this controller admitted (the newest 65 536) and the name it joined with:
        with ``counters()["applied_by_origin"]`` it tells whose updates the master copy holds."""
        return self.machine.member_names()  # a dict copy: atomic under the GIL, from any thread

    def status(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The controller's view (what `psrv status` prints), taken on the I/O thread."""
        return self.call(lambda: self.machine.status(time.monotonic()), timeout_s)

    def node_stats(self, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        """Each node's latest heartbeat stats (online, then departed), without the parameter checksum
        that ``status`` computes: cheap enough for a driver's progress display to poll."""
        return self.call(self.machine.node_stats, timeout_s)
