"""What the controller remembers of each member, and how `psrv status` shows it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from psrv.server.liveness import Members
from psrv.server.mesh import MeshOrganizer


@dataclass
class NodeRecord:
    """One member (or, once departed, its last state). ``joined_at``/``left_at``: wall-clock seconds
    for display, given by the driver (the machine reads no clock)."""

    node_id: int
    address: str
    name: str | None
    token: str
    restart: bool
    joined_at: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)
    state: str = "online"
    left_at: float | None = None
    reason: str = ""


def node_view(mesh: MeshOrganizer, node_id: int, record: NodeRecord | None, members: Members,
              now: float) -> dict[str, Any]:
    place = mesh.place(node_id)
    return {
        "id": node_id,
        "address": mesh.address(node_id),
        "name": record.name if record else None,
        "state": str(members.state(node_id)),
        "parent": place.parent,
        "children": list(place.children),
        "depth": place.depth,
        "silent_s": round(members.silent_for(node_id, now), 3) if node_id in members else None,
        "stats": record.stats if record else {},
    }


def departed_view(record: NodeRecord) -> dict[str, Any]:
    return {
        "id": record.node_id,
        "address": record.address,
        "name": record.name,
        "state": record.state,
        "reason": record.reason,
        "left_at": record.left_at,
        "stats": record.stats,
    }


def status_view(machine: Any, counters: dict[str, Any], now: float) -> dict[str, Any]:
    """What `psrv status` prints: the mesh, each member, the departed, counters and checksum."""
    mesh = machine.mesh
    records = machine._records  # noqa: SLF001 - a view of the machine's own state
    members = machine.members
    nodes = [node_view(mesh, node_id, records.get(node_id), members, now) for node_id in mesh.node_ids()]
    return {
        "address": machine.address,
        "mesh_mode": machine.config.mesh,
        "fan_out": machine.config.fan_out,
        "mesh_version": mesh.version,
        "depth": mesh.depth(),
        "nodes": nodes,
        "departed": [departed_view(r) for r in machine._departed],  # noqa: SLF001
        "counters": counters,
        "params_size": int(machine.params.size),
        "checksum": {k: counters[k] for k in ("params_sum", "params_abs_sum", "params_crc32")},
    }


def stats_view(online: Iterable[NodeRecord], departed: Iterable[NodeRecord]) -> list[dict[str, Any]]:
    """Each member's latest heartbeat stats (online, then departed)."""
    return [{"id": r.node_id, "state": "online", "stats": dict(r.stats)} for r in online] + [
        {"id": r.node_id, "state": r.state, "stats": dict(r.stats)} for r in departed
    ]


__all__ = ["NodeRecord", "node_view", "stats_view", "status_view"]
