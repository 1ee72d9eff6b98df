"""Who a node believes: the routes the controller announced, which origins a neighbour may hand
it, and the bounded waiting rooms for messages that arrive before the mesh view that explains them.

Pure objects for ``NodeMachine`` (server/node_machine.py): no sockets, no clocks (``now`` is passed).

- ``Routes``: routing id -> member id of every sender the node accepts on its ROUTER (the controller
  and its neighbours, as the controller announced them); the previous announcement's are kept for
  the messages still in flight from it.
- ``origin_allowed``: may ``came_from`` hand this node an update of ``origin`` along the mesh?
- ``HeldQueue``: a bounded queue of items waiting for a newer view, each with a deadline. Two
  rooms use it: updates from a routing id not announced yet (a new neighbour may send before the
  controller's MESH reaches us) and update rows refused as ``bad_origin`` while this node's mesh
  view may be older than the sender's (a member joined or moved, our MESH is late). A newer view
  releases them (handled as if they had just arrived); at the deadline they are refused, counted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from psrv.server.mesh import CONTROLLER_ID, MeshOrganizer
from psrv.transport.errors import FrameRejectedError, TransportError
from psrv.transport.messages import Message
from psrv.transport.sockets import valid_address

T = TypeVar("T")

HELD_MAX = 1024  # items per waiting room
HELD_MIN_S = 2.0  # the least patience of a waiting room (else 4 heartbeats)


def parse_routes(routes: dict) -> dict[bytes, int]:
    """The catalogue-checked ``{node id: routing id hex}`` as ``{routing id: node id}``."""
    new = {bytes.fromhex(rid): int(node_id) for node_id, rid in routes.items()}
    if CONTROLLER_ID not in new.values():
        raise FrameRejectedError("bad_field", "routes lack the controller's routing id")
    return new


class Routes:
    """The senders a node accepts on its ROUTER, by routing id (current and previous announcement)."""

    def __init__(self) -> None:
        self.current: dict[bytes, int] = {}
        self.previous: dict[bytes, int] = {}

    def announce(self, routes: dict, *, fresh: bool = False) -> None:
        """A JOIN_REPLY (``fresh``: nothing earlier counts) or a MESH announced these routes."""
        new = parse_routes(routes)
        self.previous, self.current = ({} if fresh else self.current), new

    def sender(self, routing_id: bytes) -> int | None:
        sender = self.current.get(routing_id)
        return self.previous.get(routing_id) if sender is None else sender

    def clear(self) -> None:
        self.current, self.previous = {}, {}


def origin_allowed(
    mesh: MeshOrganizer | None, me: int, origin: int, came_from: int, departed: Iterable[int] = ()
) -> bool:
    """May ``came_from`` hand node ``me`` an update of ``origin``?

    Never our own (a forged one would be applied twice). A departed origin only while the
    controller still counts it (``departed``). From above (the controller, the parent, or a sender
    no longer in our view) anything of the mesh; from a child only its own subtree's updates."""
    if origin == me or mesh is None:
        return False
    if origin not in mesh:
        return origin in departed
    if came_from == CONTROLLER_ID or came_from not in mesh or came_from == mesh.parent(me):
        return True
    parent = origin
    while parent > CONTROLLER_ID:
        if parent == came_from:
            return True
        parent = mesh.parent(parent)
    return False


class HeldQueue(Generic[T]):
    """Items waiting (bounded, FIFO) for a newer view, each refused after ``patience_s``."""

    def __init__(self, limit: int = HELD_MAX) -> None:
        self.limit = limit
        self._items: deque[tuple[float, T]] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def hold(self, now: float, item: T) -> bool:
        """Keep ``item``; False when the room is full (the caller refuses it at once)."""
        if len(self._items) >= self.limit:
            return False
        self._items.append((now, item))
        return True

    def release(
        self, now: float, patience_s: float, ready: Callable[[T], bool]
    ) -> tuple[list[T], list[T]]:
        """``(ready, expired)``: the items ``ready`` accepts now, and those that waited too long."""
        go: list[T] = []
        expired: list[T] = []
        keep: deque[tuple[float, T]] = deque()
        for held_at, item in self._items:
            if ready(item):
                go.append(item)
            elif now - held_at > patience_s:
                expired.append(item)
            else:
                keep.append((held_at, item))
        self._items = keep
        return go, expired

    def clear(self) -> None:
        self._items.clear()


def patience_s(heartbeat_s: float) -> float:
    """How long a waiting room holds an item: a few beats, at least HELD_MIN_S."""
    return max(HELD_MIN_S, 4 * heartbeat_s)


def mesh_of(msg: Message) -> MeshOrganizer:
    """The mesh snapshot a JOIN_REPLY or MESH carries; one that does not parse is a rejected frame."""
    try:
        return MeshOrganizer.from_dict(msg["mesh"])
    except TransportError:
        raise
    except Exception as exc:  # noqa: BLE001 - a crafted snapshot is a rejected frame, never a crash
        raise FrameRejectedError("bad_field",
                                 f"{msg.op}: mesh snapshot does not parse: {exc!s:.200}") from None


def check_addresses(mesh: MeshOrganizer, node_id: int) -> None:
    """Every neighbour address this node would connect to is HOST:PORT."""
    bad = [mesh.address(n) for n in mesh.neighbours(node_id) if n != CONTROLLER_ID
           and not valid_address(mesh.address(n))]
    if bad:
        raise FrameRejectedError("bad_field",
                                 f"mesh v{mesh.version} names invalid addresses {bad[:4]!r:.200}")


__all__ = [
    "HELD_MAX", "HeldQueue", "Routes", "check_addresses", "mesh_of", "origin_allowed", "parse_routes",
    "patience_s",
]
