"""Parameter downloads served chunk by chunk from one shared, read-only snapshot of the master copy.

A join burst used to copy the master copy once per asking node and hand every copy's chunks to
zmq at once (N x the model in memory, N copies made on the I/O thread). Here one snapshot serves
every node that may use it, and the I/O thread hands each download its next chunk only when that
node's connection has nothing waiting, a bounded number of bytes per loop iteration, in turns: the
loop keeps ticking (beats, expiry) and the downloads progress together.

A snapshot taken at T0 is valid for a node that asked at T1 >= T0 when no update reached the master
copy since T0, or when the node was already a member at T0: every update applied after T0 was then
also relayed to it, arrives while it is syncing, and is applied on top (what the snapshot's
watermark does not cover) — provided none of the node's OWN updates reached the master since T0
(those are never relayed back to it). A running node's replica check asks after its own updates, so
it always gets a snapshot whose watermark covers them (and acknowledges them).
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from psrv.transport.chunking import ChunkPlan
from psrv.transport.messages import Message, Op

DOWNLOAD_CHUNK_MAX_BYTES = 4 * 1024 * 1024  # finer turns than chunk_bytes (16 MiB) between downloads
DOWNLOAD_TURN_BYTES = 8 * 1024 * 1024  # handed to zmq per loop iteration, all downloads together


@dataclass
class Snapshot:
    """A read-only copy of the master (and updater state) with the exact set of updates it holds."""

    params: np.ndarray
    updater: np.ndarray | None
    watermark: dict[int, int]
    extra_seen: dict[int, list[int]]
    version: int  # the master's update count when taken
    members: dict[int, int]  # the members then -> relayed copies dropped for each so far
    readers: int = 0

    def valid_for(
        self, node_id: int, version: int, want_updater: bool, dropped: int, max_behind: int,
        own_watermark: int = 0,
    ) -> bool:
        """May ``node_id`` (``dropped`` copies dropped for it so far; its own updates applied up to
        ``own_watermark``) use this snapshot now?"""
        if want_updater and self.updater is None:
            return False
        if version == self.version:
            return True
        # a member then, every update applied since was relayed to it (none dropped), none of them its
        # own (never relayed back to it), not too many
        return (self.members.get(node_id) == dropped and version - self.version <= max_behind
                and self.watermark.get(node_id, 0) == own_watermark)


@dataclass
class Download:
    node_id: int
    snapshot: Snapshot
    plan: ChunkPlan
    next_index: int = 0
    queued: bool = False  # a chunk of it waits in the member's overflow queue (one at most)

    @property
    def done(self) -> bool:
        return self.next_index >= self.plan.count

    def sent(self) -> None:
        """The queued chunk reached the socket (called like a SentToken's ``sent``)."""
        self.queued = False


@dataclass
class Downloads:
    """The active downloads of a controller, one per node (a repeated request restarts it)."""

    chunk_bytes: int
    active: dict[int, Download] = field(default_factory=dict)
    order: deque[int] = field(default_factory=deque)
    current: Snapshot | None = None
    snapshots_taken: int = 0

    def snapshot_for(
        self, node_id: int, version: int, want_updater: bool, dropped: int, max_behind: int,
        own_watermark: int = 0,
    ) -> Snapshot | None:
        """The current snapshot if this node may use it (else None: the caller takes a new one)."""
        snap = self.current
        if snap is not None and snap.valid_for(node_id, version, want_updater, dropped, max_behind,
                                               own_watermark):
            return snap
        return None

    def adopt(self, snapshot: Snapshot) -> None:
        self.current = snapshot
        self.snapshots_taken += 1

    def start(
        self, node_id: int, snapshot: Snapshot, reply_fields: dict[str, Any], msg_id: int, src: int
    ) -> None:
        """Queue a download of ``snapshot`` to ``node_id`` (replacing one in progress)."""
        self.cancel(node_id)
        buffers: list[Any] = [snapshot.params] + ([snapshot.updater] if reply_fields["updater_dtype"] else [])
        reply = Message(Op.PARAMS_REPLY, reply_fields, buffers, src=src)
        snapshot.readers += 1
        self.active[node_id] = Download(node_id, snapshot, ChunkPlan(reply, self.chunk_bytes, msg_id))
        self.order.append(node_id)

    def cancel(self, node_id: int) -> None:
        download = self.active.pop(node_id, None)
        if download is not None:
            self._release(download.snapshot)
            with contextlib.suppress(ValueError):
                self.order.remove(node_id)

    def _release(self, snapshot: Snapshot) -> None:
        snapshot.readers -= 1
        if snapshot.readers <= 0 and snapshot is not self.current:
            snapshot.params = snapshot.updater = None  # type: ignore[assignment]

    def finished(self, node_id: int) -> None:
        self.cancel(node_id)

    def next_turns(self) -> list[Download]:
        """Every active download once, starting after the one served first last time (fair turns)."""
        if self.order:
            self.order.rotate(-1)
        return [self.active[n] for n in list(self.order)]

    def forget_stale(self, version: int) -> None:
        """Free the current snapshot once nobody reads it and the master moved on."""
        snap = self.current
        if snap is not None and snap.readers <= 0 and snap.version != version:
            self.current = None
            snap.params = snap.updater = None  # type: ignore[assignment]

    def stop_sharing(self) -> None:
        """The master's watermark moved without an update (a departed member's gaps were given up): the
        current snapshot no longer says what the master holds, and a member that installed it would
        stay behind that watermark for good (gaps are never relayed). Later requests get a new one;
        downloads in progress keep theirs."""
        snap, self.current = self.current, None
        if snap is not None and snap.readers <= 0:
            snap.params = snap.updater = None  # type: ignore[assignment]

    def __bool__(self) -> bool:
        return bool(self.active)

    def __len__(self) -> int:
        return len(self.active)


class DownloadToken:
    """The token of one download handed to the I/O loop (events.Download): told (``sent()``) when the
    loop handed it over or ended it, it frees the snapshot's reader. A replaced download's token finds
    another record active and does nothing."""

    __slots__ = ("downloads", "node_id", "record")

    def __init__(self, downloads: Downloads, node_id: int, record: Download) -> None:
        self.downloads, self.node_id, self.record = downloads, node_id, record

    def sent(self) -> None:
        if self.downloads.active.get(self.node_id) is self.record:
            self.downloads.finished(self.node_id)
