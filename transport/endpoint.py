"""What a Controller and a Node share: one I/O thread owning every socket, receive -> decode ->
validate -> dispatch to ``on_<op>`` methods, chunked sends, counters and rate-limited logs.

Caller threads never touch a socket: they put commands on a bounded queue and wake the I/O
thread through an inproc pipe. Every wait has a deadline.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
import zmq
from psrv.transport.batch import unbatch
from psrv.transport.chunking import Reassembler, needs_chunking, split_message
from psrv.transport.codec import as_buffer, decode_frames, decode_header, encode_frames, frame_size
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters, RateLimitedLog
from psrv.transport.dedup import SeenUpdates
from psrv.transport.errors import (
    FatalTransportError,
    FrameRejectedError,
    NotRunningError,
    RetryableTransportError,
    TransportConfigError,
    TransportError,
)
from psrv.transport.loopstats import LoopStats
from psrv.transport.messages import Message, Op, handler_table
from psrv.transport.netmask import choose_address
from psrv.transport.payload import check_payload
from psrv.transport.peer import Peer
from psrv.transport.sockets import Security, bind_router, connect_dealer, valid_address
from psrv.transport.warmup import DECODE_KERNELS, check_params, params_checksum, warm_up_decode

__all__ = ["DECODE_KERNELS", "ApplyHook", "Endpoint", "check_params", "params_checksum", "warm_up_decode"]

ApplyHook = Callable[[np.ndarray, dict], None]
_instance_ids = itertools.count(1)
_POLL_MAX_S = 0.05
ZERO_COPY_MIN_BYTES = 128 * 1024  # measured with pyzmq 27: copying wins below, zero-copy above
DRAIN_MAX_S = 0.02  # one socket's turn of receiving, before the loop's timers get theirs
RECEIVE_BUDGET = 512  # messages per turn of a socket


class Endpoint:
    """Base of the two roles. Subclasses implement ``on_<op>`` handlers and ``_tick``."""

    role = "endpoint"
    seen: SeenUpdates  # the exactly-once filter of updates; each role sets its own

    def __init__(
        self,
        config: TransportConfig,
        params: np.ndarray,
        *,
        lock: threading.RLock | None = None,
        apply: ApplyHook | None = None,
    ) -> None:
        self.config = config
        self.params = check_params(params)
        self.lock = lock if lock is not None else threading.RLock()
        self._apply_hook = apply
        self.counters_ = Counters()
        self.log = logging.getLogger(f"psrv.transport.{self.role}")
        self._limited = RateLimitedLog(self.log, config.log_interval_s)
        self._handlers = handler_table(self)
        peer_bytes, total_bytes = config.reassembly_budget(self.params.nbytes)
        self._reassembler = Reassembler(total_bytes, config.reassembly_expiry_s, peer_limit_bytes=peer_bytes)
        self._commands: queue.Queue = queue.Queue(maxsize=config.submit_queue_messages)
        self._wake_lock = threading.Lock()
        self._wake_pending = False
        self._thread: threading.Thread | None = None
        self._stop_requested = threading.Event()
        self._ready = threading.Event()
        self._finished = threading.Event()
        self._error: BaseException | None = None
        self._msg_ids = itertools.count(1)
        self._instance = next(_instance_ids)
        self._ctx: zmq.Context | None = None
        self._security: Security | None = None
        self._router: zmq.Socket | None = None
        self._poller = zmq.Poller()
        self._router_paused = False
        self._reply_sockets: list[zmq.Socket] = []
        self._out_peers: dict[zmq.Socket, Peer] = {}
        self._last_expire = time.monotonic()
        self.address: str | None = None
        self.node_id: int = -1
        # this process's secret routing id: every DEALER it opens presents it, and the receiver
        # accepts a member's messages only from the routing id the controller bound to that member
        self.routing_id = uuid.uuid4().bytes
        self.loop_stats = LoopStats(self.counters_.gauges)

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> Endpoint:
        """Bind, start the I/O thread and wait until the role is ready (raises what went wrong)."""
        if self._thread is not None:
            raise NotRunningError(f"{self.role} already started")
        cfg = self.config
        if self._apply_hook is None:
            warm_up_decode(self.params.dtype)
        self._ctx = zmq.Context()
        try:
            self._security = Security(self._ctx, cfg.resolved_keys())
            host = cfg.host or choose_address(cfg.network_mask)
            self._router, self.address = bind_router(
                self._ctx,
                self._security,
                host,
                cfg.port,
                max_message_bytes=cfg.max_message_bytes,
                hwm=max(cfg.peer_queue_messages, 1000),
                rcvhwm=cfg.receive_queue_messages,
                buffer_bytes=cfg.socket_buffer_bytes,
            )
            self._wake_pull = self._ctx.socket(zmq.PULL)
            self._wake_pull.linger = 0
            wake = f"inproc://psrv-wake-{self._instance}"
            self._wake_pull.bind(wake)
            self._wake_push = self._ctx.socket(zmq.PUSH)
            self._wake_push.linger = 0
            self._wake_push.sndhwm = 16
            self._wake_push.connect(wake)
        except BaseException:
            self._close_sockets()
            raise
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._wake_pull, zmq.POLLIN)
        self._thread = threading.Thread(target=self._run, name=f"psrv-{self.role}-io", daemon=True)
        self._thread.start()
        deadline = self._start_deadline_s()
        if not self._ready.wait(deadline) and self._error is None:
            self._stop_requested.set()
            self._thread.join(5.0)
            raise self._start_timeout_error(deadline)
        if self._error is not None:
            self._thread.join(5.0)
            raise self._error
        return self

    def _start_deadline_s(self) -> float:
        return 10.0

    def _start_timeout_error(self, waited: float) -> TransportError:
        return NotRunningError(f"{self.role} did not become ready within {waited:.1f} s")

    def stop(self, timeout_s: float | None = None) -> None:
        """Leave politely, let queued frames out (linger), close everything. Idempotent."""
        if self._thread is None:
            return
        self._stop_requested.set()
        self._wake()
        self._thread.join(timeout_s if timeout_s is not None else self.config.linger_s + 5.0)

    def __enter__(self) -> Endpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._finished.is_set()

    @property
    def error(self) -> BaseException | None:
        """The error that stopped the role (None while running or after a clean stop)."""
        return self._error

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the role stops; re-raise the error that stopped it. False on timeout."""
        done = self._finished.wait(timeout_s)
        if self._error is not None:
            raise self._error
        return done

    def counters(self) -> dict[str, Any]:
        """A snapshot of this process's counters plus the checksum of the local parameters."""
        snap = self.counters_.snapshot()
        snap["node_id"] = self.node_id
        snap["address"] = self.address
        with self.lock:
            snap.update(params_checksum(self.params))
        return snap

    # ------------------------------------------------------------ caller threads
    def _wake(self) -> None:
        """Wake the I/O thread; coalesced: one wake is enough for everything queued before it runs."""
        if self._wake_pending:
            return
        with self._wake_lock, contextlib.suppress(zmq.Again, zmq.ZMQError):  # closing
            self._wake_pending = True
            self._wake_push.send(b"", zmq.NOBLOCK)

    def _enqueue(self, item: tuple, timeout_s: float) -> None:
        self._commands.put(item, timeout=timeout_s)
        self._wake()

    def call(self, fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        """Run ``fn`` on the I/O thread (which owns the mesh and sockets) and return its result."""
        if not self.running:
            raise NotRunningError(f"{self.role} is not running")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(("call", fn, future), timeout_s)
        return future.result(timeout_s)

    # ------------------------------------------------------------------ I/O thread
    def _run(self) -> None:
        try:
            self._on_start()
            clock = time.monotonic
            loop = self.loop_stats
            while not self._stop_requested.is_set():
                budget = self._receive_budget()
                if (budget == 0) != self._router_paused:  # back-pressure: leave arrivals in zmq/TCP
                    self._router_paused = budget == 0
                    if self._router_paused:
                        self._poller.unregister(self._router)
                    else:
                        self._poller.register(self._router, zmq.POLLIN)
                timeout = min(_POLL_MAX_S, self._poll_timeout_s(), 0.01 if self._router_paused else 1.0)
                events = dict(self._poller.poll(int(timeout * 1000)))
                t0 = clock()
                if self._router in events:
                    self._drain(self._router, routed=True, budget=budget)
                for sock in list(self._reply_sockets):
                    if events.get(sock, 0) & zmq.POLLIN and not sock.closed:
                        self._drain(sock, routed=False)
                t1 = clock()
                for sock, peer in list(self._out_peers.items()):
                    if events.get(sock, 0) & zmq.POLLOUT:
                        self._flush(peer)
                if self._wake_pull in events:
                    self._drain_wake()
                self._drain_commands()
                t2 = clock()
                if t2 - self._last_expire > 1.0:
                    self._last_expire = t2
                    dropped = self._reassembler.expire()
                    for _ in range(dropped):
                        self.counters_.reject("chunk_expired")
                self._tick()
                loop.record(t0, t1, t2, clock())
            self._on_stop()
        except BaseException as exc:  # the error is surfaced to the caller, never swallowed
            self._error = exc
            self.log.error("%s %s stopped: %s", self.role, self.address, exc)
            self._on_failure(exc)
        finally:
            self._ready.set()
            self._close_sockets()
            self._finished.set()

    def _poll_timeout_s(self) -> float:
        return _POLL_MAX_S

    def _receive_budget(self) -> int:
        """Messages the ROUTER may deliver this turn; 0 leaves them queued (a role slowing its senders)."""
        return RECEIVE_BUDGET

    def _drain_wake(self) -> None:
        self._wake_pending = False
        while True:
            try:
                self._wake_pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _drain_commands(self) -> None:
        if self._commands.empty():
            return
        batch: list[tuple] = []
        for _ in range(self.config.submit_queue_messages):
            try:
                item = self._commands.get_nowait()
            except queue.Empty:
                break
            if item[0] == "call":
                if batch:  # a call sees every command queued before it done (e.g. sends before a request)
                    self._on_commands(batch)
                    batch = []
                _, fn, future = item
                try:
                    future.set_result(fn())
                except Exception as exc:
                    future.set_exception(exc)
            else:
                batch.append(item)
        if batch:
            self._on_commands(batch)

    def _on_commands(self, items: list[tuple]) -> None:
        raise NotImplementedError(items[0][0])

    def _drain(self, sock: zmq.Socket, *, routed: bool, budget: int = RECEIVE_BUDGET) -> None:
        """Handle what waits on ``sock``: at most ``budget`` messages and about DRAIN_MAX_S of work,
        so the loop's timers (beats, expiry) run between turns however much arrives. What is left
        waits in zmq's receive queue (RCVHWM), then in TCP: senders are slowed, not lost."""
        deadline = time.monotonic() + DRAIN_MAX_S
        for i in range(budget):
            if i and time.monotonic() > deadline:
                self.counters_.add("drain_yields")
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity = frames[0].bytes if routed else None
            body = frames[1:] if routed else frames
            self.counters_.received(1, sum(frame_size(f) for f in body))
            self._receive(body, identity, sock)

    def _receive(self, body: list, identity: bytes | None, sock: zmq.Socket) -> None:
        cfg = self.config
        try:
            message = decode_frames(
                body, max_message_bytes=cfg.max_message_bytes, max_header_bytes=cfg.max_header_bytes
            )
        except FrameRejectedError as exc:
            self._reject(exc.reason, exc.detail)
            return
        except (FatalTransportError, RetryableTransportError):
            raise
        except TransportError as exc:
            self._reject("bad_message", f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - no frame, however absurd, may stop the I/O thread
            self._reject("handler_error", f"{type(exc).__name__}: {exc!s:.200}")
            return
        self._handle(message, identity, sock)

    def _handle(self, message: Message, identity: bytes | None, sock: zmq.Socket) -> None:
        """Authenticate, reassemble and dispatch one decoded message (also a held one, later)."""
        try:
            if not self._authenticate(message, identity, sock):
                return
            if message.op is Op.CHUNK:
                started = time.monotonic()
                done = self._reassembler.add((identity, message.src), message)
                self.loop_stats.handled("chunk", time.monotonic() - started)
                self._chunk_arrived(message)
                if done is None:
                    return
                inner, buffers = done
                sender = message.src
                message = decode_header(inner, buffers)
                if message.op is Op.CHUNK or message.src != sender:
                    raise FrameRejectedError(
                        "bad_chunk", "a chunk carries a chunk, or another sender's message"
                    )
            handler = self._handlers.get(message.op)
            if handler is None:
                raise FrameRejectedError(
                    "unknown_type", f"a {self.role} does not accept {message.op} messages"
                )
            started = time.monotonic()
            try:
                handler(message, identity, sock)
            finally:
                self.loop_stats.handled(message.op, time.monotonic() - started)
        except FrameRejectedError as exc:
            self._reject(exc.reason, exc.detail)
        except (FatalTransportError, RetryableTransportError):
            raise  # the role's own state errors (e.g. ControllerLostError) stop it; they are not bad input
        except TransportError as exc:  # e.g. MeshError / InvalidSequenceError from a crafted message
            self._reject("bad_message", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - no frame, however absurd, may stop the I/O thread
            self._reject("handler_error", f"{type(exc).__name__}: {exc!s:.200}")
            self.log.debug("%s: a handler failed on a received message", self.role, exc_info=exc)

    def _authenticate(self, message: Message, identity: bytes | None, sock: zmq.Socket) -> bool:
        """May this sender (``message.src`` on this connection) send this op? False: ignore it
        quietly; raise FrameRejectedError("bad_sender") to count it. Each role says who it trusts."""
        return True

    def _origin_allowed(self, origin: int, came_from: int) -> bool:
        """May ``came_from`` hand us an update of ``origin`` (a current or recently departed member,
        along the mesh)? Each role says; a refused row is a counted ``bad_origin`` rejection."""
        return True

    def _reject(self, reason: str, detail: str) -> None:
        self.counters_.reject(reason)
        self._limited.warning(
            f"reject:{reason}", "%s %s rejected a message (%s): %s", self.role, self.address, reason, detail
        )

    # ------------------------------------------------------------------- sending
    def _send(self, sock: zmq.Socket, message: Message, identity: bytes | None = None) -> bool:
        """Send without blocking (chunked if large); False when the peer's queue is full or it is gone."""
        parts = (
            split_message(message, self.config.chunk_bytes, next(self._msg_ids))
            if needs_chunking(message, self.config.chunk_bytes)
            else [message]
        )
        for part in parts:
            frames = encode_frames(part)
            if identity is not None:
                frames = [identity, *frames]
            try:
                sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return False
            except zmq.ZMQError as exc:  # EHOSTUNREACH from a ROUTER: the asker is gone
                self._limited.warning("send-error", "%s could not send %s: %s", self.role, message.op, exc)
                return False
            self.counters_.add("frames_out")
            self.counters_.add("bytes_out", sum(frame_size(f) for f in frames[(1 if identity else 0) :]))
        return True

    def _frames(self, message: Message) -> list[list[Any]]:
        parts = (
            split_message(message, self.config.chunk_bytes, next(self._msg_ids))
            if needs_chunking(message, self.config.chunk_bytes)
            else [message]
        )
        return [encode_frames(part) for part in parts]

    def _try_send(self, sock: zmq.Socket, frames: list[Any]) -> bool:
        nbytes = sum(frame_size(f) for f in frames)
        try:  # zero-copy pays for its bookkeeping only on large frames; small ones are cheaper copied
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=nbytes < ZERO_COPY_MIN_BYTES)
        except zmq.Again:
            return False
        values = self.counters_._values  # noqa: SLF001 - the hot path; the I/O thread is the only writer
        values["frames_out"] += 1
        values["bytes_out"] += nbytes
        return True

    def _post(
        self,
        peer: Peer,
        message: Message,
        *,
        droppable: bool = False,
        token: Any = None,
        urgent: bool = False,
    ) -> bool:
        """Send to a peer without blocking, queueing in ``peer.pending`` when its socket is full.

        Returns False only for a droppable message (a relayed update) that found the peer's
        overflow queue full (see peer.py for the policy). An ``urgent`` message (a heartbeat: small,
        unchunked, order-free) that must wait goes to the head of that queue, not behind the data.
        """
        if droppable and len(peer.pending) >= self.config.peer_queue_messages:
            peer.dropped += 1
            return False
        return self._post_frames(peer, self._frames(message), token=token, urgent=urgent)

    def _post_frames(
        self, peer: Peer, batches: list[list[Any]], *, droppable: bool = False, token: Any = None,
        urgent: bool = False,
    ) -> bool:
        """``_post`` of a message already encoded (``_frames``): one encoding sent to many peers."""
        if droppable and len(peer.pending) >= self.config.peer_queue_messages:
            peer.dropped += 1
            return False
        batches = list(batches)
        if urgent and peer.pending and len(batches) == 1:
            peer.pending.appendleft((batches[0], token))
            self._watch_out(peer, True)
            return True
        if not peer.pending:
            while batches and self._try_send(peer.socket, batches[0]):
                batches.pop(0)
            if not batches:
                if token is not None:
                    token.sent()
                return True
        for i, frames in enumerate(batches):
            peer.pending.append((frames, token if i == len(batches) - 1 else None))
        self.loop_stats.queue_depth(len(peer.pending))
        self._watch_out(peer, True)
        return True

    def _flush_all(self, timeout_s: float) -> None:
        """At stop: give queued frames up to ``timeout_s`` to reach their sockets."""
        deadline = time.monotonic() + timeout_s
        while self._out_peers and time.monotonic() < deadline:
            events = dict(self._poller.poll(20))
            for sock, peer in list(self._out_peers.items()):
                if events.get(sock, 0) & zmq.POLLOUT:
                    self._flush(peer)

    def _flush(self, peer: Peer) -> None:
        while peer.pending:
            frames, token = peer.pending[0]
            if not self._try_send(peer.socket, frames):
                return
            peer.pending.popleft()
            if token is not None:
                token.sent()
        self._watch_out(peer, False)

    def _watch_out(self, peer: Peer, on: bool) -> None:
        sock = peer.socket
        flags = (zmq.POLLIN if sock in self._reply_sockets else 0) | (zmq.POLLOUT if on else 0)
        if on:
            self._out_peers[sock] = peer
        else:
            self._out_peers.pop(sock, None)
        if flags:
            self._poller.register(sock, flags)
        elif sock in self._registered():
            self._poller.unregister(sock)

    def _registered(self) -> set[zmq.Socket]:
        return {s for s, _ in self._poller.sockets}

    def _connect_advertised(self, address: str) -> zmq.Socket:
        """A DEALER to an address that came over the wire; a bad one is a rejected frame, not a crash."""
        if not valid_address(address):
            raise FrameRejectedError(
                "bad_field", f"advertised address must be HOST:PORT, got {address!r:.80}"
            )
        try:
            return self._connect(-1, address).socket
        except (TransportConfigError, zmq.ZMQError) as exc:
            raise FrameRejectedError(
                "bad_field", f"cannot connect to advertised address {address!r:.80}: {exc}"
            ) from None

    def _connect(self, node_id: int, address: str) -> Peer:
        cfg = self.config
        sock = connect_dealer(
            self._ctx,
            self._security,
            address,
            hwm=cfg.peer_queue_messages,
            max_message_bytes=cfg.max_message_bytes,
            buffer_bytes=cfg.socket_buffer_bytes,
            routing_id=self.routing_id,
        )
        return Peer(node_id, address, sock)

    def _listen(self, sock: zmq.Socket) -> None:
        """Also receive on an outgoing socket (replies to requests come back on it)."""
        if sock not in self._reply_sockets:
            self._reply_sockets.append(sock)
            self._poller.register(sock, zmq.POLLIN | (zmq.POLLOUT if sock in self._out_peers else 0))

    def _close_peer(self, peer: Peer, linger_s: float = 0.0) -> None:
        if peer.socket in self._reply_sockets:
            self._reply_sockets.remove(peer.socket)
        self._out_peers.pop(peer.socket, None)
        if peer.socket in self._registered():
            self._poller.unregister(peer.socket)
        peer.close(linger_s)

    def _fresh_updates(self, msg: Message) -> list[tuple[dict, Any, np.ndarray]]:
        """The rows of an UPDATE(S) message as ``(fields, buffer, payload)`` that fit this model and
        arrive for the first time; a bad row is a counted rejection, a repeat a counted duplicate."""
        fresh = []
        for fields, buffer in unbatch(msg):
            origin, seq = fields["origin"], fields["seq"]
            try:
                if not self._origin_allowed(origin, msg.src):
                    raise FrameRejectedError(
                        "bad_origin", f"update of origin {origin} from {msg.src}: not a member it may relay"
                    )
                if self.seen.too_far(origin, seq):
                    raise FrameRejectedError(
                        "bad_sequence",
                        f"update {origin}/{seq} is more than {self.seen.window} ahead of what arrived",
                    )
                payload = check_payload(
                    np.frombuffer(as_buffer(buffer), dtype=np.int32),
                    self.params.size,
                    f"update {origin}/{seq}",
                    self.config.max_tau,
                )[0]
            except FrameRejectedError as exc:
                self._reject(exc.reason, exc.detail)
                continue
            self.counters_.add("updates_received")
            if not self.seen.first_time(origin, seq):
                self.counters_.add("duplicates_dropped")
                continue
            fresh.append((fields, buffer, payload))
        return fresh

    def _apply_counted(self, payload: np.ndarray, fields: dict) -> bool:
        """Apply one received update and count it; one that does not decode is a counted rejection."""
        try:
            self._apply_update(payload, fields)
        except FrameRejectedError as exc:
            self._reject(exc.reason, exc.detail)
            return False
        self.counters_.applied(fields["origin"])
        self.counters_.gauges["last_applied_at"] = time.time()  # when the last update arrived (benchmarks)
        return True

    def _apply_update(self, payload: np.ndarray, header: dict) -> None:
        """Add one encoded update into the local parameters (or hand it to the apply hook)."""
        if self._apply_hook is not None:
            self._apply_hook(payload, header)
            return
        from psrv.encoding import MalformedMessageError, decode

        try:
            with self.lock:
                decode(payload, self.params)
        except MalformedMessageError as exc:
            raise FrameRejectedError(
                "bad_payload", f"update {header.get('origin')}/{header.get('seq')}: {exc}"
            ) from None

    # ------------------------------------------------------------------ hooks
    def _on_start(self) -> None:
        self._ready.set()

    def _on_stop(self) -> None:
        pass

    def _on_failure(self, exc: BaseException) -> None:
        pass

    def _tick(self) -> None:
        pass

    def _chunk_arrived(self, chunk: Message) -> None:
        """A chunk was stored (progress of a large message); the node watches its download with it."""

    def _all_peers(self) -> list[Peer]:
        return []

    def _close_sockets(self) -> None:
        for peer in self._all_peers():
            with contextlib.suppress(zmq.ZMQError):
                peer.close(self.config.linger_s if self._error is None else 0.0)
        for name in ("_router", "_wake_pull", "_wake_push"):
            sock = getattr(self, name, None)
            if sock is not None and not sock.closed:
                sock.close(0)
        if self._security is not None:
            self._security.close()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
