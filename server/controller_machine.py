"""The controller's protocol as a state machine: ``ControllerMachine.handle(event, now) -> actions``.

Root of the mesh, holder of the master copy, keeper of membership. It admits joining nodes
(bounded: members, joins not heard from yet, joins per second), places them (mesh.py), binds each
member id to the routing id it joined from, sends every member each new mesh version with the
routing ids it may accept (server/identity.py; coalesced: at most one broadcast per 0.1 s, and a
new member's catch-up starts once the others were sent a mesh that holds it: announce.py), relays
updates to its children, applies every update once to the master copy, serves parameter downloads
(params + optional updater state + the exact set of sequences they include, one shared snapshot
where it may serve several members), beats to every member (the liveness beat back on the member's
own connection, the watermark beat on the data path, in order with the relayed updates) and marks
a silent member offline after ``missed_beats`` beats. A departed member's gaps are given up after
a few beats and its per-origin state pruned once its late updates had ``departed_kept_s`` to
arrive. No socket, thread or clock: ``now`` is given with every event.

Construction (everything it touches is injected; the simulation passes plain objects)::

    ControllerMachine(
        config,                 # TransportConfig (heartbeat_s, missed_beats, max_nodes, ...)
        params,                 # the master copy: a writeable 1-D float array, updated in place
        updater_state=None,     # optional array served with params to nodes that ask for it
        apply=None,             # optional hook(payload, header) applying an update instead of decode
        lock=None,              # held around every read/write of params (default: no lock)
        session=b"...",         # 16 bytes: key of the routing ids this controller presents
        counters=None,          # a transport Counters (shared with the I/O loop); default a new one
        wall_clock=None,        # () -> seconds since the epoch, for display fields only (default 0.0)
        address="",             # the controller's address, until ``Started`` tells it
    )

``handle`` is deterministic: every map it iterates is keyed by int ids or insertion-ordered, and it
reads no clock, random source or environment. A message it refuses is counted (``counters.reject``)
and logged; it never raises for anything a frame says.
"""

from __future__ import annotations

import contextlib
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from psrv.server.announce import JoinGate, MeshAnnouncer
from psrv.server.controller_records import NodeRecord, status_view
from psrv.server.dedup import SeenUpdates
from psrv.server.downloads import Downloads, DownloadToken
from psrv.server.identity import link_id, parse_session
from psrv.server.liveness import BeatTimer, FreezeGuard, Members
from psrv.server.master_copy import MasterCopy
from psrv.server.mesh import CONTROLLER_ID, MeshOrganizer
from psrv.server.updates import batch_message, groups
from psrv.transport.codec import PackedDict
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters, RateLimitedLog
from psrv.transport.errors import FrameRejectedError, TransportError
from psrv.transport.events import (
    Action,
    ChunkArrived,
    Connect,
    Disconnect,
    Download,
    Dropped,
    Event,
    Ready,
    Received,
    Reply,
    Send,
    Started,
    Stop,
    Stopping,
    Tick,
)
from psrv.transport.messages import Message, Op
from psrv.transport.sockets import valid_address

__all__ = ["ControllerMachine", "NodeRecord"]

_DEPARTED_KEPT = 256
_RETIRING_MAX = 4096  # departed members whose state is kept at most, whatever departed_kept_s says
_NAMES_KEPT = 65536
ApplyHook = Callable[[np.ndarray, dict], None]


class ControllerMachine:
    """See the module docstring."""

    role = "controller"
    # what a controller accepts from others (anything else is refused as ``unknown_type``)
    ACCEPTS = frozenset({Op.JOIN, Op.UPDATE, Op.UPDATES, Op.PARAMS_REQUEST, Op.HEARTBEAT, Op.LEAVE,
                         Op.STATUS_REQUEST})

    def __init__(
        self,
        config: TransportConfig,
        params: np.ndarray,
        *,
        updater_state: np.ndarray | None = None,
        apply: ApplyHook | None = None,
        lock: Any = None,
        session: bytes = b"\x00" * 16,
        counters: Counters | None = None,
        wall_clock: Callable[[], float] | None = None,
        address: str = "",
        log: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self.master = MasterCopy(config, params, updater_state=updater_state, apply=apply, counters=counters,
                                 lock=lock if lock is not None else contextlib.nullcontext(),
                                 wall_clock=wall_clock)
        self.session = session
        self.counters = self.master.counters
        self.wall_clock = self.master.wall_clock
        self.address = address
        self.log = log or logging.getLogger("psrv.transport.controller")
        self._limited = RateLimitedLog(self.log, config.log_interval_s, clock=lambda: self._now)
        # what a STATUS_REPLY's counters hold: the facade sets its counters() (cached checksum)
        self.status_counters: Callable[[], dict[str, Any]] = self._plain_counters
        self.mesh = MeshOrganizer(config.mesh, config.fan_out, controller_address=address)
        self.members = Members(config.heartbeat_s, config.missed_beats)
        self._beat = BeatTimer(config.heartbeat_s)
        self._freeze = FreezeGuard(config.heartbeat_s)
        self._records: dict[int, NodeRecord] = {}  # the members, by id
        self._tokens: dict[str, int] = {}
        self._identity: dict[int, bytes] = {}  # member id -> routing id of the connection it joined from
        self._by_identity: dict[bytes, int] = {}
        self._sessions: dict[int, bytes] = {}  # member id -> its join session (per-link routing ids)
        self._dropped: dict[int, int] = {}  # member id -> relayed messages dropped for it so far
        self._names_seen: dict[str, None] = {}  # insertion-ordered, the oldest forgotten beyond _NAMES_KEPT
        self._departed: deque[NodeRecord] = deque(maxlen=_DEPARTED_KEPT)
        self._retiring: dict[int, float] = {}  # departed member -> when; its updates still count
        self._unclosed: dict[int, float] = {}  # departed member -> when, until its gaps are given up
        self._pending: dict[int, float] = {}  # admitted, not heard from since: when admitted
        self._announcer = MeshAnnouncer(config.heartbeat_s)  # MESH broadcasts, coalesced
        self._deferred: dict[int, Message] = {}  # catch-ups that wait until the others know the member
        self._names_by_id: dict[int, str | None] = {}  # every id admitted (the newest _NAMES_KEPT)
        self._gate = JoinGate(config)
        self._downloads = Downloads()
        self._handlers: dict[Op, Callable[[Message, bytes, float], None]] = {
            Op.JOIN: self._on_join,
            Op.UPDATE: self._on_update,
            Op.UPDATES: self._on_update,
            Op.PARAMS_REQUEST: self._on_params_request,
            Op.HEARTBEAT: self._on_heartbeat,
            Op.LEAVE: self._on_leave,
            Op.STATUS_REQUEST: self._on_status_request,
        }
        self._out: list[Action] = []
        self._now = 0.0

    # ------------------------------------------------------------------ the machine
    def handle(self, event: Event, now: float) -> list[Action]:
        """One event in, the actions to carry out back (see transport/events.py)."""
        self._now = now
        self._out = out = []
        kind = type(event)
        if kind is Received:
            self._received(event, now)
        elif kind is Tick:
            self._tick(now)
        elif kind is ChunkArrived:
            if event.routing_id is not None and self._identity.get(event.src) == event.routing_id:
                self.members.heard(event.src, now)  # a piece of a large message is a sign of life too
        elif kind is Dropped:
            self._on_dropped(event)
        elif kind is Started:
            self._started(event.address, now)
        elif kind is Stopping:
            self._stopping()
        # Command: the controller's API needs none (its queries run through the driver's call())
        self._out = []
        return out

    def member_ids(self) -> list[int]:
        return sorted(self._records)

    def routing_id_to(self, node_id: int) -> bytes:
        """The routing id this controller's connection to ``node_id`` presents."""
        return link_id(self.session, node_id)

    def _started(self, address: str, now: float) -> None:
        if address and address != self.address:
            self.address = address
            if not self._records:
                self.mesh = MeshOrganizer(self.config.mesh, self.config.fan_out, controller_address=address)
        self._freeze.restart(now)  # a warm-up before the loop ran was not a freeze
        self.log.info(
            "controller listening on %s (mesh %s, fan-out %d, heartbeat %.2f s)",
            self.address, self.config.mesh, self.config.fan_out, self.config.heartbeat_s,
        )
        self._out.append(Ready())

    def _stopping(self) -> None:
        bye = Message(Op.SHUTDOWN, {"reason": "the controller is stopping"}, src=CONTROLLER_ID)
        for node_id in self.member_ids():
            self._out.append(Send(node_id, bye))
        self.log.info(
            "controller %s stopping; %d updates applied to the master copy",
            self.address, self.counters["updates_applied"],
        )
        self._out.append(Stop())

    # ------------------------------------------------------------------ receiving
    def _received(self, event: Received, now: float) -> None:
        msg, rid = event.message, event.routing_id
        try:
            handler = self._handlers.get(msg.op)
            if handler is None:
                raise FrameRejectedError("unknown_type", f"a controller does not accept {msg.op} messages")
            if rid is None:
                raise FrameRejectedError("bad_sender", f"{msg.op} on an outgoing connection")
            if msg.op is not Op.JOIN and msg.op is not Op.STATUS_REQUEST:
                bound = self._identity.get(msg.src)
                if bound is not None:
                    if bound != rid:
                        raise FrameRejectedError(
                            "bad_sender",
                            f"{msg.op} claiming node {msg.src} from a connection it did not join from",
                        )
                    self.members.heard(msg.src, now)  # any frame of a member's is a sign of life
            handler(msg, rid, now)
        except FrameRejectedError as exc:
            self._reject(exc.reason, exc.detail)
        except TransportError as exc:  # e.g. MeshError / InvalidSequenceError from a crafted message
            self._reject("bad_message", f"{type(exc).__name__}: {exc}")

    def _reject(self, reason: str, detail: str) -> None:
        self.counters.reject(reason)
        self._limited.warning(
            f"reject:{reason}", "controller %s rejected a message (%s): %s", self.address, reason, detail
        )

    def _member(self, msg: Message, rid: bytes, now: float) -> None:
        """Is the sender a live member? If not, tell it so (it must rejoin) and refuse the frame."""
        if msg.src in self._records:  # (heard already: a member is bound to its connection)
            if self._pending:
                self._pending.pop(msg.src, None)
            return
        self._out.append(Reply(rid, Message(
            Op.EVICTED, {"reason": f"node {msg.src} is not a member of this mesh", "node_id": msg.src},
            src=CONTROLLER_ID,
        )))
        raise FrameRejectedError("bad_sender", f"{msg.op} from {msg.src}, which is not a member")

    # ------------------------------------------------------------------ joins
    def _on_join(self, msg: Message, rid: bytes, now: float) -> None:
        token = msg["token"]
        session = parse_session(msg.fields.get("session"))
        node_id = self._tokens.get(token)
        if node_id is not None and self._identity.get(node_id) != rid:
            raise FrameRejectedError(
                "bad_sender", f"join with node {node_id}'s token from another connection"
            )
        if session is not None and rid != link_id(session, CONTROLLER_ID):
            raise FrameRejectedError(
                "bad_sender", "join from a connection that does not present its session's id"
            )
        if node_id is None or node_id not in self.mesh:
            node_id = self._admit_join(msg, rid, session, now)
        record = self._records[node_id]
        self._out.append(Reply(rid, Message(
            Op.JOIN_REPLY,
            {
                "node_id": node_id,
                "mesh": self.mesh.to_dict(),
                "restart": record.restart,
                "heartbeat_s": self.config.heartbeat_s,
                "missed_beats": self.config.missed_beats,
                "token": token,
                "routes": self._routes_for(node_id),
            },
            src=CONTROLLER_ID,
        )))
        self.counters.gauges["mesh_version"] = self.mesh.version
        self._announcer.replied(node_id, self.mesh.version)

    def _admit_join(self, msg: Message, rid: bytes, session: bytes | None, now: float) -> int:
        previous = self._by_identity.get(rid)
        rejoining = previous is not None and previous in self._records
        self._gate.admit(len(self._records) - rejoining, len(self._pending), now)
        address = msg["address"]
        if not valid_address(address):
            raise FrameRejectedError(
                "bad_field", f"advertised address must be HOST:PORT, got {address!r:.80}"
            )
        if rejoining:  # that process rejoins: one id per connection
            self._remove(previous, "left", "rejoined from the same connection", now)
        node_id = self.mesh.allocate_id()
        name = msg["name"]
        restart = name is not None and name in self._names_seen
        if name is not None:
            self._names_seen[name] = None
            if len(self._names_seen) > _NAMES_KEPT:
                del self._names_seen[next(iter(self._names_seen))]
        self._out.append(Connect(node_id, address, routing_id=self.routing_id_to(node_id)))
        place = self.mesh.add_node(node_id, address)
        self._announcer.joined(node_id, self.mesh.version)
        self.members.joined(node_id, now)
        self._tokens[msg["token"]] = node_id
        self._names_by_id[node_id] = name
        if len(self._names_by_id) > _NAMES_KEPT:
            del self._names_by_id[next(iter(self._names_by_id))]
        self._pending[node_id] = now
        self._identity[node_id] = rid
        self._by_identity[rid] = node_id
        if session is not None:
            self._sessions[node_id] = session
        self._dropped[node_id] = 0
        self._records[node_id] = NodeRecord(node_id, address, name, msg["token"], restart, self.wall_clock())
        self.counters.add("joins")
        self.log.info(
            "node %d joined from %s (name %s, restart %s): parent %d, depth %d, mesh version %d",
            node_id, address, name, restart, place.parent, place.depth, self.mesh.version,
        )
        self._broadcast_mesh()
        return node_id

    def _routes_for(self, node_id: int) -> dict[int, str]:
        """The routing ids ``node_id`` accepts messages from: those the controller and its neighbours
        present on their connections TO IT (a node that joined with no session: the one it joined from)."""
        routes = {CONTROLLER_ID: self.routing_id_to(node_id).hex()}
        for other in self.mesh.neighbours(node_id):
            session = self._sessions.get(other)
            if session is not None:
                routes[other] = link_id(session, node_id).hex()
            elif other in self._identity:
                routes[other] = self._identity[other].hex()
        return routes

    # ------------------------------------------------------------------ updates
    def _on_update(self, msg: Message, rid: bytes, now: float) -> None:
        self._member(msg, rid, now)
        fresh = self.master.fresh_updates(msg, self._origin_allowed, self._reject)
        if fresh:
            self._relay([(fields, buffer) for fields, buffer, _ in fresh], msg.src, now)
        for fields, _, payload in fresh:
            self.master.apply(payload, fields, self._reject)
        for origin in sorted({f["origin"] for f, _, _ in fresh if f["origin"] in self._retiring
                              and f["origin"] not in self._unclosed}):  # re-sent after its gaps were given up
            self._close_gaps(origin)

    def _close_gaps(self, origin: int) -> None:
        """Give a departed member's gaps up: beats (contiguous marks) then cover all of it the master holds
        and a node lacking one sees it is behind. Again after a late one a member re-sent: in MESH mode its
        relay stops at the first node holding it already, and the nodes below learn of it this way."""
        gaps = self.master.seen.close(origin)
        if gaps:
            self.counters.add("departed_gaps_closed", gaps)
            self._downloads.stop_sharing()

    def _origin_allowed(self, origin: int, came_from: int) -> bool:
        """A member's own updates, a recently departed member's, or one relayed up from inside the
        sender's own subtree."""
        if origin == came_from or origin in self._retiring:
            return True
        if origin not in self.mesh:
            return False
        parent = self.mesh.parent(origin)
        while parent > CONTROLLER_ID:
            if parent == came_from:
                return True
            parent = self.mesh.parent(parent)
        return False

    def _relay(self, items: list[tuple[dict, Any]], came_from: int, now: float) -> None:
        targets = self.mesh.relay_targets(CONTROLLER_ID, came_from=came_from)
        if not targets:
            return
        # a member hears of a new member before any of its updates (on the same pipe)
        if self._announcer.changed and not self._announcer.known_to([f["origin"] for f, _ in items], targets):
            self._send_mesh(now)
        for group in groups(items):
            message = batch_message(group, CONTROLLER_ID)  # one object: the driver encodes it once
            for target in targets:
                self._out.append(Send(target, message, droppable=True, count=len(group)))
            self.counters.add("updates_relayed", len(group) * len(targets))

    def _on_dropped(self, event: Dropped) -> None:
        """A relayed message found a member's queue full: counted, and remembered (a snapshot taken
        before it no longer covers that member)."""
        self.counters.add("updates_relayed", -event.count)
        self.counters.add("updates_dropped_backpressure", event.count)
        if event.peer in self._dropped:
            self._dropped[event.peer] += 1
        self._limited.warning(
            f"drop:{event.peer}", "controller: send queue of node %d full, update dropped", event.peer
        )

    # ------------------------------------------------------------------ downloads
    def _on_params_request(self, msg: Message, rid: bytes, now: float) -> None:
        self._member(msg, rid, now)
        if not self._announcer.known_to_all(msg.src):
            # the others have not been sent a mesh holding this new member yet: its catch-up (after
            # which it sends) starts once they have, so nobody gets an update of a member it never heard of
            if not self._announcer.due(now, len(self._records)):
                self._deferred[msg.src] = msg
                return
            self._send_mesh(now)
        self._serve_params(msg)

    def _serve_params(self, msg: Message) -> None:
        node_id = msg.src
        want_updater = bool(msg["want_updater"]) and self.master.updater_state is not None
        version = self.counters["updates_applied"]
        snapshot = self._downloads.snapshot_for(
            node_id, version, want_updater, self._dropped.get(node_id, 0),
            self.config.replay_ring_messages // 2, self.master.seen.watermark_of(node_id),
        )
        shared = snapshot is not None
        if snapshot is None:
            members = {node_id: self._dropped.get(node_id, 0) for node_id in self.member_ids()}
            snapshot = self.master.snapshot(version, want_updater, members)
            self._downloads.adopt(snapshot)
        fields = {
            "request_id": msg["request_id"],
            "dtype": snapshot.params.dtype.str,
            "size": int(snapshot.params.size),
            "updater_dtype": None if not want_updater else snapshot.updater.dtype.str,
            "updater_size": 0 if not want_updater else int(snapshot.updater.size),
            "watermark": snapshot.watermark,
            "extra_seen": snapshot.extra_seen,
        }
        self.log.info(
            "sending params (%d values, %d origins in the watermark, %s snapshot) to node %d",
            snapshot.params.size, len(snapshot.watermark), "a shared" if shared else "a new", node_id,
        )
        self.counters.add("downloads_shared" if shared else "downloads_new_snapshot")
        # paced by the driver on the pipe the member's relayed updates take: whatever was relayed before
        # the snapshot arrives before its pieces; whatever after may come between them, and the node
        # (syncing) holds it and applies what the snapshot lacks
        self._downloads.start(node_id, snapshot)
        record = self._downloads.active[node_id]
        buffers = [snapshot.params] + ([snapshot.updater] if want_updater else [])
        reply = Message(Op.PARAMS_REPLY, fields, buffers, src=CONTROLLER_ID)
        self._out.append(Download(node_id, reply, DownloadToken(self._downloads, node_id, record)))

    # ------------------------------------------------------------------ other messages
    def _on_heartbeat(self, msg: Message, rid: bytes, now: float) -> None:
        self._member(msg, rid, now)
        self._records[msg.src].stats = dict(msg["stats"])

    def _on_leave(self, msg: Message, rid: bytes, now: float) -> None:
        if msg.src in self._records and self._identity.get(msg.src) == rid:
            self._remove(msg.src, "left", msg["reason"], now)

    def _on_status_request(self, msg: Message, rid: bytes, now: float) -> None:
        status = Message(Op.STATUS_REPLY, {"status": self.status(now)}, src=CONTROLLER_ID)
        self._out.append(Reply(rid, status))

    # ------------------------------------------------------------------ membership
    def _remove(self, node_id: int, state: str, reason: str, now: float) -> None:
        moved = self.mesh.remove_node(node_id)
        self.members.forget(node_id)
        self._downloads.cancel(node_id)
        self._out.append(Disconnect(node_id, 0.0))  # whatever was queued for it is freed now
        record = self._records.pop(node_id, None)
        if record is not None:
            record.state, record.left_at, record.reason = state, self.wall_clock(), reason
            self._departed.append(record)
            self._tokens.pop(record.token, None)
        identity = self._identity.pop(node_id, None)
        if identity is not None and self._by_identity.get(identity) == node_id:
            del self._by_identity[identity]
        self._sessions.pop(node_id, None)
        self._announcer.removed(node_id)
        self._deferred.pop(node_id, None)
        self._dropped.pop(node_id, None)
        self._pending.pop(node_id, None)
        self._retiring[node_id] = now  # its in-flight updates still count, for a while
        self._unclosed[node_id] = now
        self.counters.add("leaves" if state == "left" else "offline")
        self.log.info(
            "node %d %s (%s); remapped %s; mesh version %d, %d nodes",
            node_id, state, reason, moved or "nothing", self.mesh.version, len(self.mesh.node_ids()),
        )
        self._broadcast_mesh()

    def _broadcast_mesh(self) -> None:
        """The mesh changed: every member hears the new version at the next broadcast due (coalesced)."""
        self.counters.gauges["mesh_version"] = self.mesh.version

    def _send_mesh(self, now: float) -> None:
        """The current mesh to each member that has not had this version, with the routing ids that
        member accepts; then the catch-ups that waited for it."""
        version = self.mesh.version
        lagging = self._announcer.broadcast(version, self.member_ids(), now)
        if lagging:
            snapshot = PackedDict(self.mesh.to_dict())  # packed once, sent to every member
            for node_id in lagging:
                fields = {"mesh": snapshot, "version": version, "routes": self._routes_for(node_id)}
                self._out.append(Send(node_id, Message(Op.MESH, fields, src=CONTROLLER_ID)))
            self.counters.add("mesh_broadcasts")
        deferred, self._deferred = self._deferred, {}
        for node_id, request in deferred.items():
            if node_id in self._records:
                self._serve_params(request)

    # ------------------------------------------------------------------ timers
    def _tick(self, now: float) -> None:
        frozen = self._freeze.frozen_for(now)
        if frozen:
            # this process was starved (a loaded machine, swapping): the silence was ours, and the
            # members' beats may still wait unread in the sockets; nobody is offline for it
            self.log.warning("controller was frozen for %.1f s; not counting it against the nodes", frozen)
            self.members.excuse(now)
        self._prune_departed(now)
        timeout = self.members.timeout_s
        for node_id in self.members.expire(now):
            if node_id in self._records:
                self._remove(node_id, "offline", f"silent for more than {timeout:.2f} s", now)
        if self._beat.due(now):
            late_ms = round(self._beat.lateness_s * 1000.0, 2)
            if late_ms > self.counters.gauges.get("beat_late_max_ms", 0.0):
                self.counters.gauges["beat_late_max_ms"] = late_ms
            self._send_beats()
        if (self._announcer.changed or self._deferred) and self._announcer.due(now, len(self._records)):
            self._send_mesh(now)
        self._downloads.forget_stale(self.counters["updates_applied"])

    def _send_beats(self) -> None:
        """Two beats per member. The liveness beat travels on its own path: back through the ROUTER
        on the connection the member joined from (which carries only replies), never behind the
        relayed updates and download pieces queued on the controller's connection to it. The beat
        with the watermarks stays on that data connection, in order with the relayed updates: a
        node compares its own watermarks with it ("am I behind?"), and a watermark that overtook the
        updates it counts would make a node on a slow pipe re-sync for nothing."""
        fields = {"mesh_version": self.mesh.version, "stats": {}}
        alive = Message(Op.HEARTBEAT, {**fields, "watermark": {}}, src=CONTROLLER_ID)
        beat = Message(Op.HEARTBEAT, {**fields, "watermark": self.master.seen.watermark()}, src=CONTROLLER_ID)
        for node_id in self.member_ids():
            identity = self._identity.get(node_id)
            if identity is not None:
                self._out.append(Reply(identity, alive))
            self._out.append(Send(node_id, beat))

    def _prune_departed(self, now: float) -> None:
        """Forget a departed member's per-origin state once its late updates had ``departed_kept_s``
        to arrive: they are folded into the master copy, and watermarks (heartbeats, parameter
        replies) stay as small as the live mesh whatever the history. A later update of that origin
        is refused (``bad_origin``): ids are never reused."""
        kept = self.config.departed_kept_s
        seen = self.master.seen
        # before that its gaps are given up (_close_gaps), after twice the missed-beat timeout: a node
        # holding one of them re-sends it first (two beats of a stuck watermark: _resend_departed)
        close_after = min(kept / 2, 2 * self.members.timeout_s)
        for node_id, since in list(self._unclosed.items()):
            if now - since <= close_after:
                break
            del self._unclosed[node_id]
            self._close_gaps(node_id)
        for node_id, since in list(self._retiring.items()):
            if now - since <= kept and len(self._retiring) <= _RETIRING_MAX:
                break  # oldest first: the rest are younger
            del self._retiring[node_id]
            self._unclosed.pop(node_id, None)
            seen.forget(node_id)

    # ------------------------------------------------------------------ views
    @property
    def params(self) -> np.ndarray:
        return self.master.params

    @property
    def seen(self) -> SeenUpdates:
        return self.master.seen

    @property
    def updater_state(self) -> np.ndarray | None:
        return self.master.updater_state

    @updater_state.setter
    def updater_state(self, value: np.ndarray | None) -> None:
        self.master.updater_state = value

    @property
    def lock(self) -> Any:
        return self.master.lock

    def _plain_counters(self) -> dict[str, Any]:
        return self.master.counters_with_checksum(self.address)

    def status(self, now: float) -> dict[str, Any]:
        """The controller's view (what `psrv status` prints)."""
        return status_view(self, self.status_counters(), now)

    def node_stats(self) -> list[dict[str, Any]]:
        """Each member's latest heartbeat stats (online, then departed)."""
        online = [
            {"id": r.node_id, "state": "online", "stats": dict(r.stats)} for r in self._records.values()
        ]
        departed = [{"id": r.node_id, "state": r.state, "stats": dict(r.stats)} for r in self._departed]
        return online + departed

    def member_names(self) -> dict[int, str | None]:
        return dict(self._names_by_id)

    def retiring(self) -> list[int]:
        """Departed members whose late updates still count (their per-origin state is kept)."""
        return list(self._retiring)
