"""Mesh topology: which node relays updates to which, as a plain object without I/O.

The controller (id ``CONTROLLER_ID`` = 0) is the root. In PLAIN mode every node is a child of
the root, which then relays everything. In MESH mode nodes form a breadth-first tree with at
most ``fan_out`` children per node (the root included), so 8 192 nodes fit within depth 5.

Placement rules (all deterministic, so a controller and a test agree on every decision):

- ``add_node``: MESH puts a new node under the shallowest node that has room (ties: lowest id).
- ``remove_node``: each child of the removed node moves, with its whole subtree, to the live node
  with the fewest children (ties: lowest depth, then lowest id) that has room and is not inside
  the moving subtree (nor inside another subtree still waiting to move).
- ``remap``: the node (with its subtree) is re-placed by the ``add_node`` rule, never under one of
  its own descendants.

Every change increments ``version`` by exactly one; it never decreases, also across
``to_dict``/``from_dict`` (a msgpack-able, exact round trip).
"""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from psrv.transport.errors import MeshError, UnknownNodeError

__all__ = ["CONTROLLER_ID", "NO_PARENT", "MeshMode", "Place", "MeshOrganizer"]

CONTROLLER_ID = 0
"""The root of every mesh; node ids are positive ints assigned by the controller."""

NO_PARENT = -1
"""The parent of the root (and, transiently, of a subtree being moved)."""

_FORMAT = 1  # version of the to_dict layout


class MeshMode(StrEnum):
    PLAIN = "plain"
    MESH = "mesh"


@dataclass(frozen=True)
class Place:
    """Where one node sits: its parent, its children (in order) and its depth (root = 0)."""

    node_id: int
    parent: int
    children: tuple[int, ...]
    depth: int


class _Entry:
    __slots__ = ("node_id", "address", "parent", "children", "depth")

    def __init__(self, node_id: int, address: str, parent: int, depth: int) -> None:
        self.node_id = node_id
        self.address = address
        self.parent = parent
        self.children: list[int] = []
        self.depth = depth


def _check_node_id(node_id: Any) -> int:
    if isinstance(node_id, bool) or not isinstance(node_id, int) or node_id <= CONTROLLER_ID:
        raise MeshError(f"node id must be a positive int, got {node_id!r}")
    return node_id


class MeshOrganizer:
    """The controller's view of the mesh: add, remove, remap, version, serialize."""

    def __init__(self, mode: MeshMode | str = "plain", fan_out: int = 8, *, controller_address: str = ""):
        try:
            self.mode = MeshMode(mode)
        except ValueError:
            raise MeshError(f"mesh mode must be one of {[m.value for m in MeshMode]}, got {mode!r}") from None
        if isinstance(fan_out, bool) or not isinstance(fan_out, int) or fan_out < 1:
            raise MeshError(f"fan_out must be an int >= 1, got {fan_out!r}")
        self.fan_out = fan_out
        self.version = 0
        self._next_id = CONTROLLER_ID + 1
        root = _Entry(CONTROLLER_ID, controller_address, NO_PARENT, 0)
        self._nodes: dict[int, _Entry] = {CONTROLLER_ID: root}
        # Lazy heaps (stale entries are skipped when they surface):
        #   _open:  (depth, id)              -> where add_node / remap place a node
        #   _light: (n_children, depth, id)  -> who adopts the children of a removed node
        self._open: list[tuple[int, int]] = []
        self._light: list[tuple[int, int, int]] = []
        self._touch(CONTROLLER_ID)

    # ------------------------------------------------------------------ queries
    def __contains__(self, node_id: object) -> bool:
        return node_id in self._nodes and node_id != CONTROLLER_ID

    def __len__(self) -> int:
        """Number of nodes, not counting the controller."""
        return len(self._nodes) - 1

    def _entry(self, node_id: int) -> _Entry:
        try:
            return self._nodes[node_id]
        except (KeyError, TypeError):
            raise UnknownNodeError(f"node {node_id!r} is not in the mesh (version {self.version})") from None

    def place(self, node_id: int) -> Place:
        e = self._entry(node_id)
        return Place(e.node_id, e.parent, tuple(e.children), e.depth)

    def places(self) -> dict[int, Place]:
        """Every place, the controller's included, in breadth-first order."""
        return {nid: self.place(nid) for nid in self._bfs()}

    def parent(self, node_id: int) -> int:
        return self._entry(node_id).parent

    def children(self, node_id: int) -> tuple[int, ...]:
        return tuple(self._entry(node_id).children)

    def below(self, node_id: int, ancestor: int) -> bool:
        """Is ``node_id`` in the subtree of member ``ancestor`` (a node, not the controller)?"""
        parent = self.parent(node_id)
        while parent > CONTROLLER_ID:
            if parent == ancestor:
                return True
            parent = self.parent(parent)
        return False

    def neighbours(self, node_id: int) -> tuple[int, ...]:
        """Parent first (absent for the root), then the children in order."""
        e = self._entry(node_id)
        head = () if e.parent == NO_PARENT else (e.parent,)
        return head + tuple(e.children)

    def relay_targets(self, node_id: int, came_from: int | None = None) -> tuple[int, ...]:
        """Where ``node_id`` forwards an update that reached it from ``came_from`` (never back there).

        ``came_from=None`` means the update originated at ``node_id`` itself. An update the controller
        sent straight to a node it is not the parent of (a copy for a member under a new parent, see
        new_branches.py) goes only down: the controller holds it, and so does everything above.
        """
        if came_from == CONTROLLER_ID and node_id != CONTROLLER_ID and self.parent(node_id) != CONTROLLER_ID:
            return tuple(self._entry(node_id).children)
        return tuple(n for n in self.neighbours(node_id) if n != came_from)

    def address(self, node_id: int) -> str:
        return self._entry(node_id).address

    def set_address(self, node_id: int, address: str) -> None:
        """Record a new address (a restarted node); bumps the version when it changed."""
        e = self._entry(node_id)
        if e.address != address:
            e.address = str(address)
            self.version += 1

    def node_ids(self) -> list[int]:
        """Every node id (controller excluded), ascending."""
        return sorted(n for n in self._nodes if n != CONTROLLER_ID)

    def depth(self) -> int:
        """Depth of the deepest node (0 when only the controller is there)."""
        return max(e.depth for e in self._nodes.values())

    def allocate_id(self) -> int:
        """A fresh node id, never handed out before by this organizer (nor any id it has seen)."""
        nid = self._next_id
        self._next_id += 1
        return nid

    # ------------------------------------------------------------------ changes
    def add_node(self, node_id: int, address: str) -> Place:
        """Place a new node; a node id already present only gets its address updated (a re-sent join)."""
        _check_node_id(node_id)
        if node_id in self._nodes:
            self.set_address(node_id, address)
            return self.place(node_id)
        parent = self._best_open_parent()
        self._nodes[node_id] = _Entry(node_id, str(address), NO_PARENT, 0)
        self._attach(node_id, parent)
        self._next_id = max(self._next_id, node_id + 1)
        self.version += 1
        return self.place(node_id)

    def remove_node(self, node_id: int) -> list[int]:
        """Remove a node; returns the ids whose parent changed (its former children), in order.

        Removing a node that is not in the mesh is a no-op returning ``[]`` (a leave and an
        expiry may both report the same node). Removing the controller is a MeshError.
        """
        if node_id == CONTROLLER_ID:
            raise MeshError("the controller (id 0) cannot be removed from its own mesh")
        if node_id not in self._nodes:
            return []
        gone = self._nodes[node_id]
        self._detach(node_id)
        orphans = list(gone.children)
        for child in orphans:
            self._nodes[child].parent = NO_PARENT
        del self._nodes[node_id]
        for child in orphans:
            adopter = self._best_adopter()
            self._attach(child, adopter)
        self.version += 1
        return orphans

    def remap(self, node_id: int) -> Place:
        """Re-place a node (and its subtree) by the add rule; bumps the version only if it moved."""
        e = self._entry(node_id)
        if node_id == CONTROLLER_ID:
            raise MeshError("the controller (id 0) is the root and cannot be remapped")
        old_parent = e.parent
        old_index = self._nodes[old_parent].children.index(node_id)
        self._detach(node_id)
        e.parent = NO_PARENT
        new_parent = self._best_open_parent()
        if new_parent == old_parent:  # nowhere better: put it back exactly where it was
            self._nodes[old_parent].children.insert(old_index, node_id)
            e.parent = old_parent
            self._touch(old_parent)
            return self.place(node_id)
        self._attach(node_id, new_parent)
        self.version += 1
        return self.place(node_id)

    # ------------------------------------------------------------------ internals
    def _has_room(self, e: _Entry) -> bool:
        if self.mode is MeshMode.PLAIN:
            return e.node_id == CONTROLLER_ID
        return len(e.children) < self.fan_out

    def _touch(self, node_id: int) -> None:
        """Push the node's current keys onto both heaps (old entries go stale)."""
        e = self._nodes[node_id]
        if self.mode is MeshMode.PLAIN:
            return
        if self._has_room(e):
            heapq.heappush(self._open, (e.depth, node_id))
            heapq.heappush(self._light, (len(e.children), e.depth, node_id))
        limit = 4 * len(self._nodes) + 64
        if len(self._open) > limit or len(self._light) > limit:
            self._rebuild_heaps()

    def _rebuild_heaps(self) -> None:
        roomy = [e for e in self._nodes.values() if self._has_room(e)]
        self._open = [(e.depth, e.node_id) for e in roomy]
        self._light = [(len(e.children), e.depth, e.node_id) for e in roomy]
        heapq.heapify(self._open)
        heapq.heapify(self._light)

    def _attached(self, node_id: int) -> bool:
        """True when walking up from node_id reaches the root (not a subtree being moved)."""
        seen = 0
        while node_id != CONTROLLER_ID:
            node_id = self._nodes[node_id].parent
            if node_id == NO_PARENT:
                return False
            seen += 1
            if seen > len(self._nodes):
                raise MeshError("cycle in the mesh")
        return True

    def _pick(self, heap: list, valid) -> int:
        set_aside = []
        try:
            while heap:
                key = heap[0]
                nid = key[-1]
                e = self._nodes.get(nid)
                if e is None or not valid(key, e) or not self._has_room(e):
                    heapq.heappop(heap)  # stale
                    continue
                if not self._attached(nid):
                    set_aside.append(heapq.heappop(heap))
                    continue
                return nid
        finally:
            for key in set_aside:
                heapq.heappush(heap, key)
        raise MeshError(f"no node has room for another child (fan_out {self.fan_out}, {len(self)} nodes)")

    def _best_open_parent(self) -> int:
        if self.mode is MeshMode.PLAIN:
            return CONTROLLER_ID
        return self._pick(self._open, lambda key, e: key[0] == e.depth)

    def _best_adopter(self) -> int:
        if self.mode is MeshMode.PLAIN:
            return CONTROLLER_ID
        return self._pick(self._light, lambda key, e: key[0] == len(e.children) and key[1] == e.depth)

    def _detach(self, node_id: int) -> None:
        e = self._nodes[node_id]
        if e.parent != NO_PARENT:
            self._nodes[e.parent].children.remove(node_id)
            self._touch(e.parent)

    def _attach(self, node_id: int, parent: int) -> None:
        """Make node_id (with its subtree) a child of parent and fix the subtree's depths."""
        p = self._nodes[parent]
        p.children.append(node_id)
        e = self._nodes[node_id]
        e.parent = parent
        self._touch(parent)
        queue = deque([(node_id, p.depth + 1)])
        while queue:
            nid, depth = queue.popleft()
            n = self._nodes[nid]
            if n.depth != depth:
                n.depth = depth
                self._touch(nid)
            elif nid == node_id:
                self._touch(nid)
            queue.extend((c, depth + 1) for c in n.children)

    def _bfs(self) -> list[int]:
        order = [CONTROLLER_ID]
        i = 0
        while i < len(order):
            order.extend(self._nodes[order[i]].children)
            i += 1
        return order

    # ------------------------------------------------------------------ checks + serialization
    def validate(self) -> None:
        """Raise MeshError unless the mesh is one whole tree rooted at the controller, fan-out respected."""
        root = self._nodes.get(CONTROLLER_ID)
        if root is None or root.parent != NO_PARENT or root.depth != 0:
            raise MeshError("the controller is missing or is not the root")
        seen = {CONTROLLER_ID}
        queue = deque([CONTROLLER_ID])
        while queue:
            nid = queue.popleft()
            e = self._nodes[nid]
            if self.mode is MeshMode.MESH and len(e.children) > self.fan_out:
                raise MeshError(f"node {nid} has {len(e.children)} children, fan_out is {self.fan_out}")
            if self.mode is MeshMode.PLAIN and nid != CONTROLLER_ID and e.children:
                raise MeshError(f"PLAIN mesh: node {nid} has children {e.children}")
            for c in e.children:
                if c in seen:
                    raise MeshError(f"node {c} is reached twice (cycle or shared child), via {nid}")
                child = self._nodes.get(c)
                if child is None:
                    raise MeshError(f"node {nid} lists unknown child {c}")
                if child.parent != nid:
                    raise MeshError(f"node {c} is a child of {nid} but names {child.parent} as parent")
                if child.depth != e.depth + 1:
                    raise MeshError(f"node {c} has depth {child.depth}, expected {e.depth + 1}")
                seen.add(c)
                queue.append(c)
        unreachable = sorted(set(self._nodes) - seen)
        if unreachable:
            raise MeshError(f"nodes not reachable from the controller: {unreachable[:20]}")

    def to_dict(self) -> dict:
        """A msgpack/JSON-able snapshot: nodes in breadth-first order as [id, parent, address, children]."""
        return {
            "format": _FORMAT,
            "mode": self.mode.value,
            "fan_out": self.fan_out,
            "version": self.version,
            "next_id": self._next_id,
            "nodes": [
                [nid, e.parent, e.address, list(e.children)]
                for nid in self._bfs()
                for e in (self._nodes[nid],)
            ],
        }

    @classmethod
    def from_dict(cls, d: dict) -> MeshOrganizer:
        """Rebuild an organizer from ``to_dict`` output; anything inconsistent is a MeshError."""
        if not isinstance(d, dict):
            raise MeshError(f"mesh snapshot must be a dict, got {type(d).__name__}")
        if d.get("format") != _FORMAT:
            raise MeshError(f"mesh snapshot format must be {_FORMAT}, got {d.get('format')!r}")
        try:
            mesh = cls(d["mode"], d["fan_out"])
            version, next_id, rows = d["version"], d["next_id"], d["nodes"]
        except KeyError as exc:
            raise MeshError(f"mesh snapshot lacks the field {exc.args[0]!r}") from None
        if not isinstance(version, int) or version < 0 or not isinstance(next_id, int):
            raise MeshError(f"bad version/next_id in mesh snapshot: {version!r}, {next_id!r}")
        if not isinstance(rows, list | tuple) or not rows:
            raise MeshError("mesh snapshot has no node list")
        mesh._nodes = {}
        for row in rows:
            if not (isinstance(row, list | tuple) and len(row) == 4):
                raise MeshError(f"mesh snapshot row must be [id, parent, address, children], got {row!r}")
            nid, parent, address, children = row
            if nid != CONTROLLER_ID:
                _check_node_id(nid)
            if nid in mesh._nodes:
                raise MeshError(f"node {nid} appears twice in the mesh snapshot")
            if not isinstance(parent, int) or not isinstance(address, str):
                raise MeshError(f"bad parent/address in mesh snapshot row {row!r}")
            if not isinstance(children, list | tuple) or not all(isinstance(c, int) for c in children):
                raise MeshError(f"bad children list in mesh snapshot row {row!r}")
            e = _Entry(nid, address, parent, 0)
            e.children = list(children)
            mesh._nodes[nid] = e
        if CONTROLLER_ID not in mesh._nodes:
            raise MeshError("mesh snapshot lacks the controller (id 0)")
        for nid in mesh._bfs_checked():
            e = mesh._nodes[nid]
            if nid != CONTROLLER_ID:
                e.depth = mesh._nodes[e.parent].depth + 1
        mesh.validate()
        mesh.version = version
        mesh._next_id = max(next_id, max(mesh._nodes) + 1)
        mesh._rebuild_heaps()
        return mesh

    def _bfs_checked(self) -> list[int]:
        """Breadth-first order that tolerates (and reports) broken snapshots instead of looping."""
        order = [CONTROLLER_ID]
        seen = {CONTROLLER_ID}
        i = 0
        while i < len(order):
            for c in self._nodes[order[i]].children:
                if c in seen or c not in self._nodes or self._nodes[c].parent != order[i]:
                    raise MeshError(f"mesh snapshot: bad child {c} of node {order[i]}")
                seen.add(c)
                order.append(c)
            i += 1
        return order

    def __repr__(self) -> str:
        return (
            f"MeshOrganizer(mode={self.mode.value!r}, fan_out={self.fan_out}, nodes={len(self)}, "
            f"version={self.version})"
        )
