"""Two of the controller's bounds, as small policies told the time: JOIN admission, and when each
member hears of a new mesh version."""

from __future__ import annotations

from psrv.transport.config import TransportConfig
from psrv.transport.errors import FrameRejectedError

__all__ = ["MESH_BROADCAST_MIN_S", "MESH_BROADCAST_PER_MEMBER_S", "JoinGate", "MeshAnnouncer"]

# a join burst or a wave of departures sends every member one MESH per this interval (at most), not
# one per change: N joins no longer cost every member N messages that each hold the whole mesh. The
# interval grows with the mesh (each broadcast is N messages of N entries): 0.5 s for 1 024 members
MESH_BROADCAST_MIN_S = 0.1
MESH_BROADCAST_PER_MEMBER_S = 0.0005


class JoinGate:
    """Admission control: members, joins not heard from yet, and joins per second (a token bucket
    of ``join_rate_per_s``, a burst of as many) are bounded; a refused join is a counted rejection
    (``join_refused``; the node retries with back-off)."""

    def __init__(self, config: TransportConfig) -> None:
        self.config = config
        self.allowance = max(1.0, config.join_rate_per_s)
        self._refilled: float | None = None

    def admit(self, members: int, pending: int, now: float) -> None:
        cfg = self.config
        if self._refilled is not None:
            self.allowance = min(
                max(1.0, cfg.join_rate_per_s), self.allowance + (now - self._refilled) * cfg.join_rate_per_s
            )
        self._refilled = now
        if members >= cfg.max_nodes:
            raise FrameRejectedError("join_refused", f"the mesh is full ({cfg.max_nodes} nodes, max_nodes)")
        if pending >= cfg.max_pending_joins:
            raise FrameRejectedError(
                "join_refused", f"{pending} joined nodes not heard from yet (max_pending_joins)"
            )
        if self.allowance < 1.0:
            raise FrameRejectedError(
                "join_refused", f"more than {cfg.join_rate_per_s:g} joins per second (join_rate_per_s)"
            )
        self.allowance -= 1.0


class MeshAnnouncer:
    """Which mesh version each member was sent, and when the next broadcast may go: at most one per
    ``every`` seconds (longer in a large mesh), each member sent a version once (a joiner has it in
    its reply). A member must hear of a new member before that member's first update reaches it: the
    controller holds the new member's catch-up until a broadcast holding it went out."""

    def __init__(self, heartbeat_s: float) -> None:
        self.every = min(MESH_BROADCAST_MIN_S, heartbeat_s / 4)
        self.sent: dict[int, int] = {}  # member -> the mesh version it was last sent
        self.added_in: dict[int, int] = {}  # member -> the first mesh version that holds it
        self.broadcast_version = 0  # every member has been sent at least this version
        self.changed = False
        self._last: float | None = None

    def joined(self, node_id: int, version: int) -> None:
        self.added_in[node_id] = version
        self.changed = True

    def replied(self, node_id: int, version: int) -> None:
        """A JOIN_REPLY holding ``version`` went to ``node_id``. A node takes the first reply to its
        token and ignores the later ones (answers to a JOIN it sent again while the first reply was on
        its way), so a repeated reply never counts as delivering the newer mesh it holds: the next
        broadcast still sends that version (a node that did take it drops the MESH as old)."""
        self.sent.setdefault(node_id, version)

    def removed(self, node_id: int) -> None:
        self.sent.pop(node_id, None)
        self.added_in.pop(node_id, None)
        self.changed = True

    def due(self, now: float, members: int) -> bool:
        interval = max(self.every, members * MESH_BROADCAST_PER_MEMBER_S)
        return self._last is None or now - self._last >= interval

    def known_to_all(self, node_id: int) -> bool:
        """Has every member been sent a mesh that holds ``node_id``?"""
        return self.added_in.get(node_id, 0) <= self.broadcast_version

    def known_to(self, origins: list[int], targets: tuple[int, ...]) -> bool:
        needed = max(self.added_in.get(origin, 0) for origin in origins)
        return all(self.sent.get(target, -1) >= needed for target in targets)

    def broadcast(self, version: int, members: list[int], now: float) -> list[int]:
        """A broadcast of ``version`` goes now: the members that have not had it (marked sent)."""
        self.changed = False
        self._last = now
        self.broadcast_version = version
        lagging = [m for m in members if self.sent.get(m, -1) < version]
        for member in lagging:
            self.sent[member] = version
        return lagging
