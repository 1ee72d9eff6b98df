"""The simulated network: processes, their connections, and links with bounded queues and faults.

A process has a routing id (what its outgoing connections present to a ROUTER) and an address.
``Connect(peer, address)`` records an outgoing connection; ``Send(to)`` travels on it and arrives
on the receiver's ROUTER as ``Received(message, routing_id=<sender's routing id>)``;
``Reply(routing_id)`` travels back to the process whose connection has that routing id and arrives
as ``Received(message, routing_id=None, via=<the peer id that process connected the replier as>)``.

Every message goes through the real wire code: ``encode_frames`` (chunked by ``split_message``
above ``chunk_bytes``) on the way out, ``decode_frames`` with the catalogue's checks and the
``Reassembler`` on the way in, exactly as the I/O loop does; a frame that fails them is a counted
rejection by reason, never an event. Links are FIFO (unless a reorder fault lets one message
overtake), have a latency and a per-message service time, and hold at most ``bound`` messages not
yet handled by the receiver (a frozen receiver keeps them): a droppable ``Send`` over the bound is
dropped and reported back as ``Dropped``, a reply over the bound is lost (a ROUTER at its HWM).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from psrv.transport.chunking import Reassembler, needs_chunking, split_message
from psrv.transport.codec import as_buffer, decode_frames, decode_header, encode_frames
from psrv.transport.errors import FrameRejectedError
from psrv.transport.events import ChunkArrived, Dropped, Event, Machine, Received
from psrv.transport.messages import Message, Op

from sim.faults import FaultCounts, Faults
from sim.scheduler import Scheduler


class Role(Protocol):
    """A machine plus what the harness needs to look at it (a replica, a member id, readiness)."""

    machine: Machine

    def replica(self) -> np.ndarray: ...

    def member_id(self) -> int | None: ...

    def ready(self) -> bool: ...

    def submit(self, payload: np.ndarray) -> list[Event] | None: ...


@dataclass(eq=False)
class Process:
    """One simulated OS process running one machine (one incarnation: a restart is a new Process)."""

    name: str
    kind: str  # "controller", "node" or "hostile"
    slot: int
    routing_id: bytes
    address: str
    role: Any = None
    alive: bool = True
    stopped: bool = False
    stop_error: BaseException | None = None
    frozen_until: float = 0.0
    held: list[Event] = field(default_factory=list)
    clock_offset: float = 0.0
    # peer member id -> (address, routing id it presents, whether replies are read on it)
    connections: dict[int, tuple[str, bytes, bool]] = field(default_factory=dict)
    reassembler: Reassembler | None = None
    ids: list[int] = field(default_factory=list)  # member ids it held, in order
    rejected: Counter = field(default_factory=Counter)
    last_now: float = 0.0
    leaving: bool = False

    @property
    def live(self) -> bool:
        return self.alive and not self.stopped


@dataclass
class LinkState:
    free_at: float = 0.0  # when the link has sent everything queued on it
    last_arrival: float = 0.0  # FIFO: nothing arrives before what was sent earlier
    in_flight: int = 0  # sent, not yet handled by the receiver


class BudgetExceeded(Exception):
    """A run exceeded a deterministic traffic budget (a scaling limit of the protocol): it stops there."""


def _chunk_event(src: int, routing_id: bytes | None, via: Any) -> ChunkArrived:
    try:  # the vocabulary's newer ChunkArrived also says which connection the piece came on
        return ChunkArrived(src, routing_id=routing_id, via=via)
    except TypeError:
        return ChunkArrived(src)


class Network:
    """Links between processes; ``deliver`` is the world's callback that hands an event to a machine."""

    def __init__(
        self,
        sched: Scheduler,
        faults: Faults,
        counts: FaultCounts,
        deliver: Any,
        *,
        bound: int = 64,
        latency_s: tuple[float, float] = (0.0002, 0.002),
        service_s: float = 0.00005,
        chunk_bytes: int = 16 * 1024 * 1024,
        max_message_bytes: int = 64 * 1024 * 1024,
        max_header_bytes: int = 4 * 1024 * 1024,
    ) -> None:
        self.sched = sched
        self.faults = faults
        self.counts = counts
        self._deliver = deliver
        self.bound = bound
        self.latency_s = latency_s
        self.service_s = service_s
        self.chunk_bytes = chunk_bytes
        self.max_message_bytes = max_message_bytes
        self.max_header_bytes = max_header_bytes
        self.reassembly_bytes = 1024 * 1024
        self.max_mesh_per_process: int | None = None  # a traffic budget (see BudgetExceeded)
        self.mesh_received: Counter = Counter()
        self.by_address: dict[str, Process] = {}
        self.by_routing: dict[bytes, Process] = {}
        self.links: dict[tuple[str, str, str], LinkState] = {}
        self.cut: set[tuple[str, str]] = set()  # (a, b) and (b, a) of every partitioned pair
        # a scenario's targeted loss: every message sent (sender, receiver, message) it accepts is lost
        self.drop_if: Callable[[Process, Process, Message], bool] | None = None
        # a scenario's slow link: seconds a message sent (sender, receiver, message) waits on top of the
        # latency (later frames on that link queue behind it, as on a slow link)
        self.delay_if: Callable[[Process, Process, Message], float] | None = None
        self.codec_errors: list[str] = []  # a decode that raised something else than FrameRejectedError
        self._msg_ids = itertools.count(1)

    # ------------------------------------------------------------------ processes
    def attach(self, proc: Process) -> None:
        self.by_address[proc.address] = proc
        self.by_routing[proc.routing_id] = proc
        proc.reassembler = Reassembler(  # the loop sizes its budget from the model: small here
            self.reassembly_bytes, 30.0, clock=lambda p=proc: self.sched.now + p.clock_offset
        )

    def detach(self, proc: Process) -> None:
        if self.by_address.get(proc.address) is proc:
            del self.by_address[proc.address]
        if self.by_routing.get(proc.routing_id) is proc:
            del self.by_routing[proc.routing_id]

    def is_cut(self, a: Process, b: Process) -> bool:
        return (a.name, b.name) in self.cut

    # ------------------------------------------------------------------ sending
    def frames_of(self, message: Message, chunk_bytes: int | None = None) -> list[list[bytes]]:
        """The frames of a message as the loop would send them (copied: no buffer is shared)."""
        size = chunk_bytes or self.chunk_bytes
        parts = (
            split_message(message, size, next(self._msg_ids)) if needs_chunking(message, size) else [message]
        )
        out = []
        for part in parts:
            out.append([f if type(f) is bytes else bytes(as_buffer(f)) for f in encode_frames(part)])
        return out

    def connect(
        self, proc: Process, peer: int, address: str, routing_id: bytes | None, listen: bool = True
    ) -> None:
        rid = routing_id or proc.routing_id
        proc.connections[peer] = (address, rid, listen)
        owner = self.by_routing.get(rid)
        if owner is None or not owner.live:
            self.by_routing[rid] = proc

    def send(
        self,
        sender: Process,
        to: int,
        message: Message,
        droppable: bool,
        count: int,
        chunk_bytes: int | None = None,
    ) -> bool:
        """False when it went nowhere (no connection, receiver gone, queue full and droppable)."""
        conn = sender.connections.get(to)
        if conn is None:
            self.counts.counts["send_without_connection"] += 1
            return False
        receiver = self.by_address.get(conn[0])
        if receiver is None:
            self.counts.counts["sent_to_gone"] += 1
            return False
        if self.drop_if is not None and self.drop_if(sender, receiver, message):
            self.counts.counts["lost_on_purpose"] += 1
            return True  # it left the sender: lost on the way
        link = self._link(sender, receiver, "data")
        if droppable and link.in_flight >= self.bound:
            self.counts.counts["dropped_queue_full"] += 1
            self.sched.after(0.0, self._deliver, sender, Dropped(to, count))
            return False
        delay = self.delay_if(sender, receiver, message) if self.delay_if is not None else 0.0
        if delay:
            self.counts.counts["delayed_on_purpose"] += 1
        for frames in self.frames_of(message, chunk_bytes):
            self.transmit(sender, receiver, frames, "data", None, conn[1], delay_s=delay)
        return True

    def reply(self, sender: Process, routing_id: bytes, message: Message) -> None:
        receiver = self.by_routing.get(routing_id)
        if receiver is None or not receiver.live:
            self.counts.counts["reply_unroutable"] += 1
            return
        via = next(
            (
                peer
                for peer, (a, rid, _) in receiver.connections.items()
                if a == sender.address and rid == routing_id
            ),
            None,
        )
        if via is None:  # the asker closed its connection: a ROUTER drops what it cannot route
            self.counts.counts["reply_unroutable"] += 1
            return
        if not receiver.connections[via][2]:  # nobody reads that connection
            self.counts.counts["reply_not_read"] += 1
            return
        link = self._link(sender, receiver, "reply")
        if link.in_flight >= self.bound:
            self.counts.counts["reply_dropped_hwm"] += 1
            return
        for frames in self.frames_of(message):
            self.transmit(sender, receiver, frames, "reply", via)

    def transmit(
        self,
        sender: Process,
        receiver: Process,
        frames: list[bytes],
        channel: str,
        via: Any,
        routing_id: bytes | None = None,
        delay_s: float = 0.0,
    ) -> None:
        """Put raw frames on the link sender -> receiver (faults decide their fate); ``delay_s`` more
        than the latency on top (a slow link)."""
        sched, faults, counts = self.sched, self.faults, self.counts.counts
        if self.is_cut(sender, receiver):
            counts["lost_partition"] += 1
            return
        rng = sched.rng
        if faults.loss and rng.random() < faults.loss:
            counts["lost"] += 1
            return
        copies = 1
        if faults.duplicate and rng.random() < faults.duplicate:
            counts["duplicated"] += 1
            copies = 2
        link = self._link(sender, receiver, channel)
        for _ in range(copies):
            start = max(sched.now, link.free_at)
            link.free_at = start + self.service_s
            arrival = link.free_at + rng.uniform(*self.latency_s) + delay_s
            if faults.jitter_s:
                arrival += rng.uniform(0.0, faults.jitter_s)
            if faults.reorder and rng.random() < faults.reorder:
                counts["reordered"] += 1  # may overtake what is queued before it
            else:
                arrival = max(arrival, link.last_arrival)
                link.last_arrival = arrival
            link.in_flight += 1
            sched.at(arrival, self._arrive, sender, receiver, frames, channel, via, routing_id)

    def _link(self, sender: Process, receiver: Process, channel: str) -> LinkState:
        key = (sender.name, receiver.name, channel)
        link = self.links.get(key)
        if link is None:
            link = self.links[key] = LinkState()
        return link

    # ------------------------------------------------------------------ receiving
    def _arrive(
        self,
        sender: Process,
        receiver: Process,
        frames: list[bytes],
        channel: str,
        via: Any,
        routing_id: bytes | None,
    ) -> None:
        link = self._link(sender, receiver, channel)
        if not receiver.live:
            link.in_flight -= 1
            self.counts.counts["lost_receiver_gone"] += 1
            return
        if self.is_cut(sender, receiver):
            link.in_flight -= 1
            self.counts.counts["lost_partition"] += 1
            return
        if channel == "reply":
            routing_id = None
        elif routing_id is None:
            routing_id = sender.routing_id
        if receiver.frozen_until > self.sched.now:  # its socket buffers hold it; the link stays busy
            receiver.held.append(("frames", link, frames, routing_id, via))
            return
        link.in_flight -= 1
        self.receive(receiver, frames, routing_id, via)

    def receive(self, receiver: Process, frames: list[bytes], routing_id: bytes | None, via: Any) -> None:
        """What the loop does with one multipart message: decode, reassemble, hand over (or count)."""
        try:
            message = decode_frames(
                frames, max_message_bytes=self.max_message_bytes, max_header_bytes=self.max_header_bytes
            )
        except FrameRejectedError as exc:
            self.reject(receiver, exc.reason)
            return
        except Exception as exc:  # noqa: BLE001 - the codec promises FrameRejectedError; anything else is a bug
            self.reject(receiver, "handler_error")
            self.codec_errors.append(f"{receiver.name}: decode_frames raised {type(exc).__name__}: {exc}")
            return
        if message.op is Op.MESH and self.max_mesh_per_process is not None:
            self.mesh_received[receiver.name] += 1
            if self.mesh_received[receiver.name] > self.max_mesh_per_process:
                raise BudgetExceeded(
                    f"{receiver.name} received more than {self.max_mesh_per_process} MESH messages "
                    f"(t={self.sched.now:.3f}, {len(message['mesh'].get('nodes', ()))} nodes in the last one)"
                )
        if message.op is Op.CHUNK:
            key = (routing_id, via, message.src)
            try:
                done = receiver.reassembler.add(key, message)
                if done is not None:
                    inner, buffers = done
                    whole = decode_header(inner, list(buffers))
                    if whole.op is Op.CHUNK or whole.src != message.src:
                        raise FrameRejectedError("bad_chunk", "a chunk carries a chunk, or another sender's")
            except FrameRejectedError as exc:
                self.reject(receiver, exc.reason)
                return
            self._deliver(receiver, _chunk_event(message.src, routing_id, via))
            if done is None:
                return
            message = whole
        self._deliver(receiver, Received(message, routing_id, via))

    def thaw(self, proc: Process) -> None:
        """A frozen process wakes up: everything that arrived meanwhile is handled at once, in order."""
        held, proc.held = proc.held, []
        for item in held:
            if not proc.live:
                return
            if item[0] == "frames":
                _, link, frames, routing_id, via = item
                link.in_flight -= 1
                self.receive(proc, frames, routing_id, via)
            else:
                self._deliver(proc, item[1])

    def reject(self, receiver: Process, reason: str) -> None:
        receiver.rejected[reason] += 1
        self.counts.rejected[reason] += 1
