"""The node protocol as a state machine: ``NodeMachine.handle(event, now) -> actions``.

The machine composes parts that each own their state: ``UpdatePath`` (node_updates.py: own updates
out, received ones checked, deduplicated, relayed, applied; the dedup state, the numbering, the
replay ring), ``SyncPath`` (node_catchup.py: downloads, re-sync, the replica probe), ``Timers``
(node_timers.py: join back-off, lost controller, own beats) and ``BeatRepairs`` (node_repairs.py:
the repairs the controller's watermarks drive). What several of them read (identity, mesh view,
configuration, parameters, the outbox of the event being handled) is one ``NodeView``
(node_view.py) they are all given. The machine itself authenticates what arrives, keeps the
membership (join, mesh, rejoin, stop) and dispatches each event to the part it concerns.
node_guard.py holds the routes, the allowed origins and the bounded waiting rooms.

No sockets, threads or clocks: the driver (``transport/loop.py`` in production, ``tests/sim/`` in
tests) turns arrivals, timers and API calls into events (transport/events.py) and carries out the
actions (send, connect, disconnect, ready, stop). ``now`` is the driver's monotonic time; every
random choice (the join token and session) comes from the injected ``random_bytes``, so a
simulation that seeds it replays exactly. Nothing a frame says raises out of ``handle``: a bad
message is a counted rejection (``counters_.snapshot()["rejected"]``).

Construct::

    NodeMachine(config, params, controller_address, random_bytes=rng.randbytes)

optional: ``params_outside=True`` (the live parameters are elsewhere, e.g. on a GPU, or a simulation
records each apply: received and replayed updates leave as ``Apply`` actions and each download as
``Install(params)``, carried out by the driver under its lock before the handle's other actions;
``params`` is then only the download target), ``want_updater_state``, ``counters`` (shared with the
driver), ``wall_clock`` (read to stamp beats for the clock offset, psrv.server.clock_offset). The
machine holds no lock and is entered by one thread at a time: the facade (server/node.py) holds its
lock around every ``handle``, so ``params`` and the replay ring never
change under a caller that holds it. Besides the loop's actions it returns ``ReleaseSlots(n)``
(submit-queue slots to give back; the slots of an own update sent to peers are given back by its
``Send.token`` once the frames reached every target socket, bound by the facade) and ``Notify(what)``
("ready" once caught up, "acknowledged" when the controller's watermark of our updates moved,
"stopped"): the facade carries those out.

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
SHUTDOWN stops with ControllerLostError. A rejoin keeps the own updates the controller had not
acknowledged; after the catch-up those the master copy lacks are re-applied and re-sent under their
old (origin, seq), so each reaches the master exactly once (node_updates.py). ``Stopping`` says LEAVE.

Submits: ``handle(Submit(payload, fields))`` numbers the update (``submitted_seq``), remembers it
and sends it; with ``more`` set it is gathered and sent with the next event (``SendSubmitted``),
several in one batch. While (re)joining the update goes to the backlog instead (``submitted_seq``
0): it is numbered and sent after the catch-up, or dropped with the replica it was applied to
(``backlog_dropped``). Requests of a replica check: ``CheckRequested``, ``CheckDone``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from psrv.server.mesh import CONTROLLER_ID, MeshOrganizer
from psrv.server.node_catchup import SyncPath
from psrv.server.node_guard import HeldQueue, check_addresses, mesh_of, patience_s
from psrv.server.node_repairs import BeatRepairs
from psrv.server.node_state import NodeState, SlotToken
from psrv.server.node_timers import Timers
from psrv.server.node_updates import UpdatePath
from psrv.server.node_view import NodeView
from psrv.server.replica import ReplicaCheck
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters
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
    Started,
    Stop,
    Stopping,
    Submit,
    Tick,
)
from psrv.transport.messages import UNJOINED, Message, Op

_CONTROLLER_OPS = frozenset(
    {Op.JOIN_REPLY, Op.MESH, Op.PARAMS_REPLY, Op.HEARTBEAT, Op.EVICTED, Op.SHUTDOWN, Op.STATUS_REPLY}
)


class NodeMachine:
    """A worker's side of the mesh protocol; see the module docstring."""

    def __init__(
        self,
        config: TransportConfig,
        params: np.ndarray,
        controller_address: str,
        *,
        random_bytes: Callable[[int], bytes],
        params_outside: bool = False,
        want_updater_state: bool = False,
        counters: Counters | None = None,
        wall_clock: Callable[[], float] | None = None,
    ) -> None:
        self.counters_ = counters if counters is not None else Counters()
        self.view = view = NodeView(config, params, controller_address, self.counters_)
        self.updates = UpdatePath(view, params_outside)
        self.sync = SyncPath(view, self.updates, want_updater_state)
        self.timers = Timers(view, random_bytes, wall_clock)  # wall_clock: for the clock offset
        self.repairs = BeatRepairs(view, self.updates, self.sync)
        self.ids_held: list[int] = []  # every id the controller gave this node (a rejoin gets a new one)
        self.restart = False  # the controller knew this node's name from an earlier join
        self.stopped: BaseException | None | bool = False  # False while running; then the error or None
        self._unknown: HeldQueue[Received] = HeldQueue()  # from routing ids not announced yet
        # updates and meshes that raced our join reply (the controller's copies for a new member, a parent
        # that knew of us first, a newer mesh): handled once the reply announced their senders, else
        # quietly dropped
        self._joining: HeldQueue[Received] = HeldQueue()

    # ------------------------------------------------------------------ what the facade reads
    config = property(lambda self: self.view.config)
    params = property(lambda self: self.view.params)
    controller_address = property(lambda self: self.view.controller_address)
    address = property(lambda self: self.view.address)
    node_id = property(lambda self: self.view.node_id)
    state = property(lambda self: self.view.state)
    mesh = property(lambda self: self.view.mesh)
    acknowledged = property(lambda self: self.view.acknowledged)
    seen = property(lambda self: self.updates.seen)
    replay = property(lambda self: self.updates.replay)
    seq = property(lambda self: self.updates.seq)
    submitted_seq = property(lambda self: self.updates.submitted_seq)
    last_applied_now = property(lambda self: self.updates.last_applied_now)
    updater_state = property(lambda self: self.sync.updater_state)
    download = property(lambda self: self.sync.download)
    probe = property(lambda self: self.sync.probe)

    def link_id(self, to: int) -> bytes:
        """The routing id this node's connection to member ``to`` presents (server/identity.py)."""
        return self.view.link_id(to)

    # ------------------------------------------------------------------ the one entry point
    def handle(self, event: Event, now: float) -> list[Action]:
        """Advance the protocol by one event; the actions for the driver to carry out, in order."""
        self.view.now = now
        if self.stopped is not False:
            self.updates.submitted_seq = 0
            if isinstance(event, Submit) and event.slot:
                return [ReleaseSlots(1)]  # a submit that raced the stop
            return []
        self.view.out = out = []
        if self.updates.gathered and not isinstance(event, Submit):
            self.updates.flush_gathered()
        try:
            if isinstance(event, Received):
                self._on_received(event)
            elif isinstance(event, Tick):
                self._tick(now)
            elif isinstance(event, Submit):
                self.updates.submit(event)
            elif isinstance(event, CheckRequested):
                self.sync.request_check()
            elif isinstance(event, CheckDone):
                self.sync.probe.reset()
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

    def _stop(self, error: BaseException | None) -> None:
        view = self.view
        if error is not None:
            view.log.error("node %d (%s) stopped: %s", view.node_id, view.address, error)
        slots = self.updates.stopping()
        if slots:
            view.emit(ReleaseSlots(slots))
        self.stopped = error
        view.emit(Stop(error))
        view.emit(Notify("stopped"))

    # ------------------------------------------------------------------ the task thread's requests
    def all_acknowledged(self) -> bool:
        """Does the controller hold every update this node submitted (as its last beat said)?"""
        updates = self.updates
        return (self.view.state is not NodeState.JOINING and not updates.backlog
                and self.view.acknowledged >= updates.seq and not updates.resent)

    def check_verdict(
        self, tolerance: float, current: Callable[[], np.ndarray] | None = None
    ) -> ReplicaCheck | str | None:
        """``check_replica``'s verdict (see ReplicaProbe.verdict); the caller holds the facade's lock."""
        return self.sync.verdict(tolerance, current)

    def next_timer(self) -> float | None:
        """The driver time of the next JOIN attempt while joining (a driver may tick then), else None."""
        return self.timers.next_timer() if self.stopped is False else None

    # ------------------------------------------------------------------ driver events
    def _on_started(self, event: Started) -> None:
        self.view.address = event.address
        self.timers.begin_join(first=True)
        self._tick(self.view.now)  # the first JOIN leaves at once

    def _on_stopping(self) -> None:
        view = self.view
        if view.node_id > 0:
            view.send_ctrl(Message(Op.LEAVE, {"reason": "node stopping"}, src=view.node_id))
        view.log.info("node %d (%s) stopping: %s", view.node_id, view.address,
                      {k: self.counters_[k] for k in ("updates_sent", "updates_applied",
                                                      "duplicates_dropped")})
        self._stop(None)

    def _on_chunk(self, event: ChunkArrived) -> None:
        """A piece of a large message was stored: from the controller, a sign of life, and a download
        that moves (no need to ask again). Only on the controller's connection, whatever it claims."""
        if event.src != CONTROLLER_ID:
            return
        view = self.view
        on_ctrl = event.via == CONTROLLER_ID if event.routing_id is None else (
            view.routes.sender(event.routing_id) == CONTROLLER_ID)
        if not on_ctrl:
            return
        self.timers.heard(view.now)
        if view.state is NodeState.SYNCING:
            self.sync.download.progress = view.now

    def _on_dropped(self, event: Dropped) -> None:
        self.counters_.add("updates_dropped_backpressure", event.count)
        self.counters_.add("updates_relayed", -event.count)
        self.view.limited.warning(f"drop:{event.peer}",
                                  "node %d: send queue to %d full, %d update(s) dropped",
                                  self.view.node_id, event.peer, event.count)

    def _tick(self, now: float) -> None:
        """Time passed: release what waited, then the timers in order (join, lost controller, the
        download, our beat)."""
        self._release_held()
        self.timers.check_frozen(now)
        state = self.view.state
        if state is NodeState.JOINING:
            self.timers.tick_joining(now)
            return
        if self.timers.controller_lost(now):
            # keep trying to rejoin for controller_lost_timeout_s; on rejoin the replica is replaced by
            # the master copy plus the own updates it lacks (see README: nothing is lost when)
            self._rejoin("lost the controller")
            self.timers.lost_at(now)
            return
        if state is NodeState.SYNCING:
            self.sync.tick(now)
        self.timers.beat(now)

    def _release_held(self) -> None:
        """A newer view arrived (or time passed): handle what it explains, refuse what waited too long."""
        view = self.view
        if len(self._joining):
            joined = view.state is not NodeState.JOINING
            ready, expired = self._joining.release(
                view.now, patience_s(view.config.heartbeat_s),
                lambda e: joined and view.routes.sender(e.routing_id) is not None)
            self.counters_.add("ignored_while_joining", len(expired))  # not ours to judge: quietly
            for event in ready:
                self._on_received(event, held=True)
        if len(self._unknown):
            wait = patience_s(view.config.heartbeat_s)
            ready, expired = self._unknown.release(
                view.now, wait, lambda e: view.routes.sender(e.routing_id) is not None)
            for event in expired:
                view.reject("bad_sender", f"{event.message.op} claiming node {event.message.src} from a "
                            f"connection never announced within {wait:.1f} s")
            for event in ready:
                self._on_received(event, held=True)
        self.updates.release_stale()

    # ------------------------------------------------------------------ received messages
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
            self.view.reject(exc.reason, exc.detail)
        except FatalTransportError:
            raise
        except TransportError as exc:  # e.g. MeshError / InvalidSequenceError from a crafted message
            self.view.reject("bad_message", f"{type(exc).__name__}: {exc}")

    def _authenticate(self, event: Received, held: bool) -> bool:
        """Replies come back on our own connection to the controller; everything else arrives on our
        ROUTER and counts only from a routing id the controller announced, under that member's id.
        False: ignore quietly (or held); FrameRejectedError("bad_sender"): counted."""
        msg = event.message
        view = self.view
        if event.routing_id is None:
            if event.via not in (None, CONTROLLER_ID):
                raise FrameRejectedError("bad_sender", f"{msg.op} on the connection to node {event.via}")
            sender = CONTROLLER_ID
        else:
            sender = view.routes.sender(event.routing_id)
            if sender is None and view.state is NodeState.JOINING:
                # a MESH too: the controller counts it delivered (later meshes are sent only to members
                # behind them), and it may pass the join reply, which comes on our other connection
                if (not held and msg.op in (Op.UPDATE, Op.UPDATES, Op.MESH)
                        and self._joining.hold(view.now, event)):
                    self.counters_.add("held_while_joining")
                else:
                    self.counters_.add("ignored_while_joining")  # e.g. the controller's beat racing our reply
                return False
            # a new neighbour may send before the controller's MESH naming it reaches us
            if (sender is None and not held and msg.op in (Op.UPDATE, Op.UPDATES)
                    and self._unknown.hold(view.now, event)):
                self.counters_.add("held_unknown_sender")
                return False
        if sender != msg.src:
            raise FrameRejectedError("bad_sender", f"{msg.op} claiming node {msg.src} from a connection "
                                     "that is not its own")
        if msg.op in _CONTROLLER_OPS and sender != CONTROLLER_ID:
            raise FrameRejectedError("bad_sender",
                                     f"{msg.op} from node {sender}: only the controller sends it")
        if sender == CONTROLLER_ID:
            self.timers.heard(view.now)  # any frame of the controller's is a sign of life
        return True

    def on_join_reply(self, msg: Message, routing_id: bytes | None) -> None:
        view = self.view
        if view.state is not NodeState.JOINING or msg["token"] != self.timers.token:
            return  # a late reply to an earlier attempt
        mesh = mesh_of(msg)
        if msg["node_id"] not in mesh:
            raise FrameRejectedError("bad_field", f"join reply: node {msg['node_id']} is not in its mesh")
        check_addresses(mesh, msg["node_id"])  # (everything is checked before anything changes)
        view.routes.announce(msg["routes"], fresh=True)
        view.node_id = msg["node_id"]
        self.updates.seq = 0
        self.ids_held.append(view.node_id)
        view.set_acknowledged(0)
        self.restart = msg["restart"]
        pace = (float(msg["heartbeat_s"]), int(msg["missed_beats"]))
        paced = pace != (view.config.heartbeat_s, view.config.missed_beats)
        if paced:  # the controller's pace
            view.config = view.config.replace(heartbeat_s=pace[0], missed_beats=pace[1])
        self.timers.joined(paced)
        self._install_mesh(mesh)
        view.log.info("node %d joined the controller at %s from %s after %d attempt(s): parent %d, "
                      "mesh version %d%s", view.node_id, view.controller_address, view.address,
                      self.timers.join_attempts, mesh.parent(view.node_id), mesh.version,
                      " (restart)" if self.restart else "")
        self.sync.begin("catch-up after joining")
        self._release_held()  # what raced this reply: held by the download like any update now

    def on_mesh(self, msg: Message, routing_id: bytes | None) -> None:
        view = self.view
        if view.mesh is None or msg["version"] <= view.mesh.version:
            return
        mesh = mesh_of(msg)
        if mesh.version != msg["version"]:  # the controller sends one version; two are a crafted frame
            raise FrameRejectedError("bad_field", f"mesh message of version {msg['version']} carries a "
                                                  f"snapshot of version {mesh.version}")
        if view.node_id not in mesh:
            self._rejoin(f"mesh version {mesh.version} no longer holds node {view.node_id}")
            return
        check_addresses(mesh, view.node_id)
        view.routes.announce(msg["routes"])
        self._install_mesh(mesh)
        self._release_held()

    def on_update(self, msg: Message, routing_id: bytes | None) -> None:
        self.updates.on_update(msg)

    on_updates = on_update  # a batch is handled row by row, exactly like single updates

    def on_params_reply(self, msg: Message, routing_id: bytes | None) -> None:
        if self.sync.on_params_reply(msg):
            self.repairs.caught_up()

    def on_heartbeat(self, msg: Message, routing_id: bytes | None) -> None:
        if self.view.state is NodeState.JOINING:
            return
        if routing_id is None:  # the controller's liveness beat, on our own connection: a sign of life only
            self.timers.liveness_beat(self.view.now, msg["stats"])
            return
        self.repairs.on_watermarks(msg)

    def on_evicted(self, msg: Message, routing_id: bytes | None) -> None:
        if msg["node_id"] == self.view.node_id and self.view.state is not NodeState.JOINING:
            self._rejoin(msg["reason"])  # (else about an id this process held before it rejoined)

    def on_shutdown(self, msg: Message, routing_id: bytes | None) -> None:
        view = self.view
        raise ControllerLostError(f"node {view.node_id} ({view.address}): the controller at "
                                  f"{view.controller_address} shut down ({msg['reason']})")

    # ------------------------------------------------------------------ mesh and membership
    def _install_mesh(self, mesh: MeshOrganizer) -> None:
        view = self.view
        wanted = {n for n in mesh.neighbours(view.node_id) if n != CONTROLLER_ID}
        if view.mesh is not None:
            gone = set(view.mesh.node_ids()) - set(mesh.node_ids())
            view.recent_origins = (view.recent_origins | gone) - set(mesh.node_ids())
            view.departed_at.update({origin: view.now for origin in sorted(gone)})
        view.mesh = mesh
        self.counters_.gauges["mesh_version"] = mesh.version
        peers = view.peers
        for node_id in sorted(peers):
            if node_id not in wanted or peers[node_id] != mesh.address(node_id):
                del peers[node_id]
                view.emit(Disconnect(node_id, view.config.linger_s))
        for node_id in sorted(wanted - set(peers)):
            peers[node_id] = mesh.address(node_id)
            view.emit(Connect(node_id, mesh.address(node_id), routing_id=view.link_id(node_id)))

    def _rejoin(self, reason: str) -> None:
        view = self.view
        view.log.warning("node %d must rejoin: %s", view.node_id, reason)
        self._unknown.clear()
        self._joining.clear()
        self.updates.rejoining()
        view.node_id = UNJOINED
        view.state = NodeState.JOINING
        for node_id in sorted(view.peers):
            view.emit(Disconnect(node_id, 0.0))
        view.peers.clear()
        view.mesh = None
        view.routes.clear()
        view.recent_origins = set()
        view.departed_at = {}
        self.repairs.rejoining()
        self.sync.probe.reset()
        self.counters_.add("rejoins")
        self.timers.begin_join()
        self.timers.tick_joining(view.now)  # the first JOIN leaves at once


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

__all__ = ["NodeMachine", "NodeState", "SlotToken"]
