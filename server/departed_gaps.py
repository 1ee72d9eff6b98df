"""The controller's part for departed members: their late updates still count for a while, their gaps
are given up once nobody can re-send them, and a process that comes back is waited for.

A departed id's gaps (seqs the master lacks below ones it holds) keep the watermarks of that origin
where they are, so they must be given up eventually: two liveness timeouts after the departure, or
after a process of the same name joined again. While that process is still catching up (it has not
reported ``running`` in a heartbeat yet) the gaps are held: its download may have left before they
were given up, so it re-sends what the master lacks under the old (origin, seq), and that re-send
must still be accepted however slow the download was. Held gaps wait at most half of
``departed_kept_s`` from the rejoin. A part of ``ControllerMachine`` (no sockets, no clocks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from psrv.server.departed import DepartedMembers
from psrv.server.downloads import Downloads
from psrv.server.master_copy import MasterCopy

__all__ = ["DepartedGaps"]

RUNNING = "running"  # the state a node's heartbeat reports once its catch-up is installed


class DepartedGaps:
    """Departed members (``members``), the gaps they left, and the named members still catching up."""

    def __init__(self, master: MasterCopy, downloads: Downloads, departed_kept_s: float) -> None:
        self.master, self.downloads = master, downloads
        self.kept_s = departed_kept_s
        self.members = DepartedMembers()
        self.catching_up: dict[int, str] = {}  # named member -> its name, until it reports running

    def __contains__(self, node_id: object) -> bool:
        return node_id in self.members

    def joined(self, node_id: int, name: str | None, restart: bool, names: dict[int, str | None],
               now: float) -> None:
        """A member joined; ``restart``: a process of that name held ids before (they keep counting and
        their gaps wait for this member's catch-up)."""
        if name is None:
            return
        self.catching_up[node_id] = name
        if restart:
            self.members.refresh(now, lambda i: names.get(i) == name, holder=node_id)

    def departed(self, node_id: int, name: str | None, now: float) -> None:
        """A member left or went offline: its in-flight updates still count, for a while; when its
        process is back already under a newer id that is still catching up, its gaps wait for that."""
        self.members.released(node_id)
        self.catching_up.pop(node_id, None)
        holder = None
        if name is not None:
            holder = max((i for i, n in self.catching_up.items() if n == name), default=None)
        self.members.add(node_id, now, holder)
        # in the watermarks while it counts (even with no update applied): a node that held this id
        if node_id not in self.master.seen.origins():  # learns from its download it may re-send
            self.master.seen.mark_covered({node_id: 0})
            self.downloads.stop_sharing()  # a snapshot of before lacks the entry

    def heartbeat(self, node_id: int, stats: dict[str, Any], now: float) -> None:
        """A member's heartbeat: once it reports ``running`` its catch-up is done (and re-sent)."""
        if node_id in self.catching_up and stats.get("state") == RUNNING:
            del self.catching_up[node_id]
            if self.members.holds(node_id):
                self.members.caught_up(node_id, now)

    def applied(self, origins: Iterable[int]) -> None:
        """Fresh updates of these origins were applied: a departed one re-sent after its gaps were given
        up has them given up again."""
        for origin in self.members.reopened(origins):
            self.close(origin)

    def close(self, origin: int) -> None:
        """Give a departed member's gaps up: beats (contiguous marks) then cover all of it the master holds
        and a node lacking one sees it is behind. Again after a late one a member re-sent: in MESH mode its
        relay stops at the first node holding it already, and the nodes below learn of it this way."""
        self.members.gave_up(origin, self.master.seen.gaps(origin))
        gaps = self.master.seen.close(origin)
        if gaps:
            self.master.counters.add("departed_gaps_closed", gaps)
            self.downloads.stop_sharing()

    def tick(self, now: float, timeout_s: float) -> None:
        """Give up the gaps due, then forget a departed member's per-origin state once its late updates
        had ``departed_kept_s`` to arrive: they are folded into the master copy, and watermarks
        (heartbeats, parameter replies) stay as small as the live mesh whatever the history. A later
        update of that origin is refused (``bad_origin``): ids are never reused."""
        kept = self.kept_s
        # gaps are given up after twice the missed-beat timeout: a node holding one of them re-sends it
        # first (two beats of a stuck watermark: the node's beat repairs)
        for node_id in self.members.gaps_due(now, min(kept / 2, 2 * timeout_s), kept / 2):
            self.close(node_id)
        for node_id in self.members.expired(now, kept):
            self.master.seen.forget(node_id)

    def given_up_view(self, which: Callable[[int], bool]) -> dict[int, list[int]]:
        return self.members.given_up_view(which)

    @property
    def retiring(self) -> dict[int, float]:
        return self.members.retiring
