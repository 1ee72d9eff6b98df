"""A task's final check of the central invariant: its replica equals the master copy."""

from __future__ import annotations

import logging
from typing import Any

from psrv.server.node import Node
from psrv.spark.task.worker import worker_id
from psrv.torch.device_sharing import DeviceSharing

log = logging.getLogger(__name__)


def check_replica(node: Node, heartbeat_s: float, missed_beats: int,
                  sharing: DeviceSharing | None = None) -> dict[str, Any]:
    """The central invariant, checked where it can break: this replica against the master copy
    (snapshot + the updates this replica holds beyond it; server/replica.py). Costs one download.
    A device network's live replica is its device parameters (copied to the host for the check)."""
    current = (lambda: sharing.network.params) if sharing is not None else None
    check = node.check_replica(timeout_s=heartbeat_s * (missed_beats + 4) + 5.0, current=current)
    if check.diverged:
        log.error("worker %s: its replica DIFFERS from the master copy: %s", worker_id(), check.detail)
    return check.as_dict()


__all__ = ["check_replica"]
