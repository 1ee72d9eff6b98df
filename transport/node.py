"""A node: one per worker process, beside its training loop.

``Node(config, params, controller_address).start()`` binds an ephemeral port, joins the
controller (retrying with back-off until ``join_timeout_s``), starts receiving updates, then
downloads the master copy with the exact set of sequences it includes and applies only what is
newer (held updates are replayed, nothing twice, nothing lost). After that every update that
arrives is relayed onward (never back where it came from) and applied once into ``params``
under ``node.lock``.

The training loop applies its own update and calls ``submit`` inside one ``with node.lock:``
(or calls ``submit(message, apply_locally=True)``, which does both): a re-sync then never
loses a local update. If the controller goes silent for ``controller_timeout_s`` (or says it
shuts down) the node stops and ``submit``/``wait``/``error`` surface ControllerLostError.

Re-sync: the controller's heartbeats carry its per-origin watermarks; a node still below a
watermark the controller announced two beats earlier missed something (a queue overflowed,
a relay died) and downloads the master copy again, replaying from a bounded ring the updates it
applied that the download does not include.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from enum import StrEnum
from typing import Any

import numpy as np
from psrv.transport.config import TransportConfig
from psrv.transport.dedup import SeenUpdates
from psrv.transport.endpoint import ApplyHook, Endpoint, params_checksum
from psrv.transport.errors import (
    ControllerLostError,
    FrameRejectedError,
    InvalidUpdateError,
    JoinError,
    NotRunningError,
    SendQueueFullError,
    TransportError,
)
from psrv.transport.membership import ControllerWatch, HeartbeatTimer
from psrv.transport.mesh import CONTROLLER_ID, MeshOrganizer
from psrv.transport.messages import UNJOINED, Message, Op
from psrv.transport.peer import Peer, SentToken
from psrv.transport.replay import ReplayLog
from psrv.transport.replica import DEFAULT_TOLERANCE, ReplicaCheck, compare, covers, expected_replica
from psrv.transport.seen import restore
from psrv.transport.sockets import valid_address
from psrv.transport.updates import batch_message, check_payload, groups

#: ``apply_many(payloads, headers) -> [None | the exception that rejected that update]``
ApplyManyHook = Callable[[list[np.ndarray], list[dict]], list[Exception | None]]

_BACKOFF_FIRST_S = 0.1
_BACKOFF_MAX_S = 2.0
_UNKNOWN_HELD_MAX = 1024  # updates held from senders not announced yet (see _authenticate)
_UNKNOWN_HELD_MIN_S = 2.0
_DOWNLOAD_RETRY_MIN_S = 2.0  # a download with no progress for this long (or 4 beats) is asked for again
_STATS_KEYS = (
    "updates_sent",
    "updates_received",
    "updates_applied",
    "updates_relayed",
    "duplicates_dropped",
    "updates_dropped_backpressure",
    "resyncs",
    "rejected_total",
)


class NodeState(StrEnum):
    JOINING = "joining"
    SYNCING = "syncing"
    RUNNING = "running"


class Node(Endpoint):
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
    ) -> None:
        super().__init__(config, params, lock=lock, apply=apply)
        # several updates of one UPDATES frame go to ``apply_many`` at once (a device decodes them with
        # one transfer); it returns, per update, None (applied) or the exception that rejected it
        self._apply_many = apply_many
        # with an apply hook the live parameters are elsewhere (e.g. on a GPU): ``params`` is then only the
        # download target, and ``installed(params)`` is called (under the lock) after each download
        self._installed = installed
        self.controller_address = controller_address
        self.want_updater_state = want_updater_state
        self.updater_state: np.ndarray | None = None  # downloaded with the params when asked for
        self.restart = False  # the controller knew this node's name from an earlier join
        self.ids_held: list[int] = []  # every id the controller gave this node (a rejoin gets a new one)
        self.state = NodeState.JOINING
        self.mesh: MeshOrganizer | None = None
        self.seen = SeenUpdates(config.dedup_window)
        self._seq = 0
        self.replay = ReplayLog(config.replay_ring_messages, config.replay_ring_bytes)
        self._backlog: list[tuple[np.ndarray, dict]] = []
        self._slots = threading.BoundedSemaphore(config.submit_queue_messages)
        self._ctrl: Peer | None = None
        self._peers: dict[int, Peer] = {}
        # routing id -> member id of every sender this node accepts on its ROUTER (the controller
        # and its neighbours, as the controller announced them), the previous mesh's kept for its
        # in-flight messages
        self._routes: dict[bytes, int] = {}
        self._old_routes: dict[bytes, int] = {}
        # updates from a routing id not announced yet: a new neighbour may send before our MESH from
        # the controller arrives (a busy host delays it); held briefly and bounded, then handled or refused
        self._unknown_held: deque[tuple[float, Message, bytes, Any]] = deque()
        self._recent_origins: set[int] = set()  # departed members whose updates may still arrive
        self._ctrl_origins: set[int] = set()  # the origins of the controller's last watermark
        self._watch: ControllerWatch | None = None
        self._beat = HeartbeatTimer(config.heartbeat_s)
        # per controller beat: (its watermarks, our own seq then, our watermarks then)
        self._ctrl_watermarks: deque[tuple[dict, int, dict]] = deque(maxlen=3)
        self._acknowledged = 0  # the controller's watermark for our own updates, as last announced
        self._ack_changed = threading.Condition()
        self._last_resend = 0.0
        self._token = ""
        self._join_started = 0.0
        self._join_attempts = 0
        self._next_join = 0.0
        self._backoff = _BACKOFF_FIRST_S
        self._lost_since: float | None = None  # when the controller was lost (rejoining since)
        self._request_id = 0
        self._sync_first_request = 0  # any reply to a request of the current sync is a valid snapshot
        self._sync_deadline = 0.0
        self._sync_progress = 0.0  # when the download last moved (asked, or a chunk from the controller)
        self._sync_retry_s = 0.0
        self._last_sync = 0.0
        self._last_tick = time.monotonic()
        self._last_ctrl_beat = 0.0
        self._check_request = 0  # request id of the snapshot a check_replica call waits for
        self._check_snapshot: tuple[np.ndarray, dict, dict, int] | None = None

    # ------------------------------------------------------------------ caller API
    def submit(
        self, message: np.ndarray, *, iteration: int = 0, epoch: int = 0, apply_locally: bool = False
    ) -> int:
        """Send one encoded update (int32 message) to every other replica; returns its sequence number.

        The caller must already have applied it to ``params`` (hold ``node.lock`` across that and this
        call), or pass ``apply_locally=True``. The array is sent zero-copy: do not modify it afterwards.
        Raises SendQueueFullError (retryable) when the queue stays full for ``submit_timeout_s``, and
        the error that stopped the node (e.g. ControllerLostError) if it stopped.
        """
        if self._error is not None:
            raise self._error
        if not self.running:
            raise NotRunningError("node is not running (call start() first)")
        try:
            payload, info = check_payload(message, self.params.size, "submitted update", self.config.max_tau)
        except FrameRejectedError as exc:
            raise InvalidUpdateError(exc.detail) from None
        fields = {
            "iteration": int(iteration),
            "epoch": int(epoch),
            "tau": float(info.tau),
            "encoding": info.form,
        }
        if not self._slots.acquire(timeout=self.config.submit_timeout_s):
            raise SendQueueFullError(
                f"node {self.node_id}: {self.config.submit_queue_messages} submitted updates "
                f"still queued after {self.config.submit_timeout_s} s; submit again later"
            )
        with self.lock:
            if apply_locally:
                try:
                    self._decode(payload)
                except Exception as exc:
                    self._slots.release()
                    raise InvalidUpdateError(f"submitted update could not be applied: {exc}") from exc
            if self.state is NodeState.RUNNING:
                self._seq += 1
                seq, origin = self._seq, self.node_id
                self.replay.remember(origin, seq, payload, fields)
            else:  # (re)joining: numbered and sent once the catch-up is done
                self._backlog.append((payload, fields))
                if len(self._backlog) > self.config.replay_ring_messages:
                    # dropped consistently: the catch-up replaces the parameters it was applied to
                    del self._backlog[0]
                    self.counters_.add("backlog_dropped")
                self._slots.release()
                return 0
        self._commands.put(("send", origin, seq, payload, fields, True))
        self._wake()
        return seq

    def wait_acknowledged(self, timeout_s: float) -> bool:
        """Wait until the controller holds every update this node has submitted.

        True as soon as the controller's per-origin watermark, as announced to this node in its
        heartbeats, covers this node's last sequence number (updates submitted meanwhile extend the
        wait); False at the deadline (also when nothing was acknowledged because the node is
        (re)joining). Raises the error that stopped the node (ControllerLostError when the
        controller went silent or shut down), NotRunningError before start() or after stop().

        Call it before ``stop()`` for a leave that loses nothing: ``stop()`` flushes queued frames
        and says LEAVE, but an update a relay dropped on the way (a full queue, a dead relay) is
        only re-sent while this node is still a member, after the controller's watermark for it
        stood still for two beats. With True, leaving loses none of this node's updates; with
        False the master copy may lack some. Expect up to one controller heartbeat of latency.
        """
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        with self._ack_changed:
            while True:
                if self._error is not None:
                    raise self._error
                if not self.running:
                    raise NotRunningError("node is not running (call start() first)")
                if self._all_acknowledged():
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._ack_changed.wait(min(remaining, 0.1))  # also re-checks for a stop or an error

    def check_replica(
        self, timeout_s: float, tolerance: float = DEFAULT_TOLERANCE,
        current: Callable[[], np.ndarray] | None = None,
    ) -> ReplicaCheck:
        """Check the central invariant on this replica: it equals the master copy up to float rounding.

        Downloads a snapshot of the controller's parameters with the exact set of updates they include,
        waits (up to ``timeout_s``) until this node has applied every one of them, then compares
        ``params`` with the snapshot plus the updates this node applied that the snapshot lacks (from its
        replay ring; see transport/replica.py). Other members may go on sending meanwhile. Costs one
        parameter download; call it after ``wait_acknowledged``, e.g. once at the end of a task.
        Never raises for a timeout: the result's status says "unavailable". ``current`` returns the
        live replica on the host when it is not ``params`` (an ``apply`` hook that decodes elsewhere,
        e.g. into GPU parameters); it is called under the node's lock.
        """
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        last = "no snapshot arrived"
        try:
            requested = False
            while time.monotonic() < deadline:
                remaining = max(0.1, deadline - time.monotonic())
                if not requested:
                    requested = self.call(self._request_check, timeout_s=remaining)
                    if not requested:  # (re)joining or re-syncing: ask once it runs again
                        last = f"node is {self.state}"
                        time.sleep(0.05)
                        continue
                result = self.call(lambda: self._finish_check(tolerance, current), timeout_s=remaining)
                if isinstance(result, ReplicaCheck):
                    return result
                if result == "resynced":  # the replica was replaced meanwhile: check the new one
                    requested, last = False, "a re-sync replaced the replica during the check"
                    continue
                time.sleep(0.02)
        except (TransportError, TimeoutError) as exc:
            return ReplicaCheck("unavailable", detail=f"{type(exc).__name__}: {exc}")
        finally:
            self._check_request, self._check_snapshot = 0, None
        return ReplicaCheck("unavailable", detail=f"no comparable snapshot within {timeout_s} s ({last})")

    def _request_check(self) -> bool:
        if self.state is not NodeState.RUNNING or self._ctrl is None:
            return False
        self._request_id += 1
        self._check_request, self._check_snapshot = self._request_id, None
        self._post(
            self._ctrl,
            Message(Op.PARAMS_REQUEST, {"request_id": self._request_id, "want_updater": False},
                    src=self.node_id),
        )
        return True

    def _finish_check(
        self, tolerance: float, current: Callable[[], np.ndarray] | None = None
    ) -> ReplicaCheck | str | None:
        """On the I/O thread: the verdict once the snapshot is here and covered, "resynced" when the
        replica was replaced meanwhile (ask again), else None (not yet)."""
        if self._check_snapshot is None:
            if self.state is not NodeState.RUNNING:
                return "resynced"
            return None
        master, watermark, extra, resyncs = self._check_snapshot
        if self.counters_["resyncs"] != resyncs or self.state is not NodeState.RUNNING:
            self._check_request, self._check_snapshot = 0, None
            return "resynced"
        if not covers(self.seen, watermark, extra):
            return None
        from psrv.encoding import decode

        with self.lock:
            if self.replay.incomplete(watermark):
                return ReplicaCheck("incomplete", detail="updates beyond the snapshot fell out of the "
                                    "replay ring; raise replay_ring_messages / replay_ring_bytes")
            extra_sets = {o: set(s) for o, s in extra.items()}
            expected, replayed = expected_replica(master, self.replay.missing_from(watermark, extra_sets),
                                                  decode)
            live = self.params if current is None else current()
            return compare(live, expected, replayed, tolerance)

    def _all_acknowledged(self) -> bool:
        return self.state is not NodeState.JOINING and not self._backlog and self._acknowledged >= self._seq

    def _note_acknowledged(self, watermark: int) -> None:
        with self._ack_changed:
            self._acknowledged = watermark
            self._ack_changed.notify_all()

    def counters(self) -> dict[str, Any]:
        snap = super().counters()
        snap["state"] = str(self.state)
        snap["restart"] = self.restart
        snap["controller"] = self.controller_address
        snap["node_ids"] = list(self.ids_held)
        return snap

    # ------------------------------------------------------------------ lifecycle
    def _start_deadline_s(self) -> float:
        return self.config.join_timeout_s + self.config.catchup_timeout_s + 1.0

    def _start_timeout_error(self, waited: float) -> TransportError:
        return JoinError(
            f"node did not join and catch up with the controller at {self.controller_address} "
            f"within {waited:.1f} s (local address {self.address})"
        )

    def _all_peers(self) -> list[Peer]:
        return list(self._peers.values()) + ([self._ctrl] if self._ctrl is not None else [])

    def _on_start(self) -> None:
        self._ctrl = self._connect(CONTROLLER_ID, self.controller_address)
        self._listen(self._ctrl.socket)
        self._begin_join()

    def _begin_join(self) -> None:
        self.state = NodeState.JOINING
        self._token = uuid.uuid4().hex
        self._join_started = time.monotonic()
        self._join_attempts = 0
        self._next_join = 0.0
        self._backoff = _BACKOFF_FIRST_S

    def _on_stop(self) -> None:
        self._drain_commands()
        if self.node_id > 0 and self._ctrl is not None:
            self._post(self._ctrl, Message(Op.LEAVE, {"reason": "node stopping"}, src=self.node_id))
        self._flush_all(self.config.linger_s)
        self.log.info(
            "node %d (%s) stopping: %s",
            self.node_id,
            self.address,
            {k: self.counters_[k] for k in ("updates_sent", "updates_applied", "duplicates_dropped")},
        )

    def _on_failure(self, exc: BaseException) -> None:
        with self.lock:
            self._backlog.clear()
        with self._ack_changed:
            self._ack_changed.notify_all()  # a waiter in wait_acknowledged raises the error now

    # ------------------------------------------------------------------ commands
    def _on_commands(self, items: list[tuple]) -> None:
        """Send own updates, batched when several queued up (see batch.py)."""
        ready: list[tuple[dict, np.ndarray, bool]] = []
        for _kind, origin, seq, payload, fields, holds_slot in items:
            if origin != self.node_id or self.mesh is None:
                if holds_slot:
                    self._slots.release()
                continue  # submitted before a rejoin: the re-sync replaced the params it was applied to
            self.seen.first_time(origin, seq)
            ready.append(({"origin": origin, "seq": seq, **fields}, payload, holds_slot))
        if not ready:
            return
        targets = self.mesh.relay_targets(self.node_id, came_from=None)
        for group in groups(ready, size_of=lambda item: item[1].nbytes):
            slots = sum(1 for _, _, holds in group if holds)
            token = SentToken(len(targets), self._slots, slots) if slots else None
            self._relay([(fields, payload) for fields, payload, _ in group], came_from=None, token=token)
            self.counters_.add("updates_sent", len(group))

    # ------------------------------------------------------------------ timers
    def _retry_unknown_senders(self, now: float) -> None:
        """Handle held updates whose sender a newer mesh announced; refuse those that waited too long."""
        waiting = self._unknown_held
        self._unknown_held = deque()
        patience = max(_UNKNOWN_HELD_MIN_S, 4 * self.config.heartbeat_s)
        for held_at, msg, identity, sock in waiting:
            if identity in self._routes or identity in self._old_routes:
                self._handle(msg, identity, sock)
            elif now - held_at > patience:
                self._reject("bad_sender", f"{msg.op} claiming node {msg.src} from a connection never "
                             f"announced within {patience:.1f} s")
            else:
                self._unknown_held.append((held_at, msg, identity, sock))

    def _poll_timeout_s(self) -> float:
        """No poll wait while a join is due: the first JOIN leaves at once (a task's join would
        otherwise wait out one poll interval, ~50 ms of every epoch's fixed cost)."""
        if self.state is NodeState.JOINING and time.monotonic() >= self._next_join:
            return 0.0
        return super()._poll_timeout_s()

    def _tick(self) -> None:
        now = time.monotonic()
        if self._unknown_held:
            self._retry_unknown_senders(now)
        stalled, self._last_tick = now - self._last_tick, now
        if self._watch is not None and stalled > 2 * self.config.heartbeat_s:
            # this process was frozen (SIGSTOP, swapping): the silence was ours, not the controller's;
            # beat at once and let the controller say whether we are still a member
            self.log.warning(
                "node %d was frozen for %.1f s; checking in with the controller", self.node_id, stalled
            )
            self._watch.heard()
            self._beat = HeartbeatTimer(self.config.heartbeat_s)
        if self.state is NodeState.JOINING:
            if self._lost_since is not None:
                if now - self._lost_since > self.config.controller_lost_timeout_s:
                    raise ControllerLostError(
                        f"node {self.address} lost the controller at {self.controller_address} and could "
                        "not rejoin within controller_lost_timeout_s = "
                        f"{self.config.controller_lost_timeout_s:.1f} s ({self._join_attempts} join "
                        "attempts); what it submitted since is not in the master copy"
                    )
            elif now - self._join_started > self.config.join_timeout_s:
                raise JoinError(
                    f"could not join the controller at {self.controller_address} from local address "
                    f"{self.address}: no reply to {self._join_attempts} join attempts within "
                    f"{self.config.join_timeout_s:.1f} s (is the controller running and reachable, "
                    "and do the keys match?)"
                )
            if now >= self._next_join:
                self._join_attempts += 1
                self._post(
                    self._ctrl,
                    Message(
                        Op.JOIN,
                        {"address": self.address, "name": self.config.node_name, "token": self._token},
                    ),
                )
                self._next_join = now + self._backoff
                self._backoff = min(self._backoff * 2, _BACKOFF_MAX_S)
            return
        if self._watch is not None and self._watch.lost():
            # a partition or a paused driver: keep trying to rejoin for controller_lost_timeout_s;
            # on rejoin the replica is replaced by the master copy (see README: partitions)
            self.log.warning(
                "node %d (%s) lost the controller at %s: silent for %.1f s (timeout %.1f s); "
                "rejoining for up to %.1f s",
                self.node_id,
                self.address,
                self.controller_address,
                self._watch.silent_for(),
                self._watch.timeout_s,
                self.config.controller_lost_timeout_s,
            )
            self.counters_.add("controller_lost")
            self._rejoin("lost the controller")
            self._lost_since = now
            return
        if self.state is NodeState.SYNCING:
            if now > self._sync_deadline:
                raise JoinError(
                    f"node {self.node_id}: the parameter download from {self.controller_address} did not "
                    f"finish within {self.config.catchup_timeout_s:.1f} s "
                    f"({self._request_id - self._sync_first_request + 1} request(s))"
                )
            if now - self._sync_progress > self._sync_retry_s:
                self.log.warning(
                    "node %d: no part of the parameter download arrived for %.1f s; asking again",
                    self.node_id,
                    now - self._sync_progress,
                )
                self.counters_.add("download_retries")
                self._sync_retry_s *= 2  # back off: a slow link is not flooded with copies
                self._request_params()
        if self._beat.due():
            self.loop_stats.beat_sent(self._beat.lateness_s)
            self._send_heartbeat()

    def _send_heartbeat(self) -> None:
        stats: dict[str, Any] = {k: self.counters_[k] for k in _STATS_KEYS[:-1]}
        stats["rejected_total"] = self.counters_.rejected_total()
        stats["state"] = str(self.state)
        stats.update(self.counters_.gauges)  # e.g. mesh_version, and whatever the embedding process reports
        if self.config.status_stats and self.params.size <= self.config.checksum_max_params:
            with self.lock:
                stats.update(params_checksum(self.params))
        version = self.mesh.version if self.mesh is not None else 0
        self._post(
            self._ctrl,
            Message(
                Op.HEARTBEAT, {"mesh_version": version, "stats": stats, "watermark": {}}, src=self.node_id
            ),
            urgent=True,  # never behind our own queued updates
        )

    # ------------------------------------------------------------------ identity
    _CONTROLLER_OPS = frozenset(
        {Op.JOIN_REPLY, Op.MESH, Op.PARAMS_REPLY, Op.HEARTBEAT, Op.EVICTED, Op.SHUTDOWN, Op.STATUS_REPLY}
    )

    def _authenticate(self, msg: Message, identity: bytes | None, sock: Any) -> bool:
        """Replies come back on our own connection to the controller; everything else arrives on our
        ROUTER and counts only from a routing id the controller announced, under that member's id."""
        if identity is None:  # on the DEALER this node opened to the controller's address
            sender = CONTROLLER_ID
        else:
            sender = self._routes.get(identity)
            if sender is None:
                sender = self._old_routes.get(identity)
            if sender is None and self.state is NodeState.JOINING:
                self.counters_.add(
                    "ignored_while_joining"
                )  # e.g. the controller's first beat racing our reply
                return False
            if (
                sender is None
                and msg.op in (Op.UPDATE, Op.UPDATES, Op.CHUNK)
                and len(self._unknown_held) < _UNKNOWN_HELD_MAX
            ):
                self._unknown_held.append((time.monotonic(), msg, identity, sock))
                self.counters_.add("held_unknown_sender")
                return False
        if sender != msg.src:
            raise FrameRejectedError(
                "bad_sender", f"{msg.op} claiming node {msg.src} from a connection that is not its own"
            )
        if msg.op in self._CONTROLLER_OPS and sender != CONTROLLER_ID:
            raise FrameRejectedError(
                "bad_sender", f"{msg.op} from node {sender}: only the controller sends it"
            )
        if sender == CONTROLLER_ID and self._watch is not None:
            self._watch.heard()  # any frame of the controller's is a sign of life: a chunk of a download too
        return True

    def _set_routes(self, routes: dict) -> None:
        new = {bytes.fromhex(rid): int(node_id) for node_id, rid in routes.items()}
        if CONTROLLER_ID not in new.values():
            raise FrameRejectedError("bad_field", "routes lack the controller's routing id")
        self._old_routes, self._routes = self._routes, new

    def _origin_allowed(self, origin: int, came_from: int) -> bool:
        if origin == self.node_id or self.mesh is None:
            return False  # our own updates never come back; a forged one would be applied twice
        if origin not in self.mesh:  # departed: the controller still counts its in-flight updates
            return origin in self._recent_origins or origin in self._ctrl_origins
        if (
            came_from == CONTROLLER_ID
            or came_from not in self.mesh
            or came_from == self.mesh.parent(self.node_id)
        ):
            return True  # from above: the rest of the mesh
        parent = origin  # from a child: only its own subtree's updates
        while parent > CONTROLLER_ID:
            if parent == came_from:
                return True
            parent = self.mesh.parent(parent)
        return False

    # ------------------------------------------------------------------ handlers
    def _from_controller(self, msg: Message) -> bool:
        if msg.src == CONTROLLER_ID:
            if self._watch is not None:
                self._watch.heard()
            return True
        return False

    def on_join_reply(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        if (
            not self._from_controller(msg)
            or self.state is not NodeState.JOINING
            or msg["token"] != self._token
        ):
            return  # a late reply to an earlier attempt
        mesh = MeshOrganizer.from_dict(msg["mesh"])
        if msg["node_id"] not in mesh:
            raise FrameRejectedError("bad_field", f"join reply: node {msg['node_id']} is not in its mesh")
        self._set_routes(msg["routes"])
        self._old_routes = {}
        with self.lock:
            self.node_id = msg["node_id"]
            self._seq = 0
        self.ids_held.append(self.node_id)
        self._note_acknowledged(0)
        self._lost_since = None
        self.restart = msg["restart"]
        pace = (float(msg["heartbeat_s"]), int(msg["missed_beats"]))
        if pace != (self.config.heartbeat_s, self.config.missed_beats) and pace[0] > 0 and pace[1] > 0:
            self.config = self.config.replace(
                heartbeat_s=pace[0], missed_beats=pace[1]
            )  # the controller's pace
            self._beat = HeartbeatTimer(self.config.heartbeat_s)
        self._watch = ControllerWatch(self.config.effective_controller_timeout_s)
        self._install_mesh(mesh)
        self.log.info(
            "node %d joined the controller at %s from %s after %d attempt(s): parent %d, mesh version %d%s",
            self.node_id,
            self.controller_address,
            self.address,
            self._join_attempts,
            mesh.parent(self.node_id),
            mesh.version,
            " (restart)" if self.restart else "",
        )
        self._begin_sync("catch-up after joining")

    def on_mesh(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        if not self._from_controller(msg) or self.mesh is None or msg["version"] <= self.mesh.version:
            return
        mesh = MeshOrganizer.from_dict(msg["mesh"])
        if self.node_id not in mesh:
            self._rejoin(f"mesh version {mesh.version} no longer holds node {self.node_id}")
            return
        self._set_routes(msg["routes"])
        self._install_mesh(mesh)

    def on_heartbeat(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        if not self._from_controller(msg) or self.state is NodeState.JOINING:
            return
        if identity is None:  # the controller's liveness beat, on our own connection: a sign of life only
            now = time.monotonic()
            if self._last_ctrl_beat:  # the longest silence between two of the controller's beats
                gap = (now - self._last_ctrl_beat) * 1000.0
                if gap > self.counters_.gauges.get("beat_gap_max_ms", 0.0):
                    self.counters_.gauges["beat_gap_max_ms"] = round(gap, 2)
            self._last_ctrl_beat = now
            return
        # the beat with the watermarks, in order with the updates relayed to us on the same pipe
        latest = {int(k): int(v) for k, v in msg["watermark"].items()}
        self._ctrl_origins = set(latest)
        self._prune_origins(latest)
        self._note_acknowledged(latest.get(self.node_id, 0))
        if self.state is not NodeState.RUNNING:
            return
        mine = self.seen.watermark()
        self._ctrl_watermarks.append((latest, self._seq, mine))
        if len(self._ctrl_watermarks) < self._ctrl_watermarks.maxlen:
            return
        # two beats ago; a gap is what is still missing AND not moving: a slow path (a backlog) moves
        old, own_seq_then, mine_then = self._ctrl_watermarks[0]
        now = time.monotonic()
        quiet = self.config.heartbeat_s * self.config.missed_beats
        acknowledged = latest.get(self.node_id, 0)
        stuck = acknowledged == old.get(self.node_id, 0)
        if stuck and acknowledged < own_seq_then and now - self._last_resend > quiet:
            self._last_resend = now
            self._resend_own(acknowledged, own_seq_then)
        behind = [
            o
            for o, w in old.items()
            if o != self.node_id and mine.get(o, 0) < w and mine.get(o, 0) == mine_then.get(o, 0)
        ]
        if behind and now - self._last_sync > quiet:
            self.log.warning(
                "node %d is behind the controller for origins %s: re-syncing", self.node_id, behind[:8]
            )
            self._begin_sync(f"behind for origins {behind[:8]}")

    def _prune_origins(self, latest: dict[int, int]) -> None:
        """Forget what the controller forgot: departed origins no longer in its watermark."""
        self._recent_origins &= self._ctrl_origins
        if self.mesh is None:
            return
        for origin in self.seen.origins():
            if origin not in latest and origin not in self.mesh and origin != self.node_id:
                self.seen.forget(origin)

    def _resend_own(self, acknowledged: int, upto: int) -> None:
        """Own updates sent two beats ago that the controller still lacks were lost in flight (a relay
        died): send them again from the replay ring; duplicates are dropped by every receiver."""
        with self.lock:
            again = self.replay.own(self.node_id, acknowledged, upto)
        items = [({"origin": self.node_id, "seq": seq, **fields}, payload) for seq, payload, fields in again]
        for group in groups(items):
            self._relay(group, came_from=None)
        self.counters_.add("updates_resent", len(again))
        self.log.warning(
            "node %d: the controller lacks own updates %d..%d; resent %d from the ring",
            self.node_id,
            acknowledged + 1,
            upto,
            len(again),
        )

    def on_update(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        if self.state is NodeState.JOINING:
            return
        self._from_controller(msg)
        fresh = self._fresh_updates(msg)
        if not fresh:
            return
        self._relay([(f, b) for f, b, _ in fresh], came_from=msg.src)
        if self.state is NodeState.SYNCING:
            for fields, _, payload in fresh:
                if not self.replay.hold(fields["origin"], fields["seq"], payload, fields):
                    self.counters_.add("updates_dropped_backpressure")
            return
        with self.lock:
            if self._apply_many is not None and len(fresh) > 1:
                self._apply_batch(fresh)
                return
            for fields, _, payload in fresh:
                if self._apply_counted(payload, fields):
                    self.replay.remember(fields["origin"], fields["seq"], payload, fields)

    def _apply_batch(self, fresh: list[tuple[dict, Any, np.ndarray]]) -> None:
        """Apply several updates through the ``apply_many`` hook, counted like one by one (under the lock)."""
        results = self._apply_many([payload for _, _, payload in fresh], [fields for fields, _, _ in fresh])
        for (fields, _, payload), error in zip(fresh, results, strict=True):
            if error is not None:
                self._reject("bad_payload", f"update {fields.get('origin')}/{fields.get('seq')}: {error}")
                continue
            self.counters_.applied(fields["origin"])
            self.replay.remember(fields["origin"], fields["seq"], payload, fields)

    on_updates = on_update  # a batch is handled row by row, exactly like single updates

    def on_params_reply(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        if (
            self._check_request
            and msg["request_id"] == self._check_request
            and self.state is NodeState.RUNNING
            and self._from_controller(msg)
        ):  # a snapshot for check_replica, not a catch-up
            self._check_snapshot = (
                np.frombuffer(msg.buffers[0], dtype=np.dtype(msg["dtype"])).copy(),
                {int(o): int(w) for o, w in msg["watermark"].items()},
                {int(o): [int(x) for x in s] for o, s in msg["extra_seen"].items()},
                self.counters_["resyncs"],
            )
            # the snapshot's watermark acknowledges this node's updates as a heartbeat's does (sooner)
            self._note_acknowledged(max(self._acknowledged, self._check_snapshot[1].get(self.node_id, 0)))
            return
        if (
            not self._from_controller(msg)
            or self.state is not NodeState.SYNCING
            or not self._sync_first_request <= msg["request_id"] <= self._request_id
        ):
            return
        master = np.frombuffer(msg.buffers[0], dtype=np.dtype(msg["dtype"]))
        if master.size != self.params.size:
            raise FrameRejectedError(
                "bad_payload", f"params reply of {master.size} values, this model has {self.params.size}"
            )
        watermark = {int(o): int(w) for o, w in msg["watermark"].items()}
        self._ctrl_origins = set(watermark)
        extra = {int(o): set(map(int, s)) for o, s in msg["extra_seen"].items()}
        replayed = 0
        with self.lock:
            np.copyto(self.params, master, casting="same_kind")
            if self._installed is not None:
                self._installed(self.params)
            if msg["updater_dtype"] is not None:
                self.updater_state = np.frombuffer(
                    msg.buffers[1], dtype=np.dtype(msg["updater_dtype"])
                ).copy()
            incomplete = self.replay.incomplete(watermark)
            seen = restore(self.config.dedup_window, watermark, {o: sorted(s) for o, s in extra.items()})
            for origin, seq, payload, fields in self.replay.missing_from(watermark, extra):
                self._apply_update(payload, fields)  # applied here, not (yet) in the master copy; decodes
                seen.first_time(origin, seq)
                replayed += 1
            for origin, seq, payload, fields in self.replay.take_held():  # arrived during the download
                if seen.first_time(origin, seq) and self._apply_counted(payload, fields):
                    self.replay.remember(origin, seq, payload, fields)
            self.seen = seen
            self.state = NodeState.RUNNING
            backlog, self._backlog = self._backlog, []
            sends = []
            for payload, fields in backlog:  # submitted while joining: its local apply was just overwritten
                self._decode(payload)
                self._seq += 1
                self.replay.remember(self.node_id, self._seq, payload, fields)
                sends.append(("send", self.node_id, self._seq, payload, fields, False))
        if sends:  # sent here: a put on our own bounded command queue could block this (its only) reader
            self._on_commands(sends)
        if incomplete:
            self.counters_.add("resync_incomplete")
            self.log.warning(
                "node %d: the replay ring was too short for origins %s; this replica may differ",
                self.node_id,
                incomplete[:8],
            )
        self._last_sync = time.monotonic()
        self._ctrl_watermarks.clear()
        self._ready.set()
        self.log.info(
            "node %d caught up: %d values, %d origins covered, %d replayed",
            self.node_id,
            master.size,
            len(watermark),
            replayed,
        )

    def _chunk_arrived(self, chunk: Message) -> None:
        if chunk.src == CONTROLLER_ID and self.state is NodeState.SYNCING:
            self._sync_progress = time.monotonic()  # a large download is moving: no need to ask again

    def on_evicted(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        if msg["node_id"] != self.node_id:
            return  # about an id this process held before it rejoined (its old frames arrived late)
        if self._from_controller(msg) and self.state is not NodeState.JOINING:
            self._rejoin(msg["reason"])

    def on_shutdown(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        if self._from_controller(msg):
            raise ControllerLostError(
                f"node {self.node_id} ({self.address}): the controller at "
                f"{self.controller_address} shut down ({msg['reason']})"
            )

    # ------------------------------------------------------------------ internals
    def _decode(self, payload: np.ndarray) -> None:
        if self._apply_hook is not None:  # the live parameters are behind the hook
            self._apply_hook(payload, {})
            return
        from psrv.encoding import decode

        decode(payload, self.params)

    def _relay(
        self, items: list[tuple[dict, Any]], came_from: int | None, token: SentToken | None = None
    ) -> None:
        """Send ``(fields, buffer)`` updates to every neighbour but ``came_from`` (None: our own)."""
        own = came_from is None
        for target in self.mesh.relay_targets(self.node_id, came_from=came_from):
            peer = self._ctrl if target == CONTROLLER_ID else self._peers.get(target)
            if peer is None:
                if token is not None:
                    token.sent()
                continue
            for group in groups(items) if token is None else [items]:
                if self._post(peer, batch_message(group, self.node_id), droppable=not own, token=token):
                    if not own:
                        self.counters_.add("updates_relayed", len(group))
                else:
                    self.counters_.add("updates_dropped_backpressure", len(group))
                    self._limited.warning(
                        f"drop:{target}",
                        "node %d: send queue to %d full, update dropped",
                        self.node_id,
                        target,
                    )

    def _install_mesh(self, mesh: MeshOrganizer) -> None:
        wanted = {n for n in mesh.neighbours(self.node_id) if n != CONTROLLER_ID}
        bad = [mesh.address(n) for n in wanted if not valid_address(mesh.address(n))]
        if bad:
            raise FrameRejectedError(
                "bad_field", f"mesh v{mesh.version} names invalid addresses {bad[:4]!r:.200}"
            )
        if self.mesh is not None:
            self._recent_origins = (self._recent_origins | set(self.mesh.node_ids())) - set(mesh.node_ids())
        self.mesh = mesh
        self.counters_.gauges["mesh_version"] = mesh.version
        for node_id in list(self._peers):
            peer = self._peers[node_id]
            if node_id not in wanted or peer.address != mesh.address(node_id):
                self._close_peer(self._peers.pop(node_id), self.config.linger_s)
        for node_id in wanted - set(self._peers):
            self._peers[node_id] = Peer(
                node_id, mesh.address(node_id), self._connect_advertised(mesh.address(node_id))
            )

    def _begin_sync(self, reason: str) -> None:
        self.state = NodeState.SYNCING
        self._sync_first_request = self._request_id + 1
        self._sync_deadline = time.monotonic() + self.config.catchup_timeout_s
        self._sync_retry_s = max(_DOWNLOAD_RETRY_MIN_S, 4 * self.config.heartbeat_s)
        self.counters_.add("resyncs")
        self.log.info("node %d requesting the master copy (%s)", self.node_id, reason)
        self._request_params()

    def _request_params(self) -> None:
        """Ask for the master copy; a lost reply (or chunk of it) is asked for again by ``_tick``."""
        self._request_id += 1
        self._sync_progress = time.monotonic()
        self._post(
            self._ctrl,
            Message(
                Op.PARAMS_REQUEST,
                {"request_id": self._request_id, "want_updater": self.want_updater_state},
                src=self.node_id,
            ),
        )

    def _rejoin(self, reason: str) -> None:
        self.log.warning("node %d must rejoin: %s", self.node_id, reason)
        self._unknown_held.clear()
        with self.lock:
            self.replay.clear()
            self.node_id = UNJOINED
            self.state = NodeState.JOINING
        for peer in self._peers.values():
            self._close_peer(peer, 0.0)
        self._peers.clear()
        self.mesh = None
        self._routes, self._old_routes = {}, {}
        self._recent_origins = set()
        self.seen = SeenUpdates(self.config.dedup_window)
        self.counters_.add("rejoins")
        self._begin_join()
