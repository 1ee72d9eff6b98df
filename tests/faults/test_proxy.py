"""The fault-injection proxy, checked with plain sockets and with a real pyzmq PUSH/PULL pair."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
import zmq

from tests.faults.proxy import FaultProxy

pytestmark = pytest.mark.timeout(30)


class EchoServer:
    """Echoes every byte back; also records everything it received. Closes all it opens."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.port = self.listener.getsockname()[1]
        self.received = bytearray()
        self.closed_connections = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._conns: list[socket.socket] = []
        self._accept_thread = threading.Thread(target=self._accept, daemon=True)
        self._accept_thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            conn.settimeout(0.05)
            self._conns.append(conn)
            t = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _echo(self, conn: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                data = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            self.received += data
            with contextlib.suppress(OSError):
                conn.sendall(data)
        self.closed_connections += 1

    def close(self) -> None:
        self._stop.set()
        self._accept_thread.join(2)
        for t in self._threads:
            t.join(2)
        for c in self._conns:
            c.close()
        self.listener.close()


@pytest.fixture
def echo():
    server = EchoServer()
    yield server
    server.close()


def connect(proxy: FaultProxy) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
    sock.settimeout(5)
    return sock


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


def wait_until(condition, timeout_s: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def closed_by_peer(sock: socket.socket, timeout_s: float = 3.0) -> bool:
    sock.settimeout(timeout_s)
    try:
        while True:
            if sock.recv(65536) == b"":
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def test_forwards_both_ways_and_counts_bytes(echo):
    payload = bytes(range(256)) * 1000  # 256 KB, more than one chunk
    with FaultProxy(("127.0.0.1", echo.port)) as proxy:
        assert proxy.endpoint == f"tcp://127.0.0.1:{proxy.port}" and proxy.port != echo.port
        with connect(proxy) as sock:
            sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
            sender.start()
            assert recv_exactly(sock, len(payload)) == payload
            sender.join(5)
        # the counters are bumped just after each send, so the last one may trail the reader
        assert wait_until(lambda: proxy.stats()["bytes_down"] == len(payload))
        stats = proxy.stats()
        assert stats["accepted"] == 1
        assert stats["bytes_up"] == stats["bytes_down"] == len(payload)


def test_delay_is_applied_and_can_be_switched(echo):
    with FaultProxy(f"127.0.0.1:{echo.port}") as proxy, connect(proxy) as sock:
        start = time.monotonic()
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"
        fast = time.monotonic() - start
        proxy.set_delay(150)
        assert proxy.delay_ms == 150
        start = time.monotonic()
        sock.sendall(b"ping")
        assert recv_exactly(sock, 4) == b"ping"
        slow = time.monotonic() - start
        assert slow >= 0.29  # 150 ms each way
        assert fast < slow
        proxy.set_delay(0)
        start = time.monotonic()
        sock.sendall(b"pong")
        assert recv_exactly(sock, 4) == b"pong"
        assert time.monotonic() - start < slow


def test_drop_after_n_bytes_cuts_the_connection(echo):
    with FaultProxy(("127.0.0.1", echo.port)) as proxy, connect(proxy) as sock:
        proxy.drop_after(1000)
        with contextlib.suppress(OSError):
            sock.sendall(b"a" * 50_000)
        assert closed_by_peer(sock)
        assert wait_until(lambda: echo.closed_connections >= 1)
        assert 0 < len(echo.received) <= 1000  # never more than the budget got through
        assert proxy.stats()["cuts"] == 1
        # new connections are forwarded normally afterwards
        with connect(proxy) as again:
            again.sendall(b"still works")
            assert recv_exactly(again, 11) == b"still works"


def test_cut_closes_live_connections_now(echo):
    with FaultProxy(("127.0.0.1", echo.port)) as proxy:
        a, b = connect(proxy), connect(proxy)
        try:
            for s in (a, b):
                s.sendall(b"x")
                assert recv_exactly(s, 1) == b"x"
            assert proxy.active == 2
            assert proxy.cut(reset=True) == 2
            assert closed_by_peer(a) and closed_by_peer(b)
            assert proxy.active == 0
        finally:
            a.close()
            b.close()


def test_block_holds_data_then_delivers_everything(echo):
    with FaultProxy(("127.0.0.1", echo.port)) as proxy, connect(proxy) as sock:
        proxy.block()
        sock.sendall(b"held-" * 100)
        sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            sock.recv(10)
        assert echo.received == b""
        proxy.unblock()
        sock.settimeout(5)
        assert recv_exactly(sock, 500) == b"held-" * 100


def test_block_with_discard_is_a_black_hole(echo):
    with FaultProxy(("127.0.0.1", echo.port)) as proxy, connect(proxy) as sock:
        proxy.block(discard=True)
        sock.sendall(b"lost" * 10)
        assert wait_until(lambda: proxy.stats()["discarded"] >= 40)
        assert proxy.stats()["discarded"] == 40
        proxy.unblock()
        sock.sendall(b"kept")
        assert recv_exactly(sock, 4) == b"kept"
        assert bytes(echo.received) == b"kept"


def test_refuse_and_unreachable_target(echo):
    with FaultProxy(("127.0.0.1", echo.port)) as proxy:
        proxy.refuse()
        with connect(proxy) as sock:
            assert closed_by_peer(sock)
        proxy.refuse(False)
        with connect(proxy) as sock:
            sock.sendall(b"ok")
            assert recv_exactly(sock, 2) == b"ok"
    dead = socket.create_server(("127.0.0.1", 0))
    dead_port = dead.getsockname()[1]
    dead.close()
    with FaultProxy(("127.0.0.1", dead_port)) as proxy, connect(proxy) as sock:
        assert closed_by_peer(sock)


def test_stop_closes_everything_it_opened(echo):
    proxy = FaultProxy(("127.0.0.1", echo.port)).start()
    assert any(t.name == f"fault-proxy:{proxy.port}" for t in threading.enumerate())
    port = proxy.port
    sock = connect(proxy)
    sock.sendall(b"x")
    assert recv_exactly(sock, 1) == b"x"
    proxy.stop()
    assert closed_by_peer(sock)
    sock.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    assert not any(t.name.startswith("fault-proxy:") for t in threading.enumerate())
    proxy.stop()  # idempotent


def test_bad_target_is_a_clear_error():
    with pytest.raises(ValueError, match="host:port"):
        FaultProxy("no-port-here")


# ---------------------------------------------------------------------- pyzmq through the proxy
@pytest.fixture
def zmq_pair():
    """A PULL bound on loopback and a PUSH factory; every socket is closed at the end."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.linger = 0
    port = pull.bind_to_random_port("tcp://127.0.0.1")

    def push_to(endpoint: str) -> zmq.Socket:
        push = ctx.socket(zmq.PUSH)
        push.linger = 0
        push.reconnect_ivl = 50
        push.connect(endpoint)
        return push

    yield pull, port, push_to
    ctx.destroy(linger=0)


def drain(pull: zmq.Socket, n: int, timeout_s: float) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < n and time.monotonic() < deadline:
        if pull.poll(50):
            got.append(pull.recv())
    return got


def test_zmq_push_pull_through_proxy(zmq_pair):
    pull, port, push_to = zmq_pair
    with FaultProxy(("127.0.0.1", port)) as proxy:
        push = push_to(proxy.endpoint)
        sent = [f"m{i}".encode() * 1000 for i in range(100)]
        for m in sent:
            push.send(m)
        assert drain(pull, 100, 10) == sent

        proxy.set_delay(100)
        start = time.monotonic()
        push.send(b"late")
        assert drain(pull, 1, 5) == [b"late"]
        assert time.monotonic() - start >= 0.09
        proxy.set_delay(0)

        proxy.block()
        for i in range(10):
            push.send(b"blocked%d" % i)
        assert drain(pull, 1, 0.3) == []
        proxy.unblock()
        assert drain(pull, 10, 5) == [b"blocked%d" % i for i in range(10)]


def test_zmq_reconnects_after_a_cut(zmq_pair):
    pull, port, push_to = zmq_pair
    with FaultProxy(("127.0.0.1", port)) as proxy:
        push = push_to(proxy.endpoint)
        push.send(b"before")
        assert drain(pull, 1, 5) == [b"before"]
        assert proxy.cut() == 1
        # ZeroMQ reconnects by itself through the proxy; messages sent after that arrive
        assert proxy.wait_connections(2, timeout_s=5)
        push.send(b"after")
        assert drain(pull, 1, 5) == [b"after"]
