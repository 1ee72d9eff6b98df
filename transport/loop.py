"""The one I/O loop: a thread that owns every socket of a role and drives its state machine.

``Loop(config, machine, ...)`` binds a ROUTER (what others connect to), opens one DEALER per member
the machine names (``Connect``), and turns everything into events for ``machine.handle(event, now)``
(transport/events.py): received frames are decoded and validated against the catalogue, chunked
messages reassembled (bounded per sender and per process, expiring), and handed over as
``Received``; API calls arrive as events (``post``) through a bounded queue and a wake pipe
(wake.py); ``Tick`` comes every iteration, at least every 50 ms. The actions are carried out
here: ``Send`` (non-blocking, per-peer overflow queues, urgent beats jumping the queue, droppable
relays reported back as ``Dropped``), ``Reply`` (through the ROUTER), ``Download`` (paced, see
pacing.py), ``Connect``/``Disconnect``, ``Ready`` and ``Stop``.

No frame, however absurd, stops the loop: a decode failure or any exception a handler raises on a
received message is a counted rejection (``FrameRejectedError`` -> its reason, anything else ->
``handler_error``) with a rate-limited log. The machine stops the role by returning ``Stop(error)``.

``call(fn)`` runs ``fn`` on the loop thread after every command queued before it was handled (a
query sees the sends that preceded it); its result or exception goes back to the caller.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import itertools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import zmq
from psrv.transport.chunking import Reassembler
from psrv.transport.codec import decode_frames, decode_header, frame_size
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters, RateLimitedLog
from psrv.transport.errors import FrameRejectedError, NotRunningError, TransportError
from psrv.transport.events import (
    ChunkArrived,
    Connect,
    Disconnect,
    Download,
    Event,
    Machine,
    Ready,
    Received,
    Reply,
    Send,
    Started,
    Stop,
    Stopping,
    Tick,
)
from psrv.transport.links import ZERO_COPY_MIN_BYTES, Links
from psrv.transport.loopstats import LoopStats
from psrv.transport.messages import Message, Op
from psrv.transport.netmask import choose_address
from psrv.transport.sockets import Security, bind_router
from psrv.transport.wake import WakePipe

__all__ = ["DRAIN_MAX_S", "Loop", "POLL_MAX_S", "RECEIVE_BUDGET", "ZERO_COPY_MIN_BYTES"]

_instance_ids = itertools.count(1)
POLL_MAX_S = 0.05  # the longest wait between two ticks
DRAIN_MAX_S = 0.02  # one socket's turn of receiving, before the loop's timers get theirs
RECEIVE_BUDGET = 512  # messages per turn of a socket
THROTTLE_READ_S = 0.05  # back-pressure: one small read this often while a member's queue is half full
THROTTLE_BUDGET = 64
EXPIRE_EVERY_S = 1.0  # incomplete chunked messages are checked for expiry this often


class Loop:
    """The I/O thread of one role; see the module docstring.

    ``throttle``: read less while a member's overflow queue fills (the controller: the senders'
    queues then fill and their ``submit`` waits, instead of relaying copies that would be dropped).
    ``warm_up``: run before the thread starts (e.g. compile the decode kernels).
    ``on_stopped(error)``: called on the loop thread as it ends (wake the role's waiters)."""

    def __init__(
        self,
        config: TransportConfig,
        machine: Machine,
        *,
        role: str,
        counters: Counters | None = None,
        params_nbytes: int = 0,
        warm_up: Callable[[], None] | None = None,
        throttle: bool = False,
        routing_id: bytes | None = None,
        on_stopped: Callable[[BaseException | None], None] | None = None,
        log: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self.machine = machine
        self.role = role
        self.counters = counters if counters is not None else Counters()
        self.log = log or logging.getLogger(f"psrv.transport.{role}")
        self._limited = RateLimitedLog(self.log, config.log_interval_s)
        self._warm_up = warm_up
        self._throttle = throttle
        self._on_stopped = on_stopped
        # the routing id a DEALER presents when the machine names none (one per process)
        self.routing_id = routing_id if routing_id is not None else uuid.uuid4().bytes
        peer_bytes, total_bytes = config.reassembly_budget(params_nbytes)
        self.reassembler = Reassembler(total_bytes, config.reassembly_expiry_s, peer_limit_bytes=peer_bytes)
        self.stats = LoopStats(self.counters.gauges)
        self.address: str | None = None
        self._commands: queue.Queue = queue.Queue(maxsize=config.submit_queue_messages)
        self._wake_pipe = WakePipe()
        self._thread: threading.Thread | None = None
        self._stop_requested = threading.Event()
        self._ready = threading.Event()
        self._finished = threading.Event()
        self._stopped = False  # the machine returned Stop
        self._error: BaseException | None = None
        self._instance = next(_instance_ids)
        self._ctx: zmq.Context | None = None
        self._security: Security | None = None
        self._router: zmq.Socket | None = None
        self._poller = zmq.Poller()
        self._router_paused = False
        self.links = Links(config, self.counters, self.stats, self._poller, self._reject, self.routing_id)
        self._last_expire = time.monotonic()
        self._last_throttled_read = 0.0
        self._feedback: list[Event] = []

    # ------------------------------------------------------------------ lifecycle
    def start(
        self, timeout_s: float = 10.0, timeout_error: Callable[[float], BaseException] | None = None
    ) -> str:
        """Bind, warm up, start the thread, feed ``Started`` and wait (``timeout_s``) for ``Ready``;
        raise what stopped the machine meanwhile. Returns the bound ``host:port``."""
        if self._thread is not None:
            raise NotRunningError(f"{self.role} already started")
        cfg = self.config
        if self._warm_up is not None:
            self._warm_up()
        self._ctx = zmq.Context()
        try:
            self._security = Security(self._ctx, cfg.resolved_keys())
            self.links.ctx, self.links.security = self._ctx, self._security
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
            self._wake_pipe.open(self._ctx, f"inproc://psrv-loop-wake-{self._instance}")
        except BaseException:
            self._close_sockets()
            raise
        self._poller.register(self._router, zmq.POLLIN)
        self._poller.register(self._wake_pipe.pull, zmq.POLLIN)
        self._thread = threading.Thread(target=self._run, name=f"psrv-{self.role}-io", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout_s) and self._error is None:
            self._stop_requested.set()
            self._wake()
            self._join_or_warn(self.stop_timeout_s(), "start timed out")
            raise (timeout_error(timeout_s) if timeout_error is not None
                   else NotRunningError(f"{self.role} did not become ready within {timeout_s:.1f} s"))
        if self._error is not None:
            self._thread.join(5.0)
            raise self._error
        return self.address

    @property
    def security_enabled(self) -> bool:
        return self._security is not None and self._security.enabled

    def stop(self, timeout_s: float | None = None) -> None:
        """Feed ``Stopping`` (goodbyes), let queued frames out (linger), close everything. Idempotent.

        Waits ``timeout_s`` (default ``stop_timeout_s()``) for the I/O thread to end and logs a
        warning if it has not: a process that exits while that thread is still inside zmq can crash."""
        if self._thread is None:
            return
        self._stop_requested.set()
        self._wake()
        self._join_or_warn(timeout_s if timeout_s is not None else self.stop_timeout_s(), "stop")

    def _join_or_warn(self, wait_s: float, after: str) -> None:
        """Wait for the I/O thread to end; say so if it outlives the wait (see ``stop``)."""
        assert self._thread is not None
        self._thread.join(wait_s)
        if self._thread.is_alive():
            self.log.warning("%s %s: the I/O thread was still closing its sockets %.1f s after %s; "
                             "a larger timeout_s (or a shorter linger_s) lets it finish",
                             self.role, self.address, wait_s, after)

    def stop_timeout_s(self) -> float:
        """How long ``stop`` waits by default: queued frames get ``linger_s`` to reach their sockets and
        the sockets ``linger_s`` again to send them as they close, plus 5 s for the rest."""
        return 2.0 * self.config.linger_s + 5.0

    @property
    def running(self) -> bool:
        return self._thread is not None and not self._finished.is_set()

    @property
    def on_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    @property
    def error(self) -> BaseException | None:
        return self._error

    def wait(self, timeout_s: float | None = None) -> bool:
        """Wait until the loop ends; re-raise the error that stopped it. False on timeout."""
        done = self._finished.wait(timeout_s)
        if self._error is not None:
            raise self._error
        return done

    # ------------------------------------------------------------ caller threads
    def _wake(self) -> None:
        """Wake the loop; coalesced: one wake is enough for everything queued before it runs."""
        self._wake_pipe.wake()

    def post(self, event: Event, timeout_s: float | None = None) -> None:
        """Queue ``event`` (a request of the role's API) for the machine, handled in order on the loop
        thread (blocks while the bounded queue is full; ``queue.Full`` after ``timeout_s``)."""
        self._commands.put(("event", event), timeout=timeout_s)
        self._wake()

    def call(self, fn: Callable[[], Any], timeout_s: float = 10.0) -> Any:
        """Run ``fn`` on the loop thread (which owns the machine and sockets) and return its result."""
        if not self.running:
            raise NotRunningError(f"{self.role} is not running")
        if self.on_loop_thread:
            return fn()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._commands.put(("call", fn, future), timeout=timeout_s)
        self._wake()
        return future.result(timeout_s)

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        clean = False
        try:
            self._feed(Started(self.address))
            clock = time.monotonic
            stats = self.stats
            while not self._stop_requested.is_set() and not self._stopped:
                budget = self._receive_budget()
                if (budget == 0) != self._router_paused:  # back-pressure: leave arrivals in zmq/TCP
                    self._router_paused = budget == 0
                    if self._router_paused:
                        self._poller.unregister(self._router)
                    else:
                        self._poller.register(self._router, zmq.POLLIN)
                links = self.links
                timeout = 0.002 if links.downloads else POLL_MAX_S
                if self._router_paused:
                    timeout = min(timeout, 0.01)
                events = dict(self._poller.poll(int(timeout * 1000)))
                t0 = clock()
                if self._router in events:
                    self._drain(self._router, None, budget)
                if links.listening:
                    for sock, peer_id in list(links.listening.items()):
                        if events.get(sock, 0) & zmq.POLLIN and not sock.closed:
                            self._drain(sock, peer_id, RECEIVE_BUDGET)
                t1 = clock()
                if links.waiting:
                    links.flush_writable(events)
                if links.handshakes and (refused := links.check_handshakes()) is not None:
                    self._error = refused  # other security settings: no retry can succeed
                    break
                if self._wake_pipe.pull in events:
                    self._wake_pipe.drain()
                self._drain_commands()
                t2 = clock()
                if t2 - self._last_expire > EXPIRE_EVERY_S:
                    self._last_expire = t2
                    for _ in range(self.reassembler.expire()):
                        self.counters.reject("chunk_expired")
                if not self._stopped:
                    self._feed(Tick())
                if links.downloads:
                    links.serve_downloads()
                stats.record(t0, t1, t2, clock())
            if not self._stopped:  # asked to stop: goodbyes, then queued frames get linger_s to leave
                self._drain_commands()
                self._feed(Stopping())
            if self._error is None:
                self.links.flush_all(self.config.linger_s)
                clean = True
        except BaseException as exc:  # a bug of the loop itself: surfaced to the caller, never swallowed
            self._error = exc
            self.log.error("%s %s: the I/O loop failed", self.role, self.address, exc_info=exc)
        finally:
            self._ready.set()
            self._close_sockets(clean)
            self._finished.set()
            if self._on_stopped is not None:
                try:
                    self._on_stopped(self._error)
                except Exception:  # noqa: BLE001 - a waiter's wake-up must not hide the loop's end
                    self.log.exception("%s: on_stopped failed", self.role)

    def _receive_budget(self) -> int:
        """Messages the ROUTER may deliver this turn; 0 leaves them queued (slowing the senders).

        With ``throttle``, while a member's overflow queue is half full: a little every 50 ms
        (every half beat once it is 90 % full) instead of relaying copies that would be dropped.
        Every member is still read often enough to be heard, and a dead one still times out."""
        if not self._throttle or not self.links.waiting:
            return RECEIVE_BUDGET
        deepest = self.links.deepest()
        limit = self.config.peer_queue_messages
        if deepest < limit // 2:
            return RECEIVE_BUDGET
        now = time.monotonic()
        interval = THROTTLE_READ_S if deepest < limit * 0.9 else self.config.heartbeat_s / 2
        if now - self._last_throttled_read < interval:
            return 0
        self._last_throttled_read = now
        self.counters.add("receive_throttled")
        return THROTTLE_BUDGET

    def _drain_commands(self) -> None:
        """Feed queued events in order (an event with a ``more`` field gets it set while another
        follows at once); a ``call`` runs after everything queued before it."""
        if self._commands.empty():
            return
        items: list[tuple] = []
        for _ in range(self.config.submit_queue_messages):
            try:
                items.append(self._commands.get_nowait())
            except queue.Empty:
                break
        last = len(items) - 1
        for i, item in enumerate(items):
            if item[0] == "call":
                _, fn, future = item
                try:
                    future.set_result(fn())
                except Exception as exc:  # noqa: BLE001 - the caller gets it
                    future.set_exception(exc)
            elif not self._stopped:
                event = item[1]
                if i < last and items[i + 1][0] == "event" and hasattr(event, "more"):
                    event = dataclasses.replace(event, more=True)
                self._feed(event)

    # ------------------------------------------------------------------ receiving
    def _drain(self, sock: zmq.Socket, via: int | None, budget: int) -> None:
        """Handle what waits on ``sock``: at most ``budget`` messages and about DRAIN_MAX_S of work,
        so the timers (beats, expiry) run between turns however much arrives. What is left waits
        in zmq's receive queue (RCVHWM), then in TCP: senders are slowed, not lost."""
        routed = via is None
        deadline = time.monotonic() + DRAIN_MAX_S
        for i in range(budget):
            if i and time.monotonic() > deadline:
                self.counters.add("drain_yields")
                return
            if sock.closed:  # the machine replaced this connection while handling the previous message
                return
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            if self._stopped:
                return
            if routed:
                identity, body = frames[0].bytes, frames[1:]
            else:
                identity, body = None, frames
            self.counters.received(1, sum(frame_size(f) for f in body))
            self.receive(body, identity, via)

    def receive(self, body: list[Any], routing_id: bytes | None, via: int | None = None) -> None:
        """One received message (its frames, the ROUTER identity removed) through decode,
        validation, reassembly and the machine. Also the tests' way in (on the loop thread)."""
        cfg = self.config
        try:
            message = decode_frames(
                body, max_message_bytes=cfg.max_message_bytes, max_header_bytes=cfg.max_header_bytes
            )
            if message.op is Op.CHUNK:
                message = self._reassemble(message, routing_id, via)
                if message is None:
                    return
        except FrameRejectedError as exc:
            self._reject(exc.reason, exc.detail)
            return
        except TransportError as exc:
            self._reject("bad_message", f"{type(exc).__name__}: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - no frame, however absurd, may stop the loop
            self._reject("handler_error", f"{type(exc).__name__}: {exc!s:.200}")
            return
        self._feed(Received(message, routing_id, via))

    def _reassemble(self, chunk: Message, routing_id: bytes | None, via: int | None) -> Message | None:
        started = time.monotonic()
        sender = (routing_id if via is None else ("via", via), chunk.src)
        done = self.reassembler.add(sender, chunk)
        self.stats.handled("chunk", time.monotonic() - started)
        self._feed(ChunkArrived(chunk.src, routing_id, via))
        if done is None:
            return None
        inner, buffers = done
        message = decode_header(inner, buffers)
        if message.op is Op.CHUNK or message.src != chunk.src:
            raise FrameRejectedError("bad_chunk", "a chunk carries a chunk, or another sender's message")
        return message

    def _reject(self, reason: str, detail: str) -> None:
        self.counters.reject(reason)
        self._limited.warning(
            f"reject:{reason}", "%s %s rejected a message (%s): %s", self.role, self.address, reason, detail
        )

    # ------------------------------------------------------------------ the machine
    def _feed(self, event: Event) -> None:
        """``machine.handle(event, now)`` and carry its actions out; feedback (``Dropped``) follows
        at once. An exception is counted, never the end of the loop."""
        while True:
            started = time.monotonic()
            try:
                actions = self.machine.handle(event, started)
            except FrameRejectedError as exc:
                self._reject(exc.reason, exc.detail)
                actions = ()
            except Exception as exc:  # noqa: BLE001 - a handler's bug or a crafted message's effect
                self._handler_failed(event, exc)
                actions = ()
            finally:
                if type(event) is Received:
                    self.stats.handled(event.message.op, time.monotonic() - started)
            if actions:
                self._carry_out(actions)
            if not self._feedback:
                return
            event = self._feedback.pop(0)

    def _handler_failed(self, event: Event, exc: Exception) -> None:
        if type(event) is Received:
            reason = "bad_message" if isinstance(exc, TransportError) else "handler_error"
            self._reject(reason, f"{event.message.op}: {type(exc).__name__}: {exc!s:.200}")
            self.log.debug("%s: a handler failed on a received message", self.role, exc_info=exc)
            return
        self.counters.reject("handler_error")
        if self._limited.warning(f"bug:{type(event).__name__}", "%s %s: handling %s failed: %s: %s",
                                 self.role, self.address, type(event).__name__, type(exc).__name__, exc):
            self.log.debug("%s: the failure", self.role, exc_info=exc)

    def _carry_out(self, actions: list) -> None:
        links = self.links
        last_message: Message | None = None
        last_frames: list[list[Any]] = []
        for action in actions:
            kind = type(action)
            if kind is Send:
                if action.message is not last_message:  # one encoding sent to every target
                    last_message, last_frames = action.message, links.frames(action.message)
                dropped = links.send(action, last_frames)
                if dropped is not None:
                    self._feedback.append(dropped)
            elif kind is Reply:
                if action.message is not last_message:
                    last_message, last_frames = action.message, links.frames(action.message)
                self._reply(action.routing_id, action.message, last_frames)
            elif kind is Download:
                links.start_download(action)
            elif kind is Connect:
                links.connect(action)
            elif kind is Disconnect:
                links.disconnect(action.peer, action.linger_s)
            elif kind is Ready:
                self._ready.set()
            elif kind is Stop:
                self._stopped = True
                if action.error is not None and self._error is None:
                    self._error = action.error
                    self.log.error("%s %s stopped: %s", self.role, self.address, action.error)
                self._ready.set()
            else:
                raise TypeError(f"unknown action {action!r:.80}")

    def _reply(self, routing_id: bytes, message: Message, batches: list[list[Any]]) -> None:
        """Through the ROUTER to one connection; a full pipe or a vanished asker is counted."""
        for frames in batches:
            try:
                self._router.send_multipart([routing_id, *frames], flags=zmq.NOBLOCK, copy=False)
            except (zmq.Again, zmq.ZMQError) as exc:  # EHOSTUNREACH (ROUTER_MANDATORY): not connected
                self.counters.add("replies_failed")
                self._limited.warning("reply-error", "%s could not reply %s: %s", self.role, message.op, exc)
                return
            self.counters.add("frames_out")
            self.counters.add("bytes_out", sum(frame_size(f) for f in frames))

    def peer_dropped(self, peer_id: int) -> int:
        """Relayed copies dropped for a member so far (0 for one without a connection)."""
        peer = self.links.peers.get(peer_id)
        return 0 if peer is None else peer.dropped

    def _close_sockets(self, clean: bool = False) -> None:
        self.links.close_all(self.config.linger_s if clean else 0.0)
        if self._router is not None and not self._router.closed:
            self._router.close(0)
        self._wake_pipe.close()
        if self._security is not None:
            self._security.close()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
