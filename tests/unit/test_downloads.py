"""The shared snapshot of parameter downloads: who may use it, who reads it, when it is freed."""

from __future__ import annotations

import numpy as np
from psrv.server.downloads import Downloads, DownloadToken, MasterSnapshot


def snapshot(version: int = 5, members: dict[int, int] | None = None) -> MasterSnapshot:
    params = np.arange(1000, dtype=np.float32)
    return MasterSnapshot(params, None, {1: 3}, {}, version, members if members is not None else {1: 0, 2: 0})


def test_a_snapshot_serves_anyone_while_the_master_is_unchanged_and_then_only_undropped_members() -> None:
    downloads = Downloads()
    downloads.adopt(snapshot())
    assert downloads.snapshot_for(9, 5, False, 0, 100) is not None  # unchanged: even a newcomer
    # a member then, nothing dropped for it, none of its own since (its watermark is still 3)
    assert downloads.snapshot_for(1, 7, False, 0, 100, own_watermark=3) is not None
    assert downloads.snapshot_for(9, 7, False, 0, 100) is None  # joined later: missed updates 6 and 7
    assert downloads.snapshot_for(2, 7, False, 1, 100) is None  # a relay to it was dropped since
    assert downloads.snapshot_for(1, 500, False, 0, 100, own_watermark=3) is None  # too far behind
    assert downloads.snapshot_for(1, 5, True, 0, 100) is None  # no updater state in it
    # member 1's own updates 4 and 5 reached the master since: never relayed back to it, so the
    # snapshot (its watermark for 1 is 3) would not cover them: a fresh one (a replica check's case)
    assert downloads.snapshot_for(1, 7, False, 0, 100, own_watermark=5) is None


def test_downloads_count_the_readers_of_a_snapshot_and_free_it_once_unread_and_stale() -> None:
    downloads = Downloads()
    snap = snapshot()
    downloads.adopt(snap)
    for node in (1, 2):
        downloads.start(node, snap)
    first = downloads.active[1]
    downloads.start(1, snap)  # node 1 asked again: its first download is replaced, not counted twice
    assert snap.readers == 2 and downloads.active[1] is not first
    token = DownloadToken(downloads, 1, first)
    token.sent()  # the replaced download's token finds another one active: nothing happens
    assert snap.readers == 2 and 1 in downloads.active
    DownloadToken(downloads, 1, downloads.active[1]).sent()
    downloads.cancel(2)  # node 2 left mid-download
    assert not downloads and snap.readers == 0 and snap.params is not None  # still the current one
    downloads.forget_stale(5)  # the master did not move: kept for the next asker
    assert downloads.current is snap
    downloads.forget_stale(6)  # the master moved on and nobody reads it: freed
    assert downloads.current is None and snap.params is None


def test_a_snapshot_is_not_shared_once_the_masters_watermark_moved_without_an_update() -> None:
    downloads = Downloads()
    snap = snapshot()
    downloads.adopt(snap)
    downloads.start(1, snap)
    downloads.stop_sharing()  # a departed member's gaps were given up
    assert downloads.snapshot_for(9, 5, False, 0, 100) is None and snap.params is not None  # 1 still reads
    downloads.finished(1)
    assert snap.params is None
