"""Parameter downloads from the controller: which snapshot of the master copy a member gets (one
shared, read-only snapshot where it may serve several: downloads.py) and the PARAMS_REPLY that
carries it with the exact set of updates it holds, paced by the loop (``Download``)."""

from __future__ import annotations

import logging

from psrv.server.downloads import Downloads, DownloadToken
from psrv.server.master_copy import MasterCopy
from psrv.server.mesh import CONTROLLER_ID
from psrv.transport.config import TransportConfig
from psrv.transport.events import Download
from psrv.transport.messages import Message, Op

__all__ = ["ParamsServer"]


class ParamsServer:
    """Serves PARAMS_REQUESTs from the master copy; owns the downloads in progress."""

    def __init__(self, master: MasterCopy, config: TransportConfig, log: logging.Logger) -> None:
        self.master = master
        self.config = config
        self.log = log
        self.downloads = Downloads()

    def serve(self, msg: Message, dropped: dict[int, int], member_ids: list[int],
              given_up: dict[int, list[int]] | None = None) -> Download:
        """The paced PARAMS_REPLY for ``msg``'s sender; ``dropped``: relayed copies dropped so far, per
        member; ``given_up``: the seqs of departed members given up so far (the master never held them;
        a process that held such an id sends those it still has again under its new id)."""
        node_id = msg.src
        want_updater = bool(msg["want_updater"]) and self.master.updater_state is not None
        version = self.master.counters["updates_applied"]
        snapshot = self.downloads.snapshot_for(
            node_id, version, want_updater, dropped.get(node_id, 0),
            self.config.replay_ring_messages // 2, self.master.seen.watermark_of(node_id),
        )
        shared = snapshot is not None
        if snapshot is None:
            members = {node_id: dropped.get(node_id, 0) for node_id in member_ids}
            snapshot = self.master.snapshot(version, want_updater, members)
            self.downloads.adopt(snapshot)
        fields = {
            "request_id": msg["request_id"],
            "dtype": snapshot.params.dtype.str,
            "size": int(snapshot.params.size),
            "updater_dtype": None if not want_updater else snapshot.updater.dtype.str,
            "updater_size": 0 if not want_updater else int(snapshot.updater.size),
            "watermark": snapshot.watermark,
            "extra_seen": snapshot.extra_seen,
            "given_up": given_up or {},
        }
        self.log.info(
            "sending params (%d values, %d origins in the watermark, %s snapshot) to node %d",
            snapshot.params.size, len(snapshot.watermark), "a shared" if shared else "a new", node_id,
        )
        self.master.counters.add("downloads_shared" if shared else "downloads_new_snapshot")
        # paced by the driver on the pipe the member's relayed updates take: whatever was relayed before
        # the snapshot arrives before its pieces; whatever after may come between them, and the node
        # (syncing) holds it and applies what the snapshot lacks
        self.downloads.start(node_id, snapshot)
        record = self.downloads.active[node_id]
        buffers = [snapshot.params] + ([snapshot.updater] if want_updater else [])
        reply = Message(Op.PARAMS_REPLY, fields, buffers, src=CONTROLLER_ID)
        return Download(node_id, reply, DownloadToken(self.downloads, node_id, record))
