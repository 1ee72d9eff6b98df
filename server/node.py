"""A node: one per worker process, beside its training loop (the public API of the node role).

``Node(config, params, controller_address).start()`` binds an ephemeral port, joins the
controller (retrying with back-off until ``join_timeout_s``), downloads the master copy with the
exact set of updates it includes and applies only what is newer. After that every update that
arrives is relayed onward (never back where it came from) and applied once into ``params`` under
``node.lock``.

The protocol is ``NodeMachine`` (server/node_machine.py, no sockets, threads, clocks or locks); this
class runs it in one I/O loop (transport/loop.py) and gives the caller's thread its API. The lock
lives here: every ``handle`` of the machine, on either thread, runs under ``node.lock``, and the
actions meant for the facade are carried out here: ``Apply``/``Install`` under the same lock right
after the ``handle`` that emitted them (only when the live parameters are behind the ``apply`` hook,
see server/outside_params.py), ``ReleaseSlots`` and ``Notify`` after it. Submits: the
caller's thread checks the update, takes a slot of the submit queue (``submit_queue_messages``;
released when the frames reached every neighbour's socket), applies it (``apply_locally``) and
hands the machine a ``Submit`` (it numbers and remembers it, gathered), all under ``node.lock``,
then wakes the loop (``SendSubmitted``), which sends what was gathered: ``submit`` returns the
sequence number without waiting for the I/O thread. While (re)joining the update waits in the
backlog (seq 0).

The training loop applies its own update and calls ``submit`` inside one ``with node.lock:`` (or
calls ``submit(message, apply_locally=True)``, which does both): a re-sync then never loses a local
update. A node that loses the controller keeps trying to rejoin for ``controller_lost_timeout_s``;
then (or when the controller says it shuts down) it stops and ``submit``/``wait``/``error`` surface
ControllerLostError.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import psrv.encoding as encoding
from psrv.encoding.errors import MalformedMessageError
from psrv.server.locked import LockedMachine
from psrv.server.node_machine import NodeMachine, NodeState
from psrv.server.node_state import SlotToken
from psrv.server.outside_params import ApplyHook, ApplyManyHook, OutsideParams
from psrv.server.own_update_loss import OwnUpdateLoss
from psrv.server.replica import DEFAULT_TOLERANCE, ReplicaCheck
from psrv.server.update_intake import apply_checked
from psrv.server.updates import check_payload
from psrv.server.warmup import check_params, params_checksum, warm_up_decode
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters
from psrv.transport.errors import (
    FrameRejectedError,
    InvalidUpdateError,
    JoinError,
    NotRunningError,
    SecurityMismatchError,
    SendQueueFullError,
    TransportError,
)
from psrv.transport.events import (
    Action,
    CheckDone,
    CheckRequested,
    Notify,
    ReleaseSlots,
    Send,
    SendSubmitted,
    Submit,
)
from psrv.transport.loop import Loop

__all__ = ["Node", "NodeState"]


class Node:
    """A worker's endpoint; see the module docstring. Use as a context manager or start()/stop()."""

    role = "node"

    def __init__(
        self,
        config: TransportConfig,
        params: np.ndarray,
        controller_address: str,
        *,
        lock: threading.RLock | None = None,
        apply: ApplyHook | None = None,
        want_updater_state: bool = False,
        installed: Callable[[np.ndarray], None] | None = None,
        apply_many: ApplyManyHook | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.params = check_params(params)
        self.lock = lock if lock is not None else threading.RLock()
        self.controller_address = controller_address
        self.want_updater_state = want_updater_state
        self.counters_ = Counters()
        self._apply_hook = apply
        self._slots = threading.BoundedSemaphore(config.submit_queue_messages)
        self._changed = threading.Condition()  # the machine caught up, was acknowledged, or stopped
        self.machine = NodeMachine(
            config, self.params, controller_address, random_bytes=os.urandom,
            params_outside=apply is not None, want_updater_state=want_updater_state, counters=self.counters_,
            wall_clock=wall_clock,  # its offset from the controller's clock is estimated from the beats
        )
        self._outside = None if apply is None else OutsideParams(
            apply, self.counters_, self.machine.view.log, apply_many=apply_many, installed=installed)
        # what the loop drives: Apply/Install under the lock, then the slots and the waiters
        self._driven = LockedMachine(self.machine, self.lock, self._carry_out,
                                     None if self._outside is None else self._outside.carry_out)
        self._loop: Any = None
        self._loss: OwnUpdateLoss | None = None  # a test hook (drop_next_own_update_upstream); off

    def _carry_out(self, actions: list[Action]) -> list[Action]:
        """Carry out the machine's actions meant for the facade; the rest are the loop's."""
        rest: list[Action] = []
        for action in actions:
            if self._loss is not None and self._loss.drops(action, self.machine.node_id):
                if isinstance(action.token, SlotToken) and action.token.sent():
                    self._slots.release(action.token.count)  # it left the sender: lost on the way
                continue
            if isinstance(action, ReleaseSlots):
                self._slots.release(action.count)
            elif isinstance(action, Notify):
                self._notified()
            else:
                if isinstance(action, Send) and isinstance(action.token, SlotToken):
                    action.token.bind(self._slots.release)
                rest.append(action)
        return rest

    def drop_next_own_update_upstream(self) -> None:
        """A test hook (fault injection, off unless called): every copy this node sends of its next own
        update message is lost, re-sends included, while it holds its current id
        (server/own_update_loss.py)."""
        self._loss = OwnUpdateLoss(self.machine.node_id)

    @property
    def own_update_loss(self) -> OwnUpdateLoss | None:
        """What ``drop_next_own_update_upstream`` lost so far (None when never armed)."""
        return self._loss

    def _notified(self, what: str | BaseException | None = None) -> None:
        """The machine caught up, was acknowledged or stopped (or the loop ended): wake the waiters."""
        with self._changed:
            self._changed.notify_all()

    # ------------------------------------------------------------------ what the machine knows
    node_id = property(lambda self: self.machine.node_id)
    ids_held = property(lambda self: self.machine.ids_held)
    restart = property(lambda self: self.machine.restart)
    updater_state = property(lambda self: self.machine.updater_state)
    state = property(lambda self: self.machine.state)
    mesh = property(lambda self: self.machine.mesh)
    seen = property(lambda self: self.machine.seen)
    address = property(lambda self: self.machine.address)
    # what this node's connection to the controller presents (the controller binds the id to it)
    routing_id = property(lambda self: self.machine.link_id(0))

    def _receive(self, frames: list[Any], identity: bytes | None, _sock: Any = None) -> None:
        """The tests' way in: one received message through the loop's receive path (on its thread)."""
        self._loop.receive(frames, identity)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> Node:
        """Bind, start the I/O thread, join and catch up; raises what went wrong (JoinError...)."""
        if self._loop is not None:
            raise NotRunningError("node already started")
        dtype = self.params.dtype
        self._loop = Loop(
            self.config, self._driven, role="node", counters=self.counters_,
            params_nbytes=self.params.nbytes,
            warm_up=(lambda: warm_up_decode(dtype)) if self._apply_hook is None else None,
            on_stopped=self._notified,
        )
        deadline = self.config.join_timeout_s + self.config.catchup_timeout_s + 1.0

        def timed_out(waited: float) -> JoinError:
            return JoinError(f"node did not join and catch up with the controller at "
                             f"{self.controller_address} within {waited:.1f} s "
                             f"(local address {self.address})")

        try:
            self._loop.start(deadline, timed_out)
        except SecurityMismatchError as exc:  # said at the first refused handshake, not at the deadline
            raise SecurityMismatchError(f"node (local address {self.address}) cannot join: {exc}") from None
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Say LEAVE, let queued frames out (linger), close everything. Idempotent."""
        if self._loop is None:
            return
        self._loop.stop(timeout_s)
        with self._changed:
            self._changed.notify_all()

    def __enter__(self) -> Node:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._loop is not None and self._loop.running

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the node (None while running or after a clean stop)."""
        stopped = self.machine.stopped
        if isinstance(stopped, BaseException):
            return stopped
        return self._loop.error if self._loop is not None else None

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the node stops; re-raise the error that stopped it. False on timeout."""
        done = self._loop.wait(timeout_s) if self._loop is not None else True
        if self.error is not None:
            raise self.error
        return done

    def call(self, fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        """Run ``fn`` on the I/O thread (which owns the machine's state) and return its result."""
        if not self.running:
            raise NotRunningError("node is not running")
        return self._loop.call(fn, timeout_s)

    def counters(self) -> dict[str, Any]:
        """A snapshot of this process's counters plus the checksum of the local parameters."""
        snap = self.counters_.snapshot()
        snap["node_id"] = self.node_id
        snap["address"] = self.address
        with self.lock:
            snap.update(params_checksum(self.params))
        snap["state"] = str(self.state)
        snap["restart"] = self.restart
        snap["controller"] = self.controller_address
        snap["node_ids"] = list(self.ids_held)
        applied = self.machine.last_applied_now
        if applied is not None:  # wall time of the last applied update (benchmarks line up processes)
            snap["last_applied_at"] = time.time() - (time.monotonic() - applied)
        return snap

    # ------------------------------------------------------------------ caller API
    def submit(
        self, message: np.ndarray, *, iteration: int = 0, epoch: int = 0, apply_locally: bool = False
    ) -> int:
        """Send one encoded update (int32 message) to every other replica; returns its sequence number.

        It travels in its smallest wire form (``psrv.encoding.compact``: packed, as a rule); compact it
        before submitting to know the bytes it takes.

        The caller must already have applied it to ``params`` (hold ``node.lock`` across that and this
        call), or pass ``apply_locally=True``. The array is sent zero-copy: do not modify it afterwards.
        Returns 0 while (re)joining (the update is sent once the catch-up is done). Raises
        SendQueueFullError (retryable) when the queue stays full for ``submit_timeout_s``, and the
        error that stopped the node (e.g. ControllerLostError) if it stopped.
        """
        if self.error is not None:
            raise self.error
        if not self.running:
            raise NotRunningError("node is not running (call start() first)")
        try:
            payload = check_payload(message, self.params.size, "submitted update", self.config.max_tau)[0]
            # the body is checked too (replays apply it without checking again); what travels, is
            # replayed and is applied is the smallest wire form of the same elements
            payload, info = check_payload(encoding.compact(payload), self.params.size, "submitted update")
        except FrameRejectedError as exc:
            raise InvalidUpdateError(exc.detail) from None
        except MalformedMessageError as exc:
            raise InvalidUpdateError(f"submitted update: {exc}") from None
        fields = {"iteration": int(iteration), "epoch": int(epoch), "tau": float(info.tau),
                  "encoding": info.form}
        if not self._slots.acquire(timeout=self.config.submit_timeout_s):
            raise SendQueueFullError(
                f"node {self.node_id}: {self.config.submit_queue_messages} submitted updates "
                f"still queued after {self.config.submit_timeout_s} s; submit again later"
            )
        with self.lock:
            if apply_locally:
                try:
                    self._apply_own(payload)
                except Exception as exc:
                    self._slots.release()
                    raise InvalidUpdateError(f"submitted update could not be applied: {exc}") from exc
            # (the only actions: ReleaseSlots, carried out; a gathered submit is sent by the loop)
            self._driven.handle(Submit(payload, fields, slot=True, more=True), time.monotonic())
            seq = self.machine.submitted_seq
        if seq:
            self._loop.post(SendSubmitted())
        return seq

    def _apply_own(self, payload: np.ndarray) -> None:
        """``submit(apply_locally=True)``: the own update into the live parameters (under the lock)."""
        if self._apply_hook is not None:  # the live parameters are behind the hook
            self._apply_hook(payload, {})
        else:
            apply_checked(payload, self.params)

    def wait_acknowledged(self, timeout_s: float) -> bool:
        """Wait until the controller holds every update this node has submitted.

        True as soon as the controller's per-origin watermark, as announced to this node in its
        heartbeats, covers this node's last sequence number (updates submitted meanwhile extend the
        wait); False at the deadline (also when nothing was acknowledged because the node is
        (re)joining). Raises the error that stopped the node (ControllerLostError when the
        controller went silent or shut down), NotRunningError before start() or after stop().

        Call it before ``stop()`` for a leave that loses nothing: ``stop()`` flushes queued frames
        and says LEAVE, but an update a relay dropped on the way is only re-sent while this node is
        still a member, after the controller's watermark for it stood still for two beats. With
        True, leaving loses none of this node's updates; with False the master copy may lack some.
        """
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        with self._changed:
            while True:
                if self.error is not None:
                    raise self.error
                if not self.running:
                    raise NotRunningError("node is not running (call start() first)")
                if self.machine.all_acknowledged():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(min(remaining, 0.1))  # also re-checks for a stop or an error

    def check_replica(
        self, timeout_s: float, tolerance: float = DEFAULT_TOLERANCE,
        current: Callable[[], np.ndarray] | None = None,
    ) -> ReplicaCheck:
        """Check the central invariant on this replica: it equals the master copy up to float rounding.

        Downloads a snapshot of the controller's parameters with the exact set of updates they include,
        waits (up to ``timeout_s``) until this node has applied every one of them, then compares
        ``params`` with the snapshot plus the updates this node applied that the snapshot lacks (from its
        replay ring; see server/replica.py). Costs one parameter download; call it after
        ``wait_acknowledged``. Never raises for a timeout: the result's status says "unavailable".
        ``current`` returns the live replica when it is not ``params`` (an ``apply`` hook that decodes
        elsewhere, e.g. into GPU parameters); it is called under the node's lock.
        """
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        machine = self.machine
        last = "no snapshot arrived"
        try:
            requested = False
            while time.monotonic() < deadline:
                remaining = max(0.1, deadline - time.monotonic())
                if not requested:
                    self._loop.post(CheckRequested())
                    requested = self.call(lambda: machine.probe.request != 0, timeout_s=remaining)
                    if not requested:  # (re)joining or re-syncing: ask once it runs again
                        last = f"node is {self.state}"
                        time.sleep(0.05)
                        continue
                result = self.call(lambda: self._verdict(tolerance, current), timeout_s=remaining)
                if isinstance(result, ReplicaCheck):
                    return result
                if result == "resynced":  # the replica was replaced meanwhile: check the new one
                    requested, last = False, "a re-sync replaced the replica during the check"
                    continue
                time.sleep(0.02)
        except (TransportError, TimeoutError) as exc:
            return ReplicaCheck("unavailable", detail=f"{type(exc).__name__}: {exc}")
        finally:
            if self.running:
                self._loop.post(CheckDone())
        return ReplicaCheck("unavailable", detail=f"no comparable snapshot within {timeout_s} s ({last})")

    def _verdict(self, tolerance: float, current: Callable[[], np.ndarray] | None) -> Any:
        with self.lock:
            return self.machine.check_verdict(tolerance, current)
