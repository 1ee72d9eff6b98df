"""The controller: root of the mesh, holder of the master copy, keeper of membership.

It places joining nodes, sends every live node each new mesh version, relays updates to its
children, applies every update once to the master copy, serves parameter downloads (params +
optional updater state + the exact set of sequences they include), beats to every node and
marks a silent node offline after ``missed_beats`` beats (its queue is freed, its children
are remapped, and everyone hears the new mesh).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import zmq
from psrv.transport.codec import encode_frames, frame_size
from psrv.transport.config import TransportConfig
from psrv.transport.dedup import SeenUpdates
from psrv.transport.downloads import (
    DOWNLOAD_CHUNK_MAX_BYTES,
    DOWNLOAD_TURN_BYTES,
    Download,
    Downloads,
    Snapshot,
)
from psrv.transport.endpoint import ApplyHook, Endpoint, params_checksum
from psrv.transport.errors import FrameRejectedError
from psrv.transport.membership import HeartbeatTimer, Membership
from psrv.transport.mesh import CONTROLLER_ID, MeshOrganizer
from psrv.transport.messages import Message, Op
from psrv.transport.peer import Peer
from psrv.transport.updates import batch_message, groups

_DEPARTED_KEPT = 256
_RETIRING_MAX = 4096  # departed members whose state is kept at most, whatever departed_kept_s says
_NAMES_KEPT = 65536
CHECKSUM_MIN_INTERVAL_S = 1.0
THROTTLE_READ_S = 0.05  # back-pressure: one small read this often while a member's queue is half full
THROTTLE_BUDGET = 64


@dataclass
class NodeRecord:
    node_id: int
    address: str
    name: str | None
    token: str
    restart: bool
    joined_at: float = field(default_factory=time.time)
    stats: dict[str, Any] = field(default_factory=dict)
    state: str = "online"
    left_at: float | None = None
    reason: str = ""


class Controller(Endpoint):
    """Root of the mesh. ``Controller(config, params).start()``; ``address`` is what nodes join."""

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
        super().__init__(config, params, lock=lock, apply=apply)
        self.node_id = CONTROLLER_ID
        self.updater_state = updater_state
        self.mesh: MeshOrganizer | None = None
        self.membership = Membership(config.heartbeat_s, config.missed_beats)
        self.seen = SeenUpdates(config.dedup_window)
        self._beat = HeartbeatTimer(config.heartbeat_s)
        self._peers: dict[int, Peer] = {}
        self._records: dict[int, NodeRecord] = {}
        self._tokens: dict[str, int] = {}
        self._identity: dict[int, bytes] = {}  # member id -> routing id of the connection it joined from
        self._by_identity: dict[bytes, int] = {}
        self._names_seen: dict[str, None] = {}  # insertion-ordered, the oldest forgotten beyond _NAMES_KEPT
        self._departed: deque[NodeRecord] = deque(maxlen=_DEPARTED_KEPT)
        self._retiring: dict[int, float] = {}  # departed member -> when; its updates still count
        self._pending: dict[int, float] = {}  # admitted, not heard from since: when admitted
        self._names_by_id: dict[int, str | None] = {}  # every id admitted (the newest _NAMES_KEPT)
        self._join_allowance = max(1.0, config.join_rate_per_s)  # a token bucket of admissions
        self._join_refill = time.monotonic()
        self._last_tick = time.monotonic()
        self._downloads = Downloads(min(config.chunk_bytes, DOWNLOAD_CHUNK_MAX_BYTES))
        self._checksum: tuple[int, float, dict[str, Any]] | None = None  # (master version, when, sums)
        self._last_throttled_read = 0.0
        self._checksum_running = False

    def _on_start(self) -> None:
        self.mesh = MeshOrganizer(self.config.mesh, self.config.fan_out, controller_address=self.address)
        self._last_tick = time.monotonic()  # not the warm-up before the I/O thread started
        self.log.info(
            "controller listening on %s (mesh %s, fan-out %d, heartbeat %.2f s, curve %s)",
            self.address,
            self.config.mesh,
            self.config.fan_out,
            self.config.heartbeat_s,
            "on" if self._security.enabled else "off",
        )
        self._ready.set()

    def _all_peers(self) -> list[Peer]:
        return list(self._peers.values())

    # ------------------------------------------------------------------ handlers
    def _authenticate(self, msg: Message, identity: bytes | None, sock: Any) -> bool:
        """A member's messages count only from the connection it joined from (its routing id)."""
        if msg.op is Op.JOIN or msg.op is Op.STATUS_REQUEST:
            return True
        bound = self._identity.get(msg.src)
        if bound is not None:
            if bound != identity:
                raise FrameRejectedError(
                    "bad_sender", f"{msg.op} claiming node {msg.src} from a connection it did not join from"
                )
            self.membership.heard(msg.src)  # any frame of a member's is a sign of life, not only its beats
        return True  # a non-member is told to rejoin by the handler (see _member)

    def _origin_allowed(self, origin: int, came_from: int) -> bool:
        if origin == came_from or origin in self._retiring:
            return True
        if origin not in self.mesh:
            return False
        parent = self.mesh.parent(origin)
        while parent > CONTROLLER_ID:  # relayed up from inside the sender's own subtree
            if parent == came_from:
                return True
            parent = self.mesh.parent(parent)
        return False

    def _routes_for(self, node_id: int) -> dict[int, str]:
        """The routing ids a node accepts messages from: the controller's and its neighbours'."""
        routes = {CONTROLLER_ID: self.routing_id.hex()}
        for other in self.mesh.neighbours(node_id):
            if other in self._identity:
                routes[other] = self._identity[other].hex()
        return routes

    def on_join(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        token = msg["token"]
        node_id = self._tokens.get(token)
        if node_id is not None and self._identity.get(node_id) != identity:
            raise FrameRejectedError(
                "bad_sender", f"join with node {node_id}'s token from another connection"
            )
        if node_id is None or node_id not in self.mesh:
            if identity is None:
                raise FrameRejectedError("bad_sender", "a join must come from a routed connection")
            previous = self._by_identity.get(identity)
            rejoining = previous is not None and previous in self._peers
            self._admit(rejoining)
            if rejoining:  # that process rejoins: one id per connection
                self._remove(previous, "left", "rejoined from the same connection")
            peer_socket = self._connect_advertised(msg["address"])  # before any state changes
            node_id = self.mesh.allocate_id()
            name = msg["name"]
            restart = name is not None and name in self._names_seen
            if name is not None:
                self._names_seen[name] = None
                if len(self._names_seen) > _NAMES_KEPT:
                    del self._names_seen[next(iter(self._names_seen))]
            place = self.mesh.add_node(node_id, msg["address"])
            self.membership.joined(node_id)
            self._tokens[token] = node_id
            self._names_by_id[node_id] = name
            if len(self._names_by_id) > _NAMES_KEPT:
                del self._names_by_id[next(iter(self._names_by_id))]
            self._pending[node_id] = time.monotonic()
            self._identity[node_id] = identity
            self._by_identity[identity] = node_id
            self._records[node_id] = NodeRecord(node_id, msg["address"], name, token, restart)
            self._peers[node_id] = Peer(node_id, msg["address"], peer_socket)
            self.counters_.add("joins")
            self.log.info(
                "node %d joined from %s (name %s, restart %s): parent %d, depth %d, mesh version %d",
                node_id,
                msg["address"],
                name,
                restart,
                place.parent,
                place.depth,
                self.mesh.version,
            )
            self._broadcast_mesh(exclude=node_id)
        record = self._records[node_id]
        reply = Message(
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
        )
        self._send(sock, reply, identity)
        self.counters_.gauges["mesh_version"] = self.mesh.version

    def _admit(self, rejoining: bool) -> None:
        """Admission control: members, joins not yet confirmed, and joins per second are bounded;
        a refused join is a counted rejection (the node retries with back-off)."""
        cfg = self.config
        now = time.monotonic()
        self._join_allowance = min(
            max(1.0, cfg.join_rate_per_s),
            self._join_allowance + (now - self._join_refill) * cfg.join_rate_per_s,
        )
        self._join_refill = now
        if len(self._peers) - rejoining >= cfg.max_nodes:
            raise FrameRejectedError("join_refused", f"the mesh is full ({cfg.max_nodes} nodes, max_nodes)")
        if len(self._pending) >= cfg.max_pending_joins:
            raise FrameRejectedError(
                "join_refused", f"{len(self._pending)} joined nodes not heard from yet (max_pending_joins)"
            )
        if self._join_allowance < 1.0:
            raise FrameRejectedError(
                "join_refused", f"more than {cfg.join_rate_per_s:g} joins per second (join_rate_per_s)"
            )
        self._join_allowance -= 1.0

    def _member(self, msg: Message, identity: bytes | None, sock: Any) -> bool:
        """Is the sender a live member? If not, tell it so (it must rejoin) and count the frame."""
        if msg.src in self._peers:
            self.membership.heard(msg.src)
            if self._pending:
                self._pending.pop(msg.src, None)
            return True
        self._send(
            sock,
            Message(
                Op.EVICTED,
                {"reason": f"node {msg.src} is not a member of this mesh", "node_id": msg.src},
                src=CONTROLLER_ID,
            ),
            identity,
        )
        raise FrameRejectedError("bad_sender", f"{msg.op} from {msg.src}, which is not a member")

    def on_update(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        self._member(msg, identity, sock)
        fresh = self._fresh_updates(msg)
        if fresh:
            self._relay([(fields, buffer) for fields, buffer, _ in fresh], came_from=msg.src)
        for fields, _, payload in fresh:
            self._apply_counted(payload, fields)

    on_updates = on_update  # a batch is handled row by row, exactly like single updates

    def _relay(self, items: list[tuple[dict, Any]], came_from: int) -> None:
        targets = self.mesh.relay_targets(CONTROLLER_ID, came_from=came_from)
        if not targets:
            return
        encoded = [(len(group), self._frames(batch_message(group, CONTROLLER_ID))) for group in groups(items)]
        for target in targets:  # encoded once, sent to every target (PLAIN: every other member)
            peer = self._peers.get(target)
            for count, batches in encoded:
                if peer is not None and self._post_frames(peer, batches, droppable=True):
                    self.counters_.add("updates_relayed", count)
                else:
                    self.counters_.add("updates_dropped_backpressure", count)
                    self._limited.warning(
                        f"drop:{target}", "controller: send queue of node %d full, update dropped", target
                    )

    def on_params_request(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        self._member(msg, identity, sock)
        want_updater = bool(msg["want_updater"]) and self.updater_state is not None
        version = self.counters_["updates_applied"]
        peer = self._peers[msg.src]
        snapshot = self._downloads.snapshot_for(
            msg.src, version, want_updater, peer.dropped, self.config.replay_ring_messages // 2,
            self.seen.watermark_of(msg.src),
        )
        shared = snapshot is not None
        if snapshot is None:
            snapshot = self._take_snapshot(version, want_updater)
        reply_fields = {
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
            snapshot.params.size,
            len(snapshot.watermark),
            "a shared" if shared else "a new",
            msg.src,
        )
        self.counters_.add("downloads_shared" if shared else "downloads_new_snapshot")
        # served chunk by chunk by _serve_downloads, on the pipe the node's relayed updates take:
        # whatever was relayed before the snapshot arrives before its chunks; whatever after may come
        # between them, and the node (syncing) holds it and applies what the snapshot lacks
        self._downloads.start(msg.src, snapshot, reply_fields, next(self._msg_ids), CONTROLLER_ID)

    def _take_snapshot(self, version: int, want_updater: bool) -> Snapshot:
        with self.lock:
            params = self.params.copy()
            updater = self.updater_state.copy() if want_updater else None
        params.flags.writeable = False
        if updater is not None:
            updater.flags.writeable = False
        snapshot = Snapshot(
            params,
            updater,
            self.seen.watermark(),
            self.seen.above_watermark(),
            version,
            {node_id: peer.dropped for node_id, peer in self._peers.items()},
        )
        self._downloads.adopt(snapshot)
        return snapshot

    def _serve_downloads(self) -> None:
        """Hand each active download its next chunk, in turns, at most DOWNLOAD_TURN_BYTES per loop
        iteration. A member whose connection is backed up gets one chunk at a time in its overflow
        queue, behind the relays already there: the download waits its turn, never starves."""
        budget = DOWNLOAD_TURN_BYTES
        progressed = True
        while budget > 0 and self._downloads and progressed:
            progressed = False
            for download in self._downloads.next_turns():
                peer = self._peers.get(download.node_id)
                if peer is None:
                    self._downloads.cancel(download.node_id)
                    continue
                if download.queued:  # its previous chunk still waits behind the relays
                    continue
                part = download.plan.part(download.next_index)
                if not self._send_part(peer, part, download):
                    continue
                download.next_index += 1
                budget -= frame_size(part.buffers[0])
                progressed = True
                if download.done:
                    self._downloads.finished(download.node_id)
                if budget <= 0:
                    break
        self._downloads.forget_stale(self.counters_["updates_applied"])

    def _receive_budget(self) -> int:
        """Back-pressure: while a member's overflow queue is half full, read a little at a time
        (every 50 ms; every half beat once it is 90 % full) instead of relaying copies that would be
        dropped: the senders' queues fill and their ``submit`` waits. Every member is still read
        often enough to be heard (any frame counts), and a dead one still times out."""
        deepest = max((len(p.pending) for p in self._out_peers.values()), default=0)
        limit = self.config.peer_queue_messages
        if deepest < limit // 2:
            return super()._receive_budget()
        now = time.monotonic()
        interval = THROTTLE_READ_S if deepest < limit * 0.9 else self.config.heartbeat_s / 2
        if now - self._last_throttled_read < interval:
            return 0
        self._last_throttled_read = now
        self.counters_.add("receive_throttled")
        return THROTTLE_BUDGET

    def _send_part(self, peer: Peer, part: Message, download: Download) -> bool:
        """Hand one chunk of a download to the member's socket, or queue it behind what waits there."""
        frames = encode_frames(part)
        if not peer.pending and self._try_send(peer.socket, frames):
            return True
        download.queued = True
        return self._post_frames(peer, [frames], token=download)

    def _poll_timeout_s(self) -> float:
        return 0.002 if self._downloads else super()._poll_timeout_s()

    def on_heartbeat(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        self._member(msg, identity, sock)
        record = self._records.get(msg.src)
        if record is not None:
            record.stats = dict(msg["stats"])

    def on_leave(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        if msg.src in self._peers:
            self._remove(msg.src, "left", msg["reason"])

    def on_status_request(self, msg: Message, identity: bytes | None, sock: Any) -> None:
        self._send(sock, Message(Op.STATUS_REPLY, {"status": self._status()}, src=CONTROLLER_ID), identity)

    # ------------------------------------------------------------------ membership
    def _remove(self, node_id: int, state: str, reason: str) -> None:
        moved = self.mesh.remove_node(node_id)
        self.membership.forget(node_id)
        self._downloads.cancel(node_id)
        peer = self._peers.pop(node_id, None)
        if peer is not None:
            self._close_peer(peer, 0.0)  # whatever was queued for it is freed now
        record = self._records.pop(node_id, None)
        if record is not None:
            record.state, record.left_at, record.reason = state, time.time(), reason
            self._departed.append(record)
            self._tokens.pop(record.token, None)
        identity = self._identity.pop(node_id, None)
        if identity is not None and self._by_identity.get(identity) == node_id:
            del self._by_identity[identity]
        self._pending.pop(node_id, None)
        self._retiring[node_id] = time.monotonic()  # its in-flight updates still count, for a while
        self.counters_.add("leaves" if state == "left" else "offline")
        self.log.info(
            "node %d %s (%s); remapped %s; mesh version %d, %d nodes",
            node_id,
            state,
            reason,
            moved or "nothing",
            self.mesh.version,
            len(self.mesh.node_ids()),
        )
        self._broadcast_mesh()

    def _broadcast_mesh(self, exclude: int | None = None) -> None:
        self.counters_.gauges["mesh_version"] = self.mesh.version
        snapshot = self.mesh.to_dict()
        for node_id, peer in self._peers.items():
            if node_id == exclude:
                continue
            fields = {"mesh": snapshot, "version": self.mesh.version, "routes": self._routes_for(node_id)}
            if not self._post(peer, Message(Op.MESH, fields, src=CONTROLLER_ID)):
                self._limited.warning(
                    f"mesh:{node_id}",
                    "controller: could not queue mesh v%d for node %d",
                    self.mesh.version,
                    node_id,
                )

    def _tick(self) -> None:
        now = time.monotonic()
        stalled, self._last_tick = now - self._last_tick, now
        if stalled > 2 * self.config.heartbeat_s:
            # this process was starved (a loaded machine, swapping): the silence was ours, and the
            # nodes' beats may still wait unread in the sockets; nobody is offline for it
            self.log.warning("controller was frozen for %.1f s; not counting it against the nodes", stalled)
            for node_id in self.membership.online():
                self.membership.heard(node_id)
        self._prune_departed(now)
        timeout = self.membership.timeout_s
        for node_id in self.membership.expire():
            if node_id in self._peers:
                self._remove(node_id, "offline", f"silent for more than {timeout:.2f} s")
        if self._beat.due():
            self.loop_stats.beat_sent(self._beat.lateness_s)
            self._send_beats()
        if self._downloads:
            self._serve_downloads()
        elif self._downloads.current is not None:  # an idle snapshot is freed once the master moves on
            self._downloads.forget_stale(self.counters_["updates_applied"])

    def _send_beats(self) -> None:
        """Two beats per member. The liveness beat travels on its own path: back through the ROUTER
        on the connection the member joined from (which carries only replies), never behind the
        relayed updates and download chunks queued on the controller's connection to it. The beat
        with the watermarks stays on that data connection, in order with the relayed updates: a
        node compares its own watermarks with it ("am I behind?"), and a watermark that overtook the
        updates it counts would make a node on a slow pipe re-sync for nothing."""
        watermark = self.seen.watermark()
        fields = {"mesh_version": self.mesh.version, "stats": {}}
        alive = encode_frames(Message(Op.HEARTBEAT, {**fields, "watermark": {}}, src=CONTROLLER_ID))
        beat = Message(Op.HEARTBEAT, {**fields, "watermark": watermark}, src=CONTROLLER_ID)
        for node_id, peer in self._peers.items():
            identity = self._identity.get(node_id)
            if identity is None or not self._try_send_routed(identity, alive):
                self.counters_.add("beats_on_data_path_only")
            self._post(peer, beat)

    def _try_send_routed(self, identity: bytes, frames: list[Any]) -> bool:
        try:
            self._router.send_multipart([identity, *frames], flags=zmq.NOBLOCK)
        except (zmq.Again, zmq.ZMQError):  # a full pipe, or EHOSTUNREACH (ROUTER_MANDATORY): not connected
            return False
        self.counters_.add("frames_out")
        return True

    def _prune_departed(self, now: float) -> None:
        """Forget a departed member's per-origin state once its late updates had ``departed_kept_s``
        to arrive: they are folded into the master copy, and watermarks (heartbeats, parameter
        replies) stay as small as the live mesh whatever the history. A later update of that origin
        is refused (``bad_origin``): ids are never reused."""
        kept = self.config.departed_kept_s
        for node_id, since in list(self._retiring.items()):
            if now - since <= kept and len(self._retiring) <= _RETIRING_MAX:
                break  # oldest first: the rest are younger
            del self._retiring[node_id]
            self.seen.forget(node_id)

    def _on_stop(self) -> None:
        self._drain_commands()
        bye = Message(Op.SHUTDOWN, {"reason": "the controller is stopping"}, src=CONTROLLER_ID)
        for peer in self._peers.values():
            self._post(peer, bye)
        self._flush_all(self.config.linger_s)
        self.log.info(
            "controller %s stopping; %d updates applied to the master copy",
            self.address,
            self.counters_["updates_applied"],
        )

    # ------------------------------------------------------------------ status
    def _status(self) -> dict[str, Any]:
        nodes = []
        for node_id in self.mesh.node_ids():
            place = self.mesh.place(node_id)
            record = self._records.get(node_id)
            nodes.append(
                {
                    "id": node_id,
                    "address": self.mesh.address(node_id),
                    "name": record.name if record else None,
                    "state": str(self.membership.state(node_id)),
                    "parent": place.parent,
                    "children": list(place.children),
                    "depth": place.depth,
                    "silent_s": round(self.membership.silent_for(node_id), 3)
                    if node_id in self.membership.known()
                    else None,
                    "stats": record.stats if record else {},
                }
            )
        departed = [
            {
                "id": r.node_id,
                "address": r.address,
                "name": r.name,
                "state": r.state,
                "reason": r.reason,
                "left_at": r.left_at,
                "stats": r.stats,
            }
            for r in self._departed
        ]
        counters = self.counters()
        return {
            "address": self.address,
            "mesh_mode": self.config.mesh,
            "fan_out": self.config.fan_out,
            "mesh_version": self.mesh.version,
            "depth": self.mesh.depth(),
            "nodes": nodes,
            "departed": departed,
            "counters": counters,
            "params_size": int(self.params.size),
            "checksum": {k: counters[k] for k in ("params_sum", "params_abs_sum", "params_crc32")},
        }

    def counters(self) -> dict[str, Any]:
        """The counters and the master copy's checksum (``checksum_updates``: the update count it is of).

        The checksum (three passes over the model) is computed again only once the master changed.
        Above checksum_max_params, asked on the I/O thread (a `status` request), it is computed on a
        copy in a background thread at most once per CHECKSUM_MIN_INTERVAL_S and the status shows the
        latest one finished (None before the first): nodes polling `status` during a join burst made
        the I/O thread spend seconds on it (issue 15). Asked from another thread it is exact."""
        snap = self.counters_.snapshot()
        snap["node_id"] = self.node_id
        snap["address"] = self.address
        version, now = self.counters_["updates_applied"], time.monotonic()
        cached = self._checksum
        if cached is None or cached[0] != version:
            large = self.params.size > self.config.checksum_max_params
            if large and threading.current_thread() is self._thread:
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
        return dict(self._names_by_id)

    def status(self, timeout_s: float = 10.0) -> dict[str, Any]:
        """The controller's view (what `psrv status` prints), taken on the I/O thread."""
        return self.call(self._status, timeout_s)

    def node_stats(self, timeout_s: float = 2.0) -> list[dict[str, Any]]:
        """Each node's latest heartbeat stats (online, then departed), without the parameter checksum
        that ``status`` computes: cheap enough for a driver's progress display to poll."""

        def collect() -> list[dict[str, Any]]:
            online = [{"id": r.node_id, "state": "online", "stats": dict(r.stats)}
                      for r in self._records.values()]
            departed = [{"id": r.node_id, "state": r.state, "stats": dict(r.stats)} for r in self._departed]
            return online + departed

        return self.call(collect, timeout_s)
