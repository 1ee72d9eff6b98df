"""The shared snapshot of parameter downloads: who may use it, and chunks that rebuild the reply."""

from __future__ import annotations

import numpy as np
from psrv.transport.chunking import Reassembler
from psrv.transport.codec import decode_header
from psrv.transport.downloads import Downloads, Snapshot
from psrv.transport.messages import Op


def snapshot(version: int = 5, members: dict[int, int] | None = None) -> Snapshot:
    params = np.arange(1000, dtype=np.float32)
    return Snapshot(params, None, {1: 3}, {}, version, members if members is not None else {1: 0, 2: 0})


def test_a_snapshot_serves_anyone_while_the_master_is_unchanged_and_then_only_undropped_members() -> None:
    downloads = Downloads(chunk_bytes=1024)
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


def test_a_download_is_served_chunk_by_chunk_and_reassembles_to_the_reply() -> None:
    downloads = Downloads(chunk_bytes=1000)
    snap = snapshot()
    downloads.adopt(snap)
    fields = {"request_id": 4, "dtype": "<f4", "size": 1000, "updater_dtype": None, "updater_size": 0,
              "watermark": snap.watermark, "extra_seen": snap.extra_seen}
    for node in (1, 2):
        downloads.start(node, snap, fields, msg_id=node, src=0)
    assert snap.readers == 2
    rebuilt = {}
    for node in (1, 2):
        reassembler = Reassembler(1 << 20, 30.0)
        download = downloads.active[node]
        assert download.plan.count == 4  # 4000 bytes in pieces of 1000
        done = None
        while not download.done:
            done = reassembler.add(node, download.plan.part(download.next_index))
            download.next_index += 1
        message = decode_header(*done)
        assert message.op is Op.PARAMS_REPLY and message["request_id"] == 4
        rebuilt[node] = np.frombuffer(message.buffers[0], dtype=np.float32)
        downloads.finished(node)
    assert all(np.array_equal(r, snap.params) for r in rebuilt.values())
    assert not downloads and snap.readers == 0
    downloads.forget_stale(6)  # the master moved on and nobody reads it: freed
    assert downloads.current is None
