"""The node's parameter downloads: catch-up after a join, re-sync when behind, and the snapshot a
``check_replica`` compares against. Parts of ``NodeMachine`` (no sockets, no clocks).

- ``SyncPath``: the node's download part; it owns the pieces below and is given the node's view
  and its update path (which replays what the master copy lacks and sends the backlog).

- ``PendingDownload``: request ids, the catch-up deadline and the retry back-off of a download that
  stopped moving (a lost reply or chunk is asked for again, slower each time).
- ``DownloadedCopy`` / ``parse_snapshot``: a PARAMS_REPLY as arrays and the exact set of updates the
  parameters include (watermark + the seqs above it); anything that does not fit this model is a
  counted ``bad_payload`` rejection, never an exception out of the machine.
- ``ReplicaProbe``: the state of one ``check_replica``: which request it waits for, its snapshot,
  and the verdict once this replica applied everything the snapshot includes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import psrv.encoding as encoding
from psrv.server.dedup import SeenUpdates
from psrv.server.node_state import NodeState
from psrv.server.node_updates import UpdatePath
from psrv.server.node_view import NodeView
from psrv.server.replay import ReplayLog
from psrv.server.replica import ReplicaCheck, compare, covers, expected_replica
from psrv.transport.codec import as_buffer
from psrv.transport.errors import FrameRejectedError, JoinError
from psrv.transport.events import Install, Notify, Ready
from psrv.transport.messages import Message, Op

DOWNLOAD_RETRY_MIN_S = 2.0  # a download with no progress for this long (or 4 beats) is asked for again


class PendingDownload:
    """Request numbering and timers of the node's parameter downloads."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.request_id = 0  # the last request id used (check_replica's requests share the numbering)
        self.first = 0  # any reply to a request of the current download is a valid snapshot
        self.deadline = 0.0
        self.progress = 0.0  # when the download last moved (asked, or a chunk from the controller)
        self.retry_s = 0.0
        self.last_sync = -1e18  # when the last download finished (re-syncs are spaced by a few beats)

    def next_id(self) -> int:
        self.request_id += 1
        return self.request_id

    def begin(self, now: float, heartbeat_s: float) -> None:
        self.first = self.request_id + 1
        self.deadline = now + self.timeout_s
        self.retry_s = max(DOWNLOAD_RETRY_MIN_S, 4 * heartbeat_s)

    def asked(self, now: float) -> int:
        """A (new) request goes out now; returns its id."""
        self.progress = now
        return self.next_id()

    def accepts(self, request_id: int) -> bool:
        return self.first <= request_id <= self.request_id

    def timed_out(self, now: float) -> bool:
        return now > self.deadline

    def retry_due(self, now: float) -> bool:
        """True when nothing moved for ``retry_s``; the next wait is twice as long (a slow link
        is not flooded with copies)."""
        if now - self.progress <= self.retry_s:
            return False
        self.retry_s *= 2
        return True

    def requests(self) -> int:
        return self.request_id - self.first + 1


@dataclass
class DownloadedCopy:
    master: np.ndarray  # a read-only view of the reply's buffer
    updater: np.ndarray | None
    watermark: dict[int, int]
    extra: dict[int, list[int]]
    given_up: dict[int, list[int]] = field(default_factory=dict)  # departed ids' seqs the master gave up


def _array(buffer: object, dtype: str, size: int, what: str) -> np.ndarray:
    try:
        array = np.frombuffer(as_buffer(buffer), dtype=np.dtype(dtype))
    except (TypeError, ValueError) as exc:
        raise FrameRejectedError("bad_payload", f"params reply: {what} does not parse: {exc}") from None
    if array.size != size:
        raise FrameRejectedError(
            "bad_payload", f"params reply: {what} of {array.size} values, this model has {size}"
        )
    return array


def parse_snapshot(msg: Message, params_size: int) -> DownloadedCopy:
    """A PARAMS_REPLY (catalogue-checked) as a DownloadedCopy for a model of ``params_size`` values."""
    master = _array(msg.buffers[0], msg["dtype"], params_size, "the parameters")
    updater = None
    if msg["updater_dtype"] is not None:
        if len(msg.buffers) < 2:
            raise FrameRejectedError("bad_payload", "params reply names an updater state it lacks")
        updater = np.array(_array(msg.buffers[1], msg["updater_dtype"], msg["updater_size"], "the updater"))
    watermark = {int(o): int(w) for o, w in msg["watermark"].items()}
    extra = {int(o): [int(x) for x in s] for o, s in msg["extra_seen"].items()}
    given_up = {int(o): [int(x) for x in s] for o, s in (msg["given_up"] or {}).items()}
    return DownloadedCopy(master, updater, watermark, extra, given_up)


class ReplicaProbe:
    """One ``check_replica`` in progress: the request it waits for and the snapshot it got."""

    def __init__(self) -> None:
        self.request = 0
        self.snapshot: DownloadedCopy | None = None
        self.resyncs = 0  # the node's re-sync count when the snapshot arrived

    def reset(self) -> None:
        self.request, self.snapshot = 0, None

    def verdict(
        self,
        running: bool,
        resyncs: int,
        seen: SeenUpdates,
        replay: ReplayLog,
        live: Callable[[], np.ndarray],
        tolerance: float,
    ) -> ReplicaCheck | str | None:
        """The verdict once the snapshot is here and covered; "resynced" when the replica was
        replaced meanwhile (ask again); None when not yet. The caller holds the node's lock."""
        snap = self.snapshot
        if snap is None:
            return None if running else "resynced"
        if resyncs != self.resyncs or not running:
            self.reset()
            return "resynced"
        if not covers(seen, snap.watermark, snap.extra):
            return None
        if replay.incomplete(snap.watermark):
            return ReplicaCheck("incomplete", detail="updates beyond the snapshot fell out of the "
                                "replay ring; raise replay_ring_messages / replay_ring_bytes")
        extra = {o: set(s) for o, s in snap.extra.items()}
        expected, replayed = expected_replica(snap.master, replay.missing_from(snap.watermark, extra),
                                              encoding.decode)
        return compare(live(), expected, replayed, tolerance)



class SyncPath:
    """The node's downloads: ask for the master copy, install it (the update path replays what it
    lacks and sends the backlog), retry a download that stopped moving; check_replica's probe.

    Owns the pending download, the probe and the downloaded updater state; collaborators: the
    node's view and its update path (given)."""

    def __init__(
        self,
        view: NodeView,
        updates: UpdatePath,
        want_updater_state: bool,
    ) -> None:
        self.view, self.updates = view, updates
        self.want_updater_state = want_updater_state
        self.updater_state: np.ndarray | None = None
        self.download = PendingDownload(view.config.catchup_timeout_s)
        self.probe = ReplicaProbe()

    def on_params_reply(self, msg: Message) -> bool:
        """A PARAMS_REPLY: the probe's snapshot, or the download (True: installed, now running)."""
        view = self.view
        if self.probe.request and msg["request_id"] == self.probe.request and view.state is NodeState.RUNNING:
            snap = parse_snapshot(msg, view.params.size)  # a snapshot for check_replica, not a catch-up
            snap.master = np.array(snap.master)
            self.probe.snapshot, self.probe.resyncs = snap, view.counters["resyncs"]
            # the snapshot's watermark acknowledges our updates as a heartbeat's does (sooner)
            view.set_acknowledged(max(view.acknowledged, snap.watermark.get(view.node_id, 0)))
            if self.updates.resent and self.updates.acknowledged_former(snap.watermark):
                view.emit(Notify("acknowledged"))
            return False
        if view.state is not NodeState.SYNCING or not self.download.accepts(msg["request_id"]):
            return False
        self._install(msg)
        return True

    def _install(self, msg: Message) -> None:
        """Install the master copy, replay what it lacks, apply what was held, send the backlog."""
        view = self.view
        snap = parse_snapshot(msg, view.params.size)
        view.ctrl_origins = set(snap.watermark)
        np.copyto(view.params, snap.master, casting="same_kind")
        if self.updates.params_outside:
            view.emit(Install(view.params))  # before the replays rebase emits
        if snap.updater is not None:
            self.updater_state = snap.updater
        replayed, incomplete = self.updates.rebase(snap.watermark, snap.extra, snap.given_up)
        view.state = NodeState.RUNNING
        self.updates.send_backlog()
        if incomplete:
            view.counters.add("resync_incomplete")
            view.log.warning("node %d: the replay ring was too short for origins %s; this replica may differ",
                             view.node_id, incomplete[:8])
        self.download.last_sync = view.now
        view.log.info("node %d caught up: %d values, %d origins covered, %d replayed", view.node_id,
                      snap.master.size, len(snap.watermark), replayed)
        view.emit(Ready())  # start() returns (a driver ignores repeats)
        view.emit(Notify("ready"))

    def begin(self, reason: str) -> None:
        """Download the master copy (after a join, or when behind)."""
        view = self.view
        view.state = NodeState.SYNCING
        self.download.begin(view.now, view.config.heartbeat_s)
        view.counters.add("resyncs")
        view.log.info("node %d requesting the master copy (%s)", view.node_id, reason)
        self._request_params()

    def _request_params(self) -> None:
        """Ask for the master copy; a lost reply (or chunk of it) is asked for again by ``tick``."""
        rid = self.download.asked(self.view.now)
        fields = {"request_id": rid, "want_updater": self.want_updater_state}
        self.view.send_ctrl(Message(Op.PARAMS_REQUEST, fields, src=self.view.node_id))

    def tick(self, now: float) -> None:
        """While downloading: give up at the catch-up deadline, ask again when nothing moved."""
        view = self.view
        if self.download.timed_out(now):
            raise JoinError(f"node {view.node_id}: the parameter download from {view.controller_address} "
                            f"did not finish within {view.config.catchup_timeout_s:.1f} s "
                            f"({self.download.requests()} request(s))")
        if self.download.retry_due(now):
            view.log.warning("node %d: no part of the parameter download arrived for a while; "
                             "asking again",
                             view.node_id)
            view.counters.add("download_retries")
            self._request_params()

    def request_check(self) -> None:
        """check_replica: ask for a snapshot (only while running; else the probe stays unrequested)."""
        self.probe.reset()
        if self.view.state is not NodeState.RUNNING:
            return
        self.probe.request = self.download.next_id()
        fields = {"request_id": self.probe.request, "want_updater": False}
        self.view.send_ctrl(Message(Op.PARAMS_REQUEST, fields, src=self.view.node_id))

    def verdict(
        self, tolerance: float, current: Callable[[], np.ndarray] | None
    ) -> ReplicaCheck | str | None:
        """``check_replica``'s verdict (see ReplicaProbe.verdict); the caller holds the facade's lock."""
        view = self.view
        live = current if current is not None else (lambda: view.params)
        return self.probe.verdict(view.state is NodeState.RUNNING, view.counters["resyncs"],
                                  self.updates.seen, self.updates.replay, live, tolerance)


__all__ = [
    "DOWNLOAD_RETRY_MIN_S", "DownloadedCopy", "PendingDownload", "ReplicaProbe", "SyncPath", "parse_snapshot",
]
