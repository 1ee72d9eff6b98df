"""The node protocol as a state machine: ``NodeMachine.handle(event, now) -> actions``.

Split by job: node_updates.py (own updates out, received ones checked, deduplicated, relayed,
applied), node_catchup.py (downloads, re-sync, the replica probe), node_guard.py (routes, allowed
origins, the bounded waiting rooms), node_timers.py (join back-off, lost controller, beats).

No sockets, threads or clocks: the driver (``transport/loop.py`` in production, ``tests/sim/`` in
tests) turns arrivals, timers and API calls into events (transport/events.py) and carries out the
actions (send, connect, disconnect, ready, stop). ``now`` is the driver's monotonic time; every
random choice (the join token and session) comes from the injected ``random_bytes``, so a
simulation that seeds it replays exactly. Nothing a frame says raises out of ``handle``: a bad
message is a counted rejection (``counters_.snapshot()["rejected"]``).

Construct::

    NodeMachine(config, params, controller_address, random_bytes=rng.randbytes)

optional: ``apply(payload, header)`` / ``apply_many(payloads, headers)`` (the live parameters are
elsewhere, e.g. on a GPU), ``installed(params)`` (after each download), ``want_updater_state``,
``counters`` (shared with the driver). The machine holds no lock and is entered by one thread at a
time: the facade (server/node.py) holds its lock around every ``handle``, so ``params`` and the
replay ring never change under a caller that holds it. Besides the loop's actions it returns
``ReleaseSlots(n)`` (submit-queue slots to give back; the slots of an own update sent to peers are
given back by its ``Send.token`` once the frames reached every target socket, bound by the facade)
and ``Notify(what)`` ("ready" once caught up, "acknowledged" when the controller's watermark of our
updates moved, "stopped"): the facade carries those out.

Lifecycle: ``Started(address)`` draws a session (16 random bytes, sent in JOIN; each connection to
member ``m`` presents ``link_id(session, m)``, server/identity.py), opens the connection to the
controller and sends JOIN, again with back-off until ``join_timeout_s`` (then ``Stop(JoinError)``).
JOIN_REPLY gives the id, the mesh and the routes (routing id -> member: a member's messages count
only from the routing id announced for it; controller-only ops only from the controller; updates
from a routing id or of an origin this node's view does not explain yet wait, bounded, for the
MESH that does). The node then downloads the master copy (SYNCING: updates that arrive are relayed
and held), installs it, replays what it lacks (own updates in flight, from the replay ring),
applies the held updates not included, numbers and sends the backlog submitted while joining,
says ``Ready`` and runs. Each update is applied once
(dedup by origin and seq) and relayed to every neighbour but the one it came from (relayed copies
are ``droppable``; own ones never). The controller's watermark beats drive two repairs: own
updates it still lacks after two beats are sent again, and origins this node is behind on for two
beats trigger a re-sync (own re-sends go straight to the controller). A silent controller starts
rejoin attempts (a new session each) for
``controller_lost_timeout_s`` (then ``Stop(ControllerLostError)``); EVICTED rejoins at once,
SHUTDOWN stops with ControllerLostError. ``Stopping`` says LEAVE.

Submits: ``handle(Submit(payload, fields))`` numbers the update (``submitted_seq``), remembers it
and sends it; with ``more`` set it is gathered and sent with the next event (``SendSubmitted``),
several in one batch. While (re)joining the update goes to the backlog instead (``submitted_seq``
0): it is numbered and sent after the catch-up, or dropped with the replica it was applied to
(``backlog_dropped``). Requests of a replica check: ``CheckRequested``, ``CheckDone``.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from psrv.server.dedup import SeenUpdates
from psrv.server.identity import SESSION_BYTES, link_id
from psrv.server.liveness import BeatTimer, FreezeGuard, PeerWatch
from psrv.server.mesh import CONTROLLER_ID, MeshOrganizer
from psrv.server.node_catchup import PendingDownload, ReplicaProbe, SyncPath
from psrv.server.node_guard import HeldQueue, Routes, check_addresses, mesh_of
from psrv.server.node_state import NodeState, SlotToken
from psrv.server.node_timers import Timers
from psrv.server.node_updates import UpdatePath
from psrv.server.replay import ReplayLog
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters, RateLimitedLog
from psrv.transport.errors import (
    ControllerLostError,
    FatalTransportError,
    FrameRejectedError,
    TransportError,
)
from psrv.transport.events import (
    Action,
    CheckDone,
    CheckRequested,
    ChunkArrived,
    Connect,
    Disconnect,
    Dropped,
    Event,
    Notify,
    Received,
    ReleaseSlots,
    Send,
    Started,
    Stop,
    Stopping,
    Submit,
    Tick,
)
from psrv.transport.messages import UNJOINED, Message, Op

ApplyHook = Callable[[np.ndarray, dict], None]
#: ``apply_many(payloads, headers) -> [None | the exception that rejected that update]``
ApplyManyHook = Callable[[list[np.ndarray], list[dict]], list[Exception | None]]

BACKOFF_FIRST_S = 0.1
_CONTROLLER_OPS = frozenset(
    {Op.JOIN_REPLY, Op.MESH, Op.PARAMS_REPLY, Op.HEARTBEAT, Op.EVICTED, Op.SHUTDOWN, Op.STATUS_REPLY}
)


class NodeMachine(UpdatePath, SyncPath, Timers):
    """A worker's side of the mesh protocol; see the module docstring."""

    def __init__(
        self,
        config: TransportConfig,
        params: np.ndarray,
        controller_address: str,
        *,
        random_bytes: Callable[[int], bytes],
        apply: ApplyHook | None = None,
        apply_many: ApplyManyHook | None = None,
        installed: Callable[[np.ndarray], None] | None = None,
        want_updater_state: bool = False,
        counters: Counters | None = None,
    ) -> None:
        self.config = config
        self.params = params
        self.controller_address = controller_address
        self.want_updater_state = want_updater_state
        self._random = random_bytes
        self._apply_hook, self._apply_many, self._installed = apply, apply_many, installed
        self.counters_ = counters if counters is not None else Counters()
        self.log = logging.getLogger("psrv.transport.node")
        self._now = 0.0
        self._limited = RateLimitedLog(self.log, config.log_interval_s, clock=lambda: self._now)
        self.address: str | None = None
        self.session = b""  # drawn per join: the key of this node's per-link routing ids (``link_id``)
        self.node_id = UNJOINED
        self.ids_held: list[int] = []  # every id the controller gave this node (a rejoin gets a new one)
        self.restart = False  # the controller knew this node's name from an earlier join
        self.updater_state: np.ndarray | None = None
        self.state = NodeState.JOINING
        self.mesh: MeshOrganizer | None = None
        self.seen = SeenUpdates(config.dedup_window)
        self.seq = 0
        self.submitted_seq = 0  # what the last Submit was numbered (0: kept in the backlog)
        self.replay = ReplayLog(config.replay_ring_messages, config.replay_ring_bytes)
        self.backlog: list[tuple[np.ndarray, dict]] = []
        self.acknowledged = 0  # the controller's watermark of our own updates, as last announced
        self.stopped: BaseException | None | bool = False  # False while running; then the error or None
        self.last_applied_now: float | None = None  # driver time of the last applied update
        self._peers: dict[int, str] = {}  # mesh neighbours we hold a connection to -> their address
        self._routes = Routes()
        self._unknown: HeldQueue[Received] = HeldQueue()  # from routing ids not announced yet
        self._stale: HeldQueue[tuple[dict, Any, np.ndarray, int, int]] = HeldQueue()  # bad_origin rows
        self._recent_origins: set[int] = set()  # departed members whose updates may still arrive
        self._ctrl_origins: set[int] = set()  # the origins of the controller's last watermark
        self._watch: PeerWatch | None = None  # the controller's liveness, once joined
        self._beat = BeatTimer(config.heartbeat_s)
        self._freeze = FreezeGuard(config.heartbeat_s)
        self._ctrl_watermarks: deque[tuple[dict, int, dict]] = deque(maxlen=3)  # (theirs, own seq, ours)
        self._last_resend = -1e18
        self._last_departed_resend: dict[int, float] = {}  # departed origin -> when we last re-sent for it
        self._departed_at: dict[int, float] = {}  # left our mesh view -> when (_resend_departed)
        self._token = ""
        self._join_started = self._next_join = 0.0
        self._join_attempts = 0
        self._backoff = BACKOFF_FIRST_S
        self._lost_since: float | None = None  # when the controller was lost (rejoining since)
        self._last_ctrl_beat: float | None = None
        self.download = PendingDownload(config.catchup_timeout_s)
        self.probe = ReplicaProbe()
        self._out: list[Action] = []
        self._gathered: list[dict] = []  # own updates of "send" commands with ``more`` set

    def link_id(self, to: int) -> bytes:
        """The routing id this node's connection to member ``to`` presents (server/identity.py)."""
        return link_id(self.session, to)

    # ------------------------------------------------------------------ the one entry point
    def handle(self, event: Event, now: float) -> list[Action]:
        """Advance the protocol by one event; the actions for the driver to carry out, in order."""
        self._now = now
        if self.stopped is not False:
            self.submitted_seq = 0
            if isinstance(event, Submit) and event.slot:
                return [ReleaseSlots(1)]  # a submit that raced the stop
            return []
        self._out = out = []
        if self._gathered and not isinstance(event, Submit):
            self._flush_gathered()
        try:
            if isinstance(event, Received):
                self._on_received(event)
            elif isinstance(event, Tick):
                self._tick(now)
            elif isinstance(event, Submit):
                self._on_submit(event)
            elif isinstance(event, CheckRequested):
                self._request_check()
            elif isinstance(event, CheckDone):
                self.probe.reset()
            elif isinstance(event, ChunkArrived):
                self._on_chunk(event)
            elif isinstance(event, Dropped):
                self._on_dropped(event)
            elif isinstance(event, Started):
                self._on_started(event)
            elif isinstance(event, Stopping):
                self._on_stopping()
        except FatalTransportError as exc:  # the node's own fatal state (join deadline, lost controller)
            self._stop(exc)
        return out

    def _emit(self, action: Action) -> None:
        self._out.append(action)

    def _send_ctrl(self, message: Message, *, urgent: bool = False) -> None:
        self._emit(Send(CONTROLLER_ID, message, urgent=urgent))

    def _stop(self, error: BaseException | None) -> None:
        if error is not None:
            self.log.error("node %d (%s) stopped: %s", self.node_id, self.address, error)
        self.backlog.clear()
        slots = sum(1 for item in self._gathered if item.get("slot"))
        self._gathered = []
        if slots:
            self._emit(ReleaseSlots(slots))
        self.stopped = error
        self._emit(Stop(error))
        self._emit(Notify("stopped"))

    def _reject(self, reason: str, detail: str) -> None:
        self.counters_.reject(reason)
        self._limited.warning(f"reject:{reason}", "node %s rejected a message (%s): %s",
                              self.address, reason, detail)

    # ------------------------------------------------------------------ the task thread's requests
    def _on_submit(self, event: Submit) -> None:
        """Number and remember one checked own update (applied locally already), then send it (or
        gather it while ``more`` says another follows); while (re)joining keep it in the backlog."""
        if self.state is NodeState.RUNNING:
            self.seq += 1
            self.submitted_seq = self.seq
            self.replay.remember(self.node_id, self.seq, event.payload, event.fields)
            self._gathered.append({"origin": self.node_id, "seq": self.seq, "payload": event.payload,
                                   "fields": event.fields, "slot": event.slot})
            if not event.more:
                self._flush_gathered()
            return
        self.submitted_seq = 0
        self.backlog.append((event.payload, event.fields))
        if len(self.backlog) > self.config.replay_ring_messages:
            # dropped consistently: the catch-up replaces the parameters it was applied to
            del self.backlog[0]
            self.counters_.add("backlog_dropped")
        if event.slot:
            self._emit(ReleaseSlots(1))

    def all_acknowledged(self) -> bool:
        """Does the controller hold every update this node submitted (as its last beat said)?"""
        return self.state is not NodeState.JOINING and not self.backlog and self.acknowledged >= self.seq

    def check_verdict(self, tolerance: float, current: Callable[[], np.ndarray] | None = None) -> Any:
        """``check_replica``'s verdict (see ReplicaProbe.verdict); the caller holds the facade's lock."""
        live = current if current is not None else (lambda: self.params)
        return self.probe.verdict(self.state is NodeState.RUNNING, self.counters_["resyncs"],
                                  self.seen, self.replay, live, tolerance)

    # ------------------------------------------------------------------ driver events
    def _on_started(self, event: Started) -> None:
        self.address = event.address
        self._begin_join()
        self._tick(self._now)  # the first JOIN leaves at once

    def _on_stopping(self) -> None:
        if self.node_id > 0:
            self._send_ctrl(Message(Op.LEAVE, {"reason": "node stopping"}, src=self.node_id))
        self.log.info("node %d (%s) stopping: %s", self.node_id, self.address,
                      {k: self.counters_[k] for k in ("updates_sent", "updates_applied",
                                                      "duplicates_dropped")})
        self._stop(None)

    def _on_chunk(self, event: ChunkArrived) -> None:
        """A piece of a large message was stored: from the controller, a sign of life, and a download
        that moves (no need to ask again). Only on the controller's connection, whatever it claims."""
        if event.src != CONTROLLER_ID:
            return
        on_ctrl = event.via == CONTROLLER_ID if event.routing_id is None else (
            self._routes.sender(event.routing_id) == CONTROLLER_ID)
        if not on_ctrl:
            return
        if self._watch is not None:
            self._watch.heard(self._now)
        if self.state is NodeState.SYNCING:
            self.download.progress = self._now

    def _on_dropped(self, event: Dropped) -> None:
        self.counters_.add("updates_dropped_backpressure", event.count)
        self.counters_.add("updates_relayed", -event.count)
        self._limited.warning(f"drop:{event.peer}", "node %d: send queue to %d full, %d update(s) dropped",
                              self.node_id, event.peer, event.count)

    def _flush_gathered(self) -> None:
        items, self._gathered = self._gathered, []
        self._send_own(items)

    def _on_received(self, event: Received, *, held: bool = False) -> None:
        msg = event.message
        try:
            if not self._authenticate(event, held):
                return
            handler = _HANDLERS.get(msg.op)
            if handler is None:
                raise FrameRejectedError("unknown_type", f"a node does not accept {msg.op} messages")
            handler(self, msg, event.routing_id)
        except FrameRejectedError as exc:
            self._reject(exc.reason, exc.detail)
        except FatalTransportError:
            raise
        except TransportError as exc:  # e.g. MeshError / InvalidSequenceError from a crafted message
            self._reject("bad_message", f"{type(exc).__name__}: {exc}")

    def _authenticate(self, event: Received, held: bool) -> bool:
        """Replies come back on our own connection to the controller; everything else arrives on our
        ROUTER and counts only from a routing id the controller announced, under that member's id.
        False: ignore quietly (or held); FrameRejectedError("bad_sender"): counted."""
        msg = event.message
        if event.routing_id is None:
            if event.via not in (None, CONTROLLER_ID):
                raise FrameRejectedError("bad_sender", f"{msg.op} on the connection to node {event.via}")
            sender = CONTROLLER_ID
        else:
            sender = self._routes.sender(event.routing_id)
            if sender is None and self.state is NodeState.JOINING:
                self.counters_.add("ignored_while_joining")  # e.g. the controller's beat racing our reply
                return False
            # a new neighbour may send before the controller's MESH naming it reaches us
            if (sender is None and not held and msg.op in (Op.UPDATE, Op.UPDATES)
                    and self._unknown.hold(self._now, event)):
                self.counters_.add("held_unknown_sender")
                return False
        if sender != msg.src:
            raise FrameRejectedError("bad_sender", f"{msg.op} claiming node {msg.src} from a connection "
                                     "that is not its own")
        if msg.op in _CONTROLLER_OPS and sender != CONTROLLER_ID:
            raise FrameRejectedError("bad_sender",
                                     f"{msg.op} from node {sender}: only the controller sends it")
        if sender == CONTROLLER_ID and self._watch is not None:
            self._watch.heard(self._now)  # any frame of the controller's is a sign of life
        return True

    def on_join_reply(self, msg: Message, routing_id: bytes | None) -> None:
        if self.state is not NodeState.JOINING or msg["token"] != self._token:
            return  # a late reply to an earlier attempt
        mesh = mesh_of(msg)
        if msg["node_id"] not in mesh:
            raise FrameRejectedError("bad_field", f"join reply: node {msg['node_id']} is not in its mesh")
        check_addresses(mesh, msg["node_id"])  # (everything is checked before anything changes)
        self._routes.announce(msg["routes"], fresh=True)
        self.node_id = msg["node_id"]
        self.seq = 0
        self.ids_held.append(self.node_id)
        self._set_acknowledged(0)
        self._lost_since = None
        self.restart = msg["restart"]
        pace = (float(msg["heartbeat_s"]), int(msg["missed_beats"]))
        if pace != (self.config.heartbeat_s, self.config.missed_beats):
            # the controller's pace
            self.config = self.config.replace(heartbeat_s=pace[0], missed_beats=pace[1])
            self._beat = BeatTimer(self.config.heartbeat_s)
            self._freeze = FreezeGuard(self.config.heartbeat_s, self._now)
        self._watch = PeerWatch(self.config.effective_controller_timeout_s, self._now)
        self._install_mesh(mesh)
        self.log.info("node %d joined the controller at %s from %s after %d attempt(s): parent %d, "
                      "mesh version %d%s", self.node_id, self.controller_address, self.address,
                      self._join_attempts, mesh.parent(self.node_id), mesh.version,
                      " (restart)" if self.restart else "")
        self._begin_sync("catch-up after joining")

    def on_mesh(self, msg: Message, routing_id: bytes | None) -> None:
        if self.mesh is None or msg["version"] <= self.mesh.version:
            return
        mesh = mesh_of(msg)
        if self.node_id not in mesh:
            self._rejoin(f"mesh version {mesh.version} no longer holds node {self.node_id}")
            return
        check_addresses(mesh, self.node_id)
        self._routes.announce(msg["routes"])
        self._install_mesh(mesh)
        self._release_held()

    def on_update(self, msg: Message, routing_id: bytes | None) -> None:
        if self.state is NodeState.JOINING:
            return
        fresh = self._fresh_updates(msg)
        if fresh:
            self._take(fresh, msg.src)

    on_updates = on_update  # a batch is handled row by row, exactly like single updates

    def on_evicted(self, msg: Message, routing_id: bytes | None) -> None:
        if msg["node_id"] == self.node_id and self.state is not NodeState.JOINING:
            self._rejoin(msg["reason"])  # (else about an id this process held before it rejoined)

    def on_shutdown(self, msg: Message, routing_id: bytes | None) -> None:
        raise ControllerLostError(f"node {self.node_id} ({self.address}): the controller at "
                                  f"{self.controller_address} shut down ({msg['reason']})")

    # ------------------------------------------------------------------ mesh and membership
    def _install_mesh(self, mesh: MeshOrganizer) -> None:
        wanted = {n for n in mesh.neighbours(self.node_id) if n != CONTROLLER_ID}
        if self.mesh is not None:
            gone = set(self.mesh.node_ids()) - set(mesh.node_ids())
            self._recent_origins = (self._recent_origins | gone) - set(mesh.node_ids())
            self._departed_at.update({origin: self._now for origin in sorted(gone)})
        self.mesh = mesh
        self.counters_.gauges["mesh_version"] = mesh.version
        for node_id in sorted(self._peers):
            if node_id not in wanted or self._peers[node_id] != mesh.address(node_id):
                del self._peers[node_id]
                self._emit(Disconnect(node_id, self.config.linger_s))
        for node_id in sorted(wanted - set(self._peers)):
            self._peers[node_id] = mesh.address(node_id)
            self._emit(Connect(node_id, mesh.address(node_id), routing_id=self.link_id(node_id)))

    def _begin_join(self) -> None:
        self.state = NodeState.JOINING
        self._token = self._random(16).hex()
        self.session = self._random(SESSION_BYTES)
        # a new session, a new connection to the controller: replies (JOIN_REPLY, PARAMS_REPLY, its
        # liveness beats) come back on it; the old one (a previous membership) is replaced
        self._emit(Connect(CONTROLLER_ID, self.controller_address, routing_id=self.link_id(CONTROLLER_ID),
                           listen=True))
        self._join_started = self._now
        self._join_attempts = 0
        self._next_join = self._now
        self._backoff = BACKOFF_FIRST_S

    def _rejoin(self, reason: str) -> None:
        self.log.warning("node %d must rejoin: %s", self.node_id, reason)
        self._unknown.clear()
        self._stale.clear()
        self.replay.clear()
        self.node_id = UNJOINED
        self.state = NodeState.JOINING
        for node_id in sorted(self._peers):
            self._emit(Disconnect(node_id, 0.0))
        self._peers.clear()
        self.mesh = None
        self._routes.clear()
        self._recent_origins = set()
        self._departed_at, self._last_departed_resend = {}, {}
        self.seen = SeenUpdates(self.config.dedup_window)
        self.probe.reset()
        self.counters_.add("rejoins")
        self._begin_join()
        self._tick_joining(self._now)  # the first JOIN leaves at once

    def _set_acknowledged(self, watermark: int) -> None:
        if watermark != self.acknowledged:
            self.acknowledged = watermark
            self._emit(Notify("acknowledged"))

_HANDLERS: dict[Op, Callable[[NodeMachine, Message, bytes | None], None]] = {
    Op.JOIN_REPLY: NodeMachine.on_join_reply,
    Op.MESH: NodeMachine.on_mesh,
    Op.HEARTBEAT: NodeMachine.on_heartbeat,
    Op.UPDATE: NodeMachine.on_update,
    Op.UPDATES: NodeMachine.on_updates,
    Op.PARAMS_REPLY: NodeMachine.on_params_reply,
    Op.EVICTED: NodeMachine.on_evicted,
    Op.SHUTDOWN: NodeMachine.on_shutdown,
}

__all__ = ["ApplyHook", "ApplyManyHook", "NodeMachine", "NodeState", "SlotToken"]
