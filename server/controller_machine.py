"""The controller's protocol as a state machine: ``ControllerMachine.handle(event, now) -> actions``.

Root of the mesh, holder of the master copy, keeper of membership. It admits joining nodes (bounded:
members, joins not heard from yet, joins per second), places them (mesh.py), binds each member id to
the routing id it joined from, sends every member each new mesh version with the routing ids it may
accept (server/identity.py; coalesced: at most one broadcast per 0.1 s, and a new member's catch-up
starts once the others were sent a mesh that holds it: announce.py), relays updates to its children
(and for a beat straight to a member placed under a new parent, whose parent may not know it
yet: new_branches.py), applies every update once to the master copy, serves parameter downloads
(params + optional updater state + the exact set of sequences they include, one shared snapshot
where it may serve several members), beats to every member (the liveness beat back on the member's
own connection, the watermark beat on the data path, in order with the relayed updates) and marks a
silent member offline after ``missed_beats`` beats. A departed member's gaps are given up after a
few beats (held while its process, back under a new id, catches up: departed_gaps.py) and its
per-origin state pruned once its late updates had ``departed_kept_s`` to arrive. No socket, thread
or clock: ``now`` is given with every event.

Construction (everything it touches is injected; the simulation passes plain objects)::
    ControllerMachine(
        config,                 # TransportConfig (heartbeat_s, missed_beats, max_nodes, ...)
        params,                 # the master copy: a writeable 1-D float array, updated in place
        updater_state=None,     # optional array served with params to nodes that ask for it
        params_outside=False,   # True: updates leave as Apply actions instead of decoded into params
        session=b"...",         # 16 bytes: key of the routing ids this controller presents
        counters=None,          # a transport Counters (shared with the I/O loop); default a new one
        wall_clock=None,        # () -> seconds since the epoch, for display fields only (default 0.0)
        address="",             # the controller's address, until ``Started`` tells it
    )

No lock: the facade (server/controller.py) runs ``handle`` under the lock readers of the master copy
hold. Deterministic: its maps are keyed by int ids or insertion-ordered; it reads no clock, random
source or environment. A refused message is counted and logged; no frame makes it raise.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from psrv.server.announce import JoinGate, MeshAnnouncer
from psrv.server.clock_offset import ClockEchoes
from psrv.server.controller_records import NodeRecord, stats_view, status_view
from psrv.server.dedup import SeenUpdates
from psrv.server.departed_gaps import DepartedGaps
from psrv.server.identity import MemberIdentities, link_id, parse_session
from psrv.server.liveness import BeatTimer, FreezeGuard, Members, controller_beats
from psrv.server.master_copy import MasterCopy
from psrv.server.mesh import CONTROLLER_ID, MeshOrganizer
from psrv.server.new_branches import NewBranches
from psrv.server.params_server import ParamsServer
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
from psrv.transport.stat_codes import BEAT_BASELINE

__all__ = ["ControllerMachine", "NodeRecord"]

_DEPARTED_KEPT = 256


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
        params_outside: bool = False,
        session: bytes = b"\x00" * 16,
        counters: Counters | None = None,
        wall_clock: Callable[[], float] | None = None,
        address: str = "",
        log: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self.master = MasterCopy(config, params, updater_state=updater_state, params_outside=params_outside,
                                 counters=counters, wall_clock=wall_clock)
        self.session = session
        self.counters = self.master.counters
        self.wall_clock = self.master.wall_clock
        self._clocks = ClockEchoes(wall_clock)  # round trips for each member's clock offset
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
        self._ids = MemberIdentities()
        self._tokens, self._identity = self._ids.tokens, self._ids.routing  # (read-only views here)
        self._dropped: dict[int, int] = {}  # member id -> relayed messages dropped for it so far
        self._departed: deque[NodeRecord] = deque(maxlen=_DEPARTED_KEPT)
        self._pending: dict[int, float] = {}  # admitted, not heard from since: when admitted
        self._announcer = MeshAnnouncer(config.heartbeat_s)  # MESH broadcasts, coalesced
        self._deferred: dict[int, Message] = {}  # catch-ups that wait until the others know the member
        self._gate = JoinGate(config)
        # members under a new parent get what the master applies straight from here for a beat (the
        # parent's MESH takes a network latency to arrive; the simulation needed no more)
        self._new_branches = NewBranches(config.heartbeat_s)
        self._params_server = ParamsServer(self.master, config, self.log)
        self._downloads = self._params_server.downloads
        self._gaps = DepartedGaps(self.master, self._downloads, config.departed_kept_s)  # departed members
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
        self.log.info("controller listening on %s (mesh %s, fan-out %d, heartbeat %.2f s)", self.address,
                      self.config.mesh, self.config.fan_out, self.config.heartbeat_s)
        self._out.append(Ready())

    def _stopping(self) -> None:
        bye = Message(Op.SHUTDOWN, {"reason": "the controller is stopping"}, src=CONTROLLER_ID)
        for node_id in self.member_ids():
            self._out.append(Send(node_id, bye))
        self.log.info("controller %s stopping; %d updates applied to the master copy", self.address,
                      self.counters["updates_applied"])
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
        previous = self._ids.by_routing.get(rid)
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
        restart = self._ids.seen_name(name)
        # the ids it held before stay counted for what it re-sends after its catch-up
        self._gaps.joined(node_id, name, restart, self._ids.names_by_id, now)
        self._out.append(Connect(node_id, address, routing_id=self.routing_id_to(node_id)))
        place = self.mesh.add_node(node_id, address)
        self._announcer.joined(node_id, self.mesh.version)
        self._new_branches.placed([node_id], self.mesh, now)
        self.members.joined(node_id, now)
        self._ids.bind(node_id, rid, session, msg["token"], name)
        self._pending[node_id] = now
        self._dropped[node_id] = 0
        self._records[node_id] = NodeRecord(node_id, address, name, msg["token"], restart, self.wall_clock(),
                                            stats=dict(BEAT_BASELINE))  # its first beat: what differs
        self.counters.add("joins")
        self.log.info(
            "node %d joined from %s (name %s, restart %s): parent %d, depth %d, mesh version %d",
            node_id, address, name, restart, place.parent, place.depth, self.mesh.version,
        )
        self._broadcast_mesh()
        return node_id

    def _routes_for(self, node_id: int) -> dict[int, str]:
        return self._ids.routes_for(node_id, self.mesh.neighbours(node_id), self.routing_id_to(node_id))

    # ------------------------------------------------------------------ updates
    def _on_update(self, msg: Message, rid: bytes, now: float) -> None:
        self._member(msg, rid, now)
        fresh = self.master.fresh_updates(msg, self._origin_allowed, self._reject)
        if fresh:
            self._relay([(fields, buffer) for fields, buffer, _ in fresh], msg.src, now)
            self._send_new_branches([(fields, buffer) for fields, buffer, _ in fresh], msg.src, now)
        applied = self.master.apply(fresh)
        if applied is not None:
            self._out.append(applied)
        self._gaps.applied(f["origin"] for f, _, _ in fresh)  # re-sent after its gaps were given up?

    def _origin_allowed(self, origin: int, came_from: int) -> bool:
        """A member's own updates, a recently departed member's, or one relayed up from inside the
        sender's own subtree."""
        if origin == came_from or origin in self._gaps:
            return True
        return origin in self.mesh and self.mesh.below(origin, came_from)

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

    def _send_new_branches(self, items: list[tuple[dict, Any]], came_from: int, now: float) -> None:
        """Each member placed under a new parent a moment ago also gets these straight from here: its
        parent may have handled them before it knew the member (see new_branches.py)."""
        origins = [f["origin"] for f, _ in items]
        for target, rows in self._new_branches.targets(origins, came_from, self.mesh, now):
            announcer = self._announcer
            if announcer.changed and not announcer.known_to([origins[i] for i in rows], (target,)):
                self._send_mesh(now)
            for group in groups([items[i] for i in rows]):
                message = batch_message(group, CONTROLLER_ID)
                self._out.append(Send(target, message, droppable=True, count=len(group)))
                self.counters.add("updates_relayed", len(group))  # (a drop is taken off it: _on_dropped)
                self.counters.add("updates_to_new_branches", len(group))

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
        names = self._ids.names_by_id  # the ids its process may have held before: of its name, or unnamed
        given_up = self._gaps.given_up_view(lambda i: names.get(i) in (names.get(msg.src), None))
        self._out.append(self._params_server.serve(msg, self._dropped, self.member_ids(), given_up))

    # ------------------------------------------------------------------ other messages
    def _on_heartbeat(self, msg: Message, rid: bytes, now: float) -> None:
        self._member(msg, rid, now)
        record = self._records[msg.src]
        # a delta beat carries what changed since the member's previous beat (a new dict: a status
        # handed out earlier keeps what it said)
        record.stats = {**record.stats, **msg["stats"]} if msg.fields.get("delta") else dict(msg["stats"])
        self._clocks.heard(msg.src, msg["stats"])  # this beat's own stamp, never an earlier one
        self._gaps.heartbeat(msg.src, record.stats, now)  # its catch-up done: the gaps it owes wait less

    def _on_leave(self, msg: Message, rid: bytes, now: float) -> None:
        if msg.src in self._records and self._identity.get(msg.src) == rid:
            self._remove(msg.src, "left", msg["reason"], now)

    def _on_status_request(self, msg: Message, rid: bytes, now: float) -> None:
        status = Message(Op.STATUS_REPLY, {"status": self.status(now)}, src=CONTROLLER_ID)
        self._out.append(Reply(rid, status))

    # ------------------------------------------------------------------ membership
    def _remove(self, node_id: int, state: str, reason: str, now: float) -> None:
        moved = self.mesh.remove_node(node_id)
        self._new_branches.forget(node_id)
        self._new_branches.placed(moved, self.mesh, now)
        self.members.forget(node_id)
        self._downloads.cancel(node_id)
        self._out.append(Disconnect(node_id, 0.0))  # whatever was queued for it is freed now
        record = self._records.pop(node_id, None)
        if record is not None:
            record.state, record.left_at, record.reason = state, self.wall_clock(), reason
            self._departed.append(record)
        self._ids.forget(node_id, record.token if record is not None else None)
        self._announcer.removed(node_id)
        self._deferred.pop(node_id, None)
        self._dropped.pop(node_id, None)
        self._pending.pop(node_id, None)
        self._gaps.departed(node_id, record.name if record is not None else None, now)  # still counts
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
        self._gaps.tick(now, self.members.timeout_s)  # departed members' gaps given up, their state pruned
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
        self._out.extend(controller_beats(self.member_ids(), self._identity, self.mesh.version,
                                          self.master.seen.watermark(), self._clocks.echoes()))

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

    def _plain_counters(self) -> dict[str, Any]:
        return self.master.counters_with_checksum(self.address)

    def status(self, now: float) -> dict[str, Any]:
        """The controller's view (what `psrv status` prints)."""
        return status_view(self, self.status_counters(), now)

    def node_stats(self) -> list[dict[str, Any]]:
        """Each member's latest heartbeat stats (online, then departed)."""
        return stats_view(self._records.values(), self._departed)

    def member_names(self) -> dict[int, str | None]:
        return dict(self._ids.names_by_id)

    def retiring(self) -> list[int]:
        """Departed members whose late updates still count (their per-origin state is kept)."""
        return list(self._gaps.retiring)
