"""The vocabulary between the I/O loop (or the simulation) and the parameter-server roles in server/.

A role (``ControllerMachine``, ``NodeMachine``) is a state machine with no sockets, threads or
clocks: ``machine.handle(event, now) -> list[Action]``. ``now`` is a monotonic time in seconds
given by the driver; the machine never reads a clock. In production one I/O loop (``transport/loop.py``)
turns socket activity and API calls into events and carries the actions out; in tests a
deterministic simulation (``tests/sim/``) delivers the same events over a simulated network, so every
re-send, re-sync, eviction and rejoin rule runs without a socket and a failing seed replays exactly.

Peers are named by member id (``CONTROLLER_ID`` = 0, nodes > 0). A message that arrived on the
ROUTER also carries the sender's routing id (``Received.routing_id``): identity is bound to it at
join, and replies to a sender not bound to an id yet (a joining process, a ``psrv status`` asker)
go back by routing id (``Reply``). ``routing_id`` None means the message came back on one of this
process's own outgoing connections (``Received.via`` names whose): replies to what it asked.

Every field of every message a machine sees has passed the catalogue's checks (transport/messages.py);
a handler may still refuse one by raising ``FrameRejectedError`` (counted, logged, never fatal).
A machine stops by returning ``Stop(error)``; exceptions other than FrameRejectedError escaping
``handle`` are bugs (the simulation fails on them; the loop counts and logs them as
``handler_error``, it does not die of them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from psrv.transport.messages import Message

__all__ = [
    "Action", "Apply", "CheckDone", "CheckRequested", "ChunkArrived", "Connect", "Disconnect", "Download",
    "Dropped", "Event", "Install", "Machine", "Notify", "Ready", "Received", "ReleaseSlots", "Reply", "Send",
    "SendSubmitted", "Started", "Stop", "Stopping", "Submit", "Tick",
]

# ------------------------------------------------------------------------------------ events


@dataclass(frozen=True, slots=True)
class Started:
    """The driver bound its listening address; the machine may now say hello (a node joins)."""

    address: str


@dataclass(frozen=True, slots=True)
class Received:
    """One decoded, validated, reassembled message.

    ``routing_id``: the sender's routing id when it arrived on this process's ROUTER; None when it
    came back on an outgoing connection, then ``via`` is the member id that connection goes to."""

    message: Message
    routing_id: bytes | None = None
    via: int | None = None


@dataclass(frozen=True, slots=True)
class ChunkArrived:
    """A piece of a large message from ``src`` was stored (a download is moving). ``routing_id`` /
    ``via`` say which connection it came on, as for ``Received`` (``src`` is only what it claims)."""

    src: int
    routing_id: bytes | None = None
    via: int | None = None


@dataclass(frozen=True, slots=True)
class Tick:
    """Time passed: timers (beats, expiry, retries) run. Drivers tick at least every 50 ms."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """``count`` updates of a droppable ``Send`` to ``peer`` found its queue full and were dropped."""

    peer: int
    count: int


@dataclass(frozen=True, slots=True)
class Submit:
    """An own update the task thread hands over (checked, and applied locally already): the node
    numbers it and sends it, or keeps it in the backlog while (re)joining. ``slot``: it holds one of
    the submit queue's slots (given back with ``ReleaseSlots``); ``more``: another submit follows at
    once, so the machine may gather them into one batch and send them with the last one (a driver
    that hands over one at a time leaves it False)."""

    payload: Any
    fields: dict[str, Any] = field(default_factory=dict)
    slot: bool = True
    more: bool = False


@dataclass(frozen=True, slots=True)
class SendSubmitted:
    """Submits gathered (``more``) on the task thread are waiting: send them now."""


@dataclass(frozen=True, slots=True)
class CheckRequested:
    """The task thread asks for a snapshot of the master copy to check the replica against."""


@dataclass(frozen=True, slots=True)
class CheckDone:
    """The task thread has its replica check's verdict: forget the snapshot."""


@dataclass(frozen=True, slots=True)
class Stopping:
    """The role is asked to stop: say goodbye (LEAVE / SHUTDOWN); the driver flushes and closes."""


Event = (
    Started | Received | ChunkArrived | Tick | Dropped | Submit | SendSubmitted | CheckRequested | CheckDone
    | Stopping
)

# ----------------------------------------------------------------------------------- actions


@dataclass(frozen=True, slots=True)
class Send:
    """Send ``message`` to member ``to`` over this process's outgoing connection to it.

    ``droppable``: a relayed update, dropped (and reported back as ``Dropped``) when the peer's
    queue is full; ``urgent``: small and order-free (a beat), may jump the queue; ``token``: opaque,
    told when the frames reached the socket (the node's submit slots): the driver calls its
    ``sent()`` once, also when the message could not be sent (dropped, no connection, closed)."""

    to: int
    message: Message
    droppable: bool = False
    urgent: bool = False
    token: Any = None
    count: int = 1  # updates the message carries (for Dropped)


@dataclass(frozen=True, slots=True)
class Reply:
    """Send ``message`` back through this process's ROUTER to the connection ``routing_id``."""

    routing_id: bytes
    message: Message


@dataclass(frozen=True, slots=True)
class Connect:
    """Open (or keep) an outgoing connection to member ``peer`` at ``address``.

    ``routing_id``: what the receiver's ROUTER sees as this connection's identity (see
    server/identity.py; None: the driver's own default); ``listen``: also receive on it (the
    replies of the peer's ROUTER come back on it, as ``Received(via=peer)``). A connection to the
    same address with the same routing id is kept; anything else replaces it. ``watch_handshake``:
    a refused handshake (the peer runs with other security settings) stops the role at once with
    SecurityMismatchError, instead of leaving it to wait out its deadline."""

    peer: int
    address: str
    routing_id: bytes | None = None
    listen: bool = False
    watch_handshake: bool = False


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the outgoing connection to ``peer``; ``linger_s`` lets queued frames leave first."""

    peer: int
    linger_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Download:
    """Send a large ``message`` (a parameter download) to member ``to`` paced: in pieces, in turns
    with the other downloads, a backed-up connection one piece at a time behind what waits there.
    A new Download to the same member replaces the one in progress. ``token`` (optional, with a
    ``sent()`` method) is told once, when the last piece reached the socket or the download ended
    otherwise (replaced, disconnected, stopped)."""

    to: int
    message: Message
    token: Any = None


@dataclass(frozen=True, slots=True)
class Ready:
    """The role can be used now (a controller once listening, a node once caught up): its start()
    returns. A driver ignores repeats."""


@dataclass(frozen=True, slots=True)
class Stop:
    """The machine is done: ``error`` None for a clean stop, else what stopped it (surfaced to callers)."""

    error: BaseException | None = None


@dataclass(frozen=True, slots=True)
class ReleaseSlots:
    """Give ``count`` slots of the submit queue back (own updates that were sent, dropped with a stale
    membership, or kept in the backlog). Carried out by the role's facade; never reaches the loop."""

    count: int


@dataclass(frozen=True, slots=True)
class Notify:
    """Wake the role's callers waiting on a change: ``what`` is "ready" (caught up), "acknowledged"
    (the controller's watermark of our updates moved) or "stopped". Carried out by the facade."""

    what: str


@dataclass(frozen=True, slots=True)
class Apply:
    """Add these updates to the live parameters where they live (a GPU, a simulation's recorder):
    emitted instead of decoding into ``params`` by a machine built with ``params_outside=True``.
    Every payload passed the whole-message check at intake, so carrying it out cannot fail on the
    message's account. ``headers[i]`` are the fields of ``payloads[i]`` (empty for an own update).
    Carried out by the role's facade under its lock, in order, before the loop sees the rest."""

    payloads: tuple[Any, ...]
    headers: tuple[dict[str, Any], ...]


@dataclass(frozen=True, slots=True)
class Install:
    """A download replaced the machine's host copy ``params``: put it where the live parameters are
    (``params_outside=True`` only). Carried out like ``Apply``, before the replays that follow it."""

    params: Any


Action = (
    Send | Reply | Connect | Disconnect | Download | Ready | Stop | ReleaseSlots | Notify | Apply | Install
)


class Machine(Protocol):
    """What the I/O loop and the simulation drive."""

    def handle(self, event: Event, now: float) -> list[Action]: ...
