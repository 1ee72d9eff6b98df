"""A user-space TCP proxy that injects network faults into tests (netem is not available here).

    with FaultProxy("127.0.0.1:5555") as proxy:      # listens on 127.0.0.1:<ephemeral>
        connect_to(proxy.endpoint)                   # "tcp://127.0.0.1:<port>"
        proxy.set_delay(50)                          # every byte arrives 50 ms later
        proxy.drop_after(1000)                       # forward 1 000 more bytes, then cut everything
        proxy.cut()                                  # cut every connection now
        proxy.block()                                # stop forwarding (data waits; TCP back-pressure)
        proxy.block(discard=True)                    # black hole: read and throw away
        proxy.unblock()
        proxy.refuse()                               # new connections are closed at once

One background thread runs a selector loop over the listening socket and every connection
pair; control calls are thread safe and wake the loop. Buffers are bounded (``max_buffer`` bytes
per direction: when full the proxy stops reading, so the sender feels back-pressure as it would
from a slow link). ``stop()`` (and leaving the ``with``) closes every socket it opened and joins
the thread with a deadline.
"""

from __future__ import annotations

import contextlib
import logging
import selectors
import socket
import struct
import threading
import time
from collections import deque

__all__ = ["FaultProxy"]

log = logging.getLogger(__name__)

_CHUNK = 65536


def _parse_target(target: str | tuple[str, int]) -> tuple[str, int]:
    if isinstance(target, tuple):
        host, port = target
        return str(host), int(port)
    text = str(target)
    if "://" in text:
        text = text.split("://", 1)[1]
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"proxy target must be 'host:port' or 'tcp://host:port', got {target!r}")
    return host.strip("[]"), int(port)


class _Direction:
    """Bytes read from ``src`` waiting (until due) to be written to ``dst``."""

    __slots__ = ("src", "dst", "queue", "queued", "eof", "name")

    def __init__(self, src: socket.socket, dst: socket.socket, name: str) -> None:
        self.src, self.dst, self.name = src, dst, name
        self.queue: deque[tuple[float, memoryview]] = deque()
        self.queued = 0
        self.eof = False


class _Pair:
    __slots__ = ("client", "upstream", "up", "down", "closed")

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client, self.upstream = client, upstream
        self.up = _Direction(client, upstream, "up")
        self.down = _Direction(upstream, client, "down")
        self.closed = False


class FaultProxy:
    """Forwards 127.0.0.1:<port> to ``target`` with switchable delay, cut, drop-after-N and block."""

    def __init__(
        self,
        target: str | tuple[str, int],
        *,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
        delay_ms: float = 0.0,
        connect_timeout_s: float = 2.0,
        max_buffer: int = 4 << 20,
    ) -> None:
        self.target = _parse_target(target)
        self._listen_addr = (listen_host, listen_port)
        self._connect_timeout_s = connect_timeout_s
        self._max_buffer = max_buffer
        self._lock = threading.Lock()
        self._delay_s = max(0.0, delay_ms) / 1000.0
        self._drop_budget: int | None = None
        self._blocked = False
        self._discard = False
        self._refuse = False
        self._cut_requests: list[tuple[bool, threading.Event, list[int]]] = []
        self._pairs: list[_Pair] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._listener: socket.socket | None = None
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self.accepted = 0
        self.bytes_up = 0  # client -> target, forwarded
        self.bytes_down = 0  # target -> client, forwarded
        self.discarded = 0
        self.cuts = 0

    # ------------------------------------------------------------------ life cycle
    def start(self) -> FaultProxy:
        if self._thread is not None:
            return self
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(self._listen_addr)
            listener.listen(64)
            listener.setblocking(False)
            self._wake_r, self._wake_w = socket.socketpair()
            self._wake_r.setblocking(False)
            self._wake_w.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        self._selector = selectors.DefaultSelector()
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop and close every socket the proxy opened (idempotent)."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake()
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.error("fault proxy thread did not stop within %.1f s", timeout_s)
        self._thread = None
        self._close_all()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ where it listens
    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the proxy is not started")
        return self._listener.getsockname()[1]

    @property
    def address(self) -> str:
        return f"{self._listener.getsockname()[0] if self._listener else self._listen_addr[0]}:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"tcp://{self.address}"

    # ------------------------------------------------------------------ faults
    @property
    def delay_ms(self) -> float:
        return self._delay_s * 1000.0

    def set_delay(self, delay_ms: float) -> None:
        """Delay every byte read from now on by ``delay_ms`` (order is kept)."""
        with self._lock:
            self._delay_s = max(0.0, float(delay_ms)) / 1000.0
        self._wake()

    def drop_after(self, n_bytes: int | None) -> None:
        """Forward ``n_bytes`` more bytes (both directions together), then cut every connection.

        ``None`` cancels. The cut connections are gone; new ones are forwarded normally.
        """
        with self._lock:
            self._drop_budget = None if n_bytes is None else max(0, int(n_bytes))
        self._wake()

    def cut(self, *, reset: bool = False, timeout_s: float = 2.0) -> int:
        """Close every live connection now (with a TCP RST if ``reset``); returns how many were cut."""
        if self._thread is None:
            return 0
        done = threading.Event()
        result: list[int] = []
        with self._lock:
            self._cut_requests.append((reset, done, result))
        self._wake()
        if not done.wait(timeout_s):
            raise TimeoutError(f"fault proxy did not cut its connections within {timeout_s} s")
        return result[0]

    def block(self, *, discard: bool = False) -> None:
        """Stop forwarding. Held data waits (and back-pressures the sender) unless ``discard``."""
        with self._lock:
            self._blocked = True
            self._discard = discard
        self._wake()

    def unblock(self) -> None:
        with self._lock:
            self._blocked = False
            self._discard = False
        self._wake()

    def refuse(self, flag: bool = True) -> None:
        """While set, every new connection is accepted and closed at once (a dead peer)."""
        with self._lock:
            self._refuse = flag
        self._wake()

    # ------------------------------------------------------------------ observation
    @property
    def active(self) -> int:
        with self._lock:
            return sum(1 for p in self._pairs if not p.closed)

    def wait_connections(self, n: int, timeout_s: float = 5.0) -> bool:
        """Wait (with a deadline) until ``n`` connections were accepted in total."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.accepted >= n:
                return True
            time.sleep(0.01)
        return self.accepted >= n

    def stats(self) -> dict[str, int]:
        return {
            "accepted": self.accepted,
            "active": self.active,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "discarded": self.discarded,
            "cuts": self.cuts,
        }

    # ------------------------------------------------------------------ the loop
    def _wake(self) -> None:
        if self._wake_w is not None:
            with contextlib.suppress(OSError):
                self._wake_w.send(b"x")

    def _run(self) -> None:
        sel = self._selector
        assert sel is not None and self._listener is not None and self._wake_r is not None
        sel.register(self._listener, selectors.EVENT_READ, "listen")
        sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        try:
            while not self._stop.is_set():
                self._serve_cut_requests()
                timeout = self._arm(time.monotonic())
                for key, events in sel.select(timeout):
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    else:
                        self._service(key.fileobj, events)
                self._flush(time.monotonic())
                self._reap()
        except Exception:  # a proxy bug must not hang the test that uses it
            log.exception("fault proxy loop failed")
        finally:
            self._close_all()

    def _arm(self, now: float) -> float:
        """Set each socket's interest from the current state; return the select timeout."""
        with self._lock:
            blocked, discard = self._blocked, self._discard
        timeout = 0.05
        for pair in self._pairs:
            if pair.closed:
                continue
            masks: dict[socket.socket, int] = {pair.client: 0, pair.upstream: 0}
            for d in (pair.up, pair.down):
                if not d.eof and (discard or (not blocked and d.queued < self._max_buffer)):
                    masks[d.src] |= selectors.EVENT_READ
                if d.queue and not blocked:
                    due = d.queue[0][0]
                    if due <= now:
                        masks[d.dst] |= selectors.EVENT_WRITE
                    else:
                        timeout = min(timeout, due - now)
            for sock, mask in masks.items():
                self._set_interest(sock, mask, pair)
        return max(0.0, timeout)

    def _set_interest(self, sock: socket.socket, mask: int, pair: _Pair) -> None:
        sel = self._selector
        try:
            key = sel.get_key(sock)
        except KeyError:
            key = None
        if mask == 0:
            if key is not None:
                sel.unregister(sock)
        elif key is None:
            sel.register(sock, mask, pair)
        elif key.events != mask:
            sel.modify(sock, mask, pair)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except (BlockingIOError, InterruptedError):
            return
        self.accepted += 1
        with self._lock:
            refuse = self._refuse
        if refuse:
            client.close()
            return
        try:
            upstream = socket.create_connection(self.target, timeout=self._connect_timeout_s)
        except OSError as exc:
            log.info("fault proxy: cannot reach %s:%d (%s); closing the client", *self.target, exc)
            client.close()
            return
        for s in (client, upstream):
            s.setblocking(False)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self._pairs.append(_Pair(client, upstream))

    def _service(self, sock: socket.socket, events: int) -> None:
        pair = self._selector.get_key(sock).data
        if pair.closed:
            return
        if events & selectors.EVENT_READ:
            d = pair.up if sock is pair.client else pair.down
            try:
                data = sock.recv(_CHUNK)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                data = b""
            if data == b"":
                d.eof = True
            elif data:
                with self._lock:
                    discard, delay = self._discard, self._delay_s
                if discard:
                    self.discarded += len(data)
                else:
                    d.queue.append((time.monotonic() + delay, memoryview(data)))
                    d.queued += len(data)
        if events & selectors.EVENT_WRITE and not pair.closed:
            self._write(pair, pair.down if sock is pair.client else pair.up, time.monotonic())

    def _flush(self, now: float) -> None:
        with self._lock:
            blocked = self._blocked
        if blocked:
            return
        for pair in self._pairs:
            for d in (pair.up, pair.down):
                if not pair.closed and d.queue and d.queue[0][0] <= now:
                    self._write(pair, d, now)

    def _write(self, pair: _Pair, d: _Direction, now: float) -> None:
        while d.queue and d.queue[0][0] <= now and not pair.closed:
            due, view = d.queue[0]
            with self._lock:
                budget = self._drop_budget
            chunk = view if budget is None else view[:budget]
            sent = 0
            if len(chunk):
                try:
                    sent = d.dst.send(chunk)
                except (BlockingIOError, InterruptedError):
                    return
                except OSError:
                    self._close_pair(pair)
                    return
            if d.name == "up":
                self.bytes_up += sent
            else:
                self.bytes_down += sent
            d.queued -= sent
            if sent == len(view):
                d.queue.popleft()
            else:
                d.queue[0] = (due, view[sent:])
            if budget is not None:
                with self._lock:
                    self._drop_budget = budget - sent
                    exhausted = self._drop_budget <= 0
                if exhausted:
                    log.info("fault proxy: drop-after budget spent; cutting every connection")
                    self._cut_everything(reset=False)
                    with self._lock:
                        self._drop_budget = None
                    return
            if sent < len(chunk):
                return

    def _reap(self) -> None:
        """Close pairs whose one side ended and whose pending data went out."""
        for pair in self._pairs:
            if pair.closed:
                continue
            for d in (pair.up, pair.down):
                if d.eof and not d.queue:
                    self._close_pair(pair)
                    break
        with self._lock:
            self._pairs = [p for p in self._pairs if not p.closed]

    def _serve_cut_requests(self) -> None:
        with self._lock:
            requests, self._cut_requests = self._cut_requests, []
        for reset, done, result in requests:
            result.append(self._cut_everything(reset))
            done.set()

    def _cut_everything(self, reset: bool) -> int:
        n = 0
        for pair in self._pairs:
            if not pair.closed:
                self.cuts += 1  # counted before the close: whoever sees the connection end sees the count
                self._close_pair(pair, reset=reset)
                n += 1
        return n

    def _close_pair(self, pair: _Pair, reset: bool = False) -> None:
        pair.closed = True
        for sock in (pair.client, pair.upstream):
            if self._selector is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(sock)
            if reset:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            with contextlib.suppress(OSError):
                sock.close()

    def _close_all(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
            requests, self._cut_requests = self._cut_requests, []
        for pair in pairs:
            if not pair.closed:
                self._close_pair(pair)
        for _, done, result in requests:
            result.append(0)
            done.set()
        if self._selector is not None:
            with contextlib.suppress(Exception):
                self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
