"""Which copy of the master a parameter download gets: one shared, read-only snapshot.

A join burst used to copy the master copy once per asking node (N x the model in memory, N copies
made on the I/O thread). Here one snapshot serves every node that may use it; the controller's
machine counts its readers (the downloads in progress) and frees it when nobody reads it and the
master moved on. Handing the pieces to the sockets, paced and in turns, is the loop's
(transport/pacing.py).

A snapshot taken at T0 is valid for a node that asked at T1 >= T0 when no update reached the master
copy since T0, or when the node was already a member at T0: every update applied after T0 was then
also relayed to it, arrives while it is syncing, and is applied on top (what the snapshot's
watermark does not cover) — provided none of the node's OWN updates reached the master since T0
(those are never relayed back to it). (In MESH a new member's parent may not have known it yet: the
controller's copies for new branches, new_branches.py, cover that.) A running node's replica check
asks after its own updates, so it always gets a snapshot whose watermark covers them (and
acknowledges them). A snapshot is not shared any more once the master's watermark moved without an
update (``stop_sharing``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Downloads", "DownloadToken", "MasterSnapshot", "Reading"]


@dataclass
class MasterSnapshot:
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


@dataclass(eq=False)
class Reading:
    """One download in progress of ``snapshot`` (its identity tells a replaced download from the next)."""

    node_id: int
    snapshot: MasterSnapshot


@dataclass
class Downloads:
    """The downloads in progress of a controller, one per node (a repeated request replaces it): each
    holds one reader of its snapshot."""

    active: dict[int, Reading] = field(default_factory=dict)
    current: MasterSnapshot | None = None
    snapshots_taken: int = 0

    def snapshot_for(
        self, node_id: int, version: int, want_updater: bool, dropped: int, max_behind: int,
        own_watermark: int = 0,
    ) -> MasterSnapshot | None:
        """The current snapshot if this node may use it (else None: the caller takes a new one)."""
        snap = self.current
        if snap is not None and snap.valid_for(node_id, version, want_updater, dropped, max_behind,
                                               own_watermark):
            return snap
        return None

    def adopt(self, snapshot: MasterSnapshot) -> None:
        self.current = snapshot
        self.snapshots_taken += 1

    def start(self, node_id: int, snapshot: MasterSnapshot) -> None:
        """A download of ``snapshot`` to ``node_id`` begins (replacing one in progress)."""
        self.cancel(node_id)
        snapshot.readers += 1
        self.active[node_id] = Reading(node_id, snapshot)

    def cancel(self, node_id: int) -> None:
        """It finished, was replaced, or its node left: one reader fewer."""
        reading = self.active.pop(node_id, None)
        if reading is not None:
            snapshot = reading.snapshot
            snapshot.readers -= 1
            if snapshot.readers <= 0 and snapshot is not self.current:
                snapshot.params = snapshot.updater = None  # type: ignore[assignment]

    finished = cancel

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

    def __init__(self, downloads: Downloads, node_id: int, record: Reading) -> None:
        self.downloads, self.node_id, self.record = downloads, node_id, record

    def sent(self) -> None:
        if self.downloads.active.get(self.node_id) is self.record:
            self.downloads.finished(self.node_id)
