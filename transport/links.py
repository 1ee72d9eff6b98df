"""The outgoing side of the I/O loop: one DEALER per member, each with a bounded overflow queue,
never blocking (peer.py states the back-pressure policy), and the paced downloads (pacing.py).

Only the loop thread uses a ``Links``; the poller is the loop's (a socket with frames waiting is
watched for POLLOUT, one the machine listens on for POLLIN).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable
from typing import Any

import zmq
from psrv.transport.chunking import ChunkPlan, needs_chunking, split_message
from psrv.transport.codec import encode_frames, frame_size
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters
from psrv.transport.errors import SecurityMismatchError, TransportConfigError
from psrv.transport.events import Connect, Download, Dropped, Send
from psrv.transport.handshake import HandshakeWatch
from psrv.transport.loopstats import LoopStats
from psrv.transport.messages import Message, Op
from psrv.transport.pacing import DOWNLOAD_CHUNK_MAX_BYTES, DOWNLOAD_TURN_BYTES, Paced, PacedDownloads
from psrv.transport.peer import Peer
from psrv.transport.sockets import Security, connect_dealer, tcp, valid_address

__all__ = ["ZERO_COPY_MIN_BYTES", "Links"]

ZERO_COPY_MIN_BYTES = 128 * 1024  # measured with pyzmq 27: copying wins below, zero-copy above


class Links:
    """Connections to members by id; see the module docstring. ``reject(reason, detail)`` counts a
    connection the machine asked for that cannot be made (an address that came over the wire)."""

    def __init__(
        self,
        config: TransportConfig,
        counters: Counters,
        stats: LoopStats,
        poller: zmq.Poller,
        reject: Callable[[str, str], None],
        routing_id: bytes,
    ) -> None:
        self.config = config
        self.counters = counters
        self.stats = stats
        self.poller = poller
        self.reject = reject
        self.routing_id = routing_id  # what a DEALER presents when the machine names none
        self.ctx: zmq.Context | None = None
        self.security: Security | None = None
        self.peers: dict[int, Peer] = {}
        self.routing: dict[int, bytes] = {}  # member -> the routing id its connection presents
        self.listening: dict[zmq.Socket, int] = {}  # DEALERs also read: socket -> member id
        self.waiting: dict[zmq.Socket, Peer] = {}  # sockets with frames waiting (POLLOUT watched)
        self.downloads = PacedDownloads()
        self.download_chunk = min(config.chunk_bytes, DOWNLOAD_CHUNK_MAX_BYTES)
        self.msg_ids = itertools.count(1)
        self.handshakes: dict[int, HandshakeWatch] = {}  # connections whose handshake is watched

    # ------------------------------------------------------------------ sending
    def frames(self, message: Message) -> list[list[Any]]:
        """The frames of a message, in chunks when its buffers exceed ``chunk_bytes``."""
        if needs_chunking(message, self.config.chunk_bytes):
            parts = split_message(message, self.config.chunk_bytes, next(self.msg_ids))
            return [encode_frames(part) for part in parts]
        return [encode_frames(message)]

    def send(self, action: Send, frames: list[list[Any]] | None) -> Dropped | None:
        """Carry out a ``Send`` (``frames``: its message encoded, when already done); a droppable
        one that finds the member's overflow queue full is dropped and reported back."""
        peer = self.peers.get(action.to)
        token = action.token
        if peer is None:
            self.counters.add("sends_unconnected")
            if token is not None:
                token.sent()
            return None
        if action.droppable and len(peer.pending) >= self.config.peer_queue_messages:
            peer.dropped += 1
            if token is not None:
                token.sent()
            return Dropped(action.to, action.count)
        if frames is None:
            frames = self.frames(action.message)
        if action.message.op is Op.HEARTBEAT:
            self.counters.add("heartbeat_bytes_out", sum(frame_size(f) for batch in frames for f in batch))
        self.post(peer, frames, token=token, urgent=action.urgent)
        return None

    def try_send(self, sock: zmq.Socket, frames: list[Any]) -> bool:
        nbytes = sum(frame_size(f) for f in frames)
        try:  # zero-copy pays for its bookkeeping only on large frames; small ones are cheaper copied
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=nbytes < ZERO_COPY_MIN_BYTES)
        except zmq.Again:
            return False
        values = self.counters._values  # noqa: SLF001 - the hot path; the loop thread is the only writer
        values["frames_out"] += 1
        values["bytes_out"] += nbytes
        return True

    def post(self, peer: Peer, batches: list[list[Any]], *, token: Any = None, urgent: bool = False) -> None:
        """Hand frames to a peer's socket without blocking, queueing in ``peer.pending`` when it is
        full. An ``urgent`` message (a beat: small, order-free) that must wait goes to the head of
        that queue, not behind the data."""
        if urgent and peer.pending and len(batches) == 1:
            peer.pending.appendleft((batches[0], token))
            self.watch(peer, True)
            return
        start = 0
        if not peer.pending:
            while start < len(batches) and self.try_send(peer.socket, batches[start]):
                start += 1
            if start == len(batches):
                if token is not None:
                    token.sent()
                return
        last = len(batches) - 1
        for i in range(start, len(batches)):
            peer.pending.append((batches[i], token if i == last else None))
        self.stats.queue_depth(len(peer.pending))
        self.watch(peer, True)

    def flush(self, peer: Peer) -> None:
        while peer.pending:
            frames, token = peer.pending[0]
            if not self.try_send(peer.socket, frames):
                return
            peer.pending.popleft()
            if token is not None:
                token.sent()
        self.watch(peer, False)

    def flush_writable(self, events: dict) -> None:
        for sock, peer in list(self.waiting.items()):
            if events.get(sock, 0) & zmq.POLLOUT:
                self.flush(peer)

    def flush_all(self, timeout_s: float) -> None:
        """At stop: give queued frames up to ``timeout_s`` to reach their sockets."""
        deadline = time.monotonic() + timeout_s
        while self.waiting and time.monotonic() < deadline:
            self.flush_writable(dict(self.poller.poll(20)))

    def watch(self, peer: Peer, on: bool) -> None:
        sock = peer.socket
        flags = (zmq.POLLIN if sock in self.listening else 0) | (zmq.POLLOUT if on else 0)
        if on:
            self.waiting[sock] = peer
        else:
            self.waiting.pop(sock, None)
        if flags:
            self.poller.register(sock, flags)
        else:
            with contextlib.suppress(KeyError):
                self.poller.unregister(sock)

    def deepest(self) -> int:
        """The longest overflow queue (messages waiting for a full socket)."""
        return max((len(p.pending) for p in self.waiting.values()), default=0)

    # ------------------------------------------------------------------ downloads
    def start_download(self, action: Download) -> None:
        if action.to not in self.peers:
            self.counters.add("sends_unconnected")
            if action.token is not None:
                action.token.sent()
            return
        plan = ChunkPlan(action.message, self.download_chunk, next(self.msg_ids))
        self.downloads.start(action.to, plan, action.token)

    def serve_downloads(self) -> None:
        """Hand each active download its next piece, in turns, at most DOWNLOAD_TURN_BYTES per loop
        iteration. A member whose connection is backed up gets one piece at a time in its overflow
        queue, behind the relays already there: the download waits its turn, never starves."""
        budget = DOWNLOAD_TURN_BYTES
        progressed = True
        downloads = self.downloads
        while budget > 0 and downloads and progressed:
            progressed = False
            for paced in downloads.next_turns():
                peer = self.peers.get(paced.peer)
                if peer is None:
                    downloads.end(paced.peer)
                    continue
                if paced.queued:  # its previous piece still waits behind the relays
                    continue
                part = paced.plan.part(paced.next_index)
                self.send_piece(peer, paced, part)
                paced.next_index += 1
                budget -= frame_size(part.buffers[0])
                progressed = True
                if paced.done:
                    downloads.end(paced.peer)
                if budget <= 0:
                    break

    def send_piece(self, peer: Peer, paced: Paced, part: Message) -> None:
        """One piece to the member's socket, or queued behind what waits there (then the download
        waits until it reached the socket)."""
        frames = encode_frames(part)
        if peer.pending or not self.try_send(peer.socket, frames):
            paced.queued = True
            self.post(peer, [frames], token=paced)

    # ------------------------------------------------------------------ connections
    def connect(self, action: Connect) -> None:
        """Open (or keep) the DEALER to a member; an address that cannot work is a counted rejection."""
        routing_id = action.routing_id if action.routing_id is not None else self.routing_id
        old = self.peers.get(action.peer)
        if old is not None:
            if old.address == action.address and self.routing.get(action.peer) == routing_id:
                if action.listen:
                    self.listen(old)
                return
            self.disconnect(action.peer, self.config.linger_s)
        if not valid_address(action.address):
            self.reject("bad_field", f"cannot connect to {action.address!r:.80}: not HOST:PORT")
            return
        cfg = self.config
        try:
            sock = connect_dealer(
                self.ctx,
                self.security,
                action.address,
                hwm=cfg.peer_queue_messages,
                max_message_bytes=cfg.max_message_bytes,
                buffer_bytes=cfg.socket_buffer_bytes,
                routing_id=routing_id,
                connect=not action.watch_handshake,
            )
            if action.watch_handshake:  # the monitor first, so the very first handshake is seen
                self.handshakes[action.peer] = HandshakeWatch(sock, action.address, self.security.enabled)
                sock.connect(tcp(action.address))
        except (TransportConfigError, zmq.ZMQError) as exc:
            self.reject("bad_field", f"cannot connect to {action.address!r:.80}: {exc}")
            return
        peer = self.peers[action.peer] = Peer(action.peer, action.address, sock)
        self.routing[action.peer] = routing_id
        if action.listen:
            self.listen(peer)

    def listen(self, peer: Peer) -> None:
        if peer.socket not in self.listening:
            self.listening[peer.socket] = peer.node_id
            flags = zmq.POLLIN | (zmq.POLLOUT if peer.socket in self.waiting else 0)
            self.poller.register(peer.socket, flags)

    def check_handshakes(self) -> SecurityMismatchError | None:
        """The refusal a watched connection met (its peer runs with other security settings), if any;
        a watch ends once its handshake succeeded."""
        for peer_id, watch in list(self.handshakes.items()):
            try:
                watch.check()
            except SecurityMismatchError as exc:
                return exc
            if watch.succeeded:
                self._end_watch(peer_id)
        return None

    def _end_watch(self, peer_id: int) -> None:
        watch = self.handshakes.pop(peer_id, None)
        if watch is not None:
            watch.close()

    def disconnect(self, peer_id: int, linger_s: float) -> None:
        self._end_watch(peer_id)
        peer = self.peers.pop(peer_id, None)
        self.routing.pop(peer_id, None)
        self.downloads.end(peer_id)
        if peer is None:
            return
        self.listening.pop(peer.socket, None)
        self.waiting.pop(peer.socket, None)
        with contextlib.suppress(KeyError):
            self.poller.unregister(peer.socket)
        peer.close(linger_s)

    def close_all(self, linger_s: float) -> None:
        self.downloads.end_all()
        for peer_id in list(self.handshakes):
            self._end_watch(peer_id)
        for peer in list(self.peers.values()):
            with contextlib.suppress(zmq.ZMQError):
                peer.close(linger_s)
        self.peers.clear()
        self.listening.clear()
        self.waiting.clear()
