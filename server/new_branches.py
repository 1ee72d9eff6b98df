"""Direct copies for a member that just got a parent (MESH): the controller's part of "a new member
misses nothing".

In MESH a member below the top level receives updates only from its parent. A parent forwards to a
new child only once it has processed the mesh version that names it, and that MESH travels on the
controller's pipe to the parent while updates reach the parent on other pipes. An update the parent
handled before it knew the child (its own, or one on its way up or down the tree) that the master
applies after the child's download was taken reaches the child by no path: the child stays behind
on that origin until the watermark beats make it download the whole model again (a few beats later).

So for a short window (one beat) after a member is placed under a new parent (a join, or its former
parent left), the controller also sends it every update it applies that did not come from the
member's own subtree. A copy may overtake the member's join reply (they travel on different
connections): the member holds such updates until the reply announced their sender
(``NodeMachine``). It drops what it already has as a duplicate and forwards the rest only downwards
(``MeshOrganizer.relay_targets``). What still slips through (a parent slower than the window) is
repaired as before, by the re-sync. Plain object; no sockets, no clock.
"""

from __future__ import annotations

from psrv.server.mesh import CONTROLLER_ID, MeshOrganizer

__all__ = ["NewBranches"]


class NewBranches:
    """Members placed under a new parent, each until when it gets direct copies."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.until: dict[int, float] = {}

    def placed(self, node_ids: list[int], mesh: MeshOrganizer, now: float) -> None:
        """``node_ids`` have a new parent since now (a member of the top level needs no copies)."""
        for node_id in node_ids:
            if node_id in mesh and mesh.parent(node_id) != CONTROLLER_ID:
                self.until[node_id] = now + self.window_s

    def forget(self, node_id: int) -> None:
        self.until.pop(node_id, None)

    def targets(self, origins: list[int], came_from: int, mesh: MeshOrganizer,
                now: float) -> list[tuple[int, list[int]]]:
        """``(member, indexes into origins)``: which of an applied batch's rows each member in its window
        gets straight from the controller (not its own subtree's, which passed through it; not a member
        the controller relays to anyway). Members whose window ended are forgotten."""
        out = []
        for node_id, until in list(self.until.items()):
            if now > until or node_id not in mesh:
                del self.until[node_id]
                continue
            if node_id == came_from or mesh.parent(node_id) == CONTROLLER_ID:
                continue
            rows = [i for i, origin in enumerate(origins)
                    if origin != node_id and not (origin in mesh and mesh.below(origin, node_id))]
            if rows:
                out.append((node_id, rows))
        return out
