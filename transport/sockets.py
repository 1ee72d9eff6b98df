"""ZeroMQ socket setup: a ROUTER to receive, DEALERs to send, CurveZMQ and its ZAP check.

Every ROUTER is a CURVE server (server key pair) and every DEALER a CURVE client (client key
pair + server public key) when keys are configured. A ZAP handler in each process accepts only
the job's client public key, so a stranger (no keys, or other keys) completes no handshake:
nothing it sends is delivered and nothing is sent to it.
"""

from __future__ import annotations

import ipaddress
import logging
from typing import Any

import zmq
from psrv.transport.errors import TransportConfigError

__all__ = ["bind_router", "connect_dealer", "host_port", "Security", "set_queues", "tcp", "valid_address"]

log = logging.getLogger(__name__)


def tcp(address: str) -> str:
    """``host:port`` -> ``tcp://host:port`` (IPv6 hosts get brackets)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise TransportConfigError(f"expected an address HOST:PORT, got {address!r}")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"tcp://{host}:{port}"


def valid_address(address: object) -> bool:
    """``host:port`` with an IP address or host name and a port in 1..65535."""
    if not isinstance(address, str) or len(address) > 300:
        return False
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return all(part and len(part) < 64 and part.replace("-", "").isalnum() for part in host.split("."))


def host_port(endpoint: str) -> str:
    """``tcp://host:port`` (as LAST_ENDPOINT reports it) -> ``host:port``."""
    return endpoint.split("://", 1)[-1].replace("[", "").replace("]", "")


class _AllowClientKey:
    """ZAP credentials callback: only the job's client public key passes."""

    def __init__(self, allowed: bytes) -> None:
        self.allowed = allowed

    def callback(self, domain: str, key: bytes) -> bool:
        ok = key == self.allowed
        if not ok:
            log.warning("refused a CURVE handshake from an unknown client key")
        return ok


class Security:
    """Applies (or not) CurveZMQ to sockets of one context; ``close()`` stops the ZAP thread."""

    def __init__(self, context: zmq.Context, keys: Any, *, serve: bool = True) -> None:
        self.keys = keys
        self._auth = None
        if keys is not None and serve:
            if not zmq.has("curve"):
                raise TransportConfigError("keys are configured but this libzmq has no CURVE support")
            from zmq.auth.thread import ThreadAuthenticator

            self._auth = ThreadAuthenticator(context, log=logging.getLogger("psrv.transport.zap"))
            self._auth.start()
            self._auth.configure_curve_callback(
                domain="*", credentials_provider=_AllowClientKey(keys.client_public)
            )

    @property
    def enabled(self) -> bool:
        return self.keys is not None

    def server(self, sock: zmq.Socket) -> None:
        if self.keys is not None:
            if not zmq.has("curve"):
                raise TransportConfigError("keys are configured but this libzmq has no CURVE support")
            sock.curve_secretkey = self.keys.server_secret
            sock.curve_publickey = self.keys.server_public
            sock.curve_server = True

    def client(self, sock: zmq.Socket) -> None:
        if self.keys is not None:
            sock.curve_secretkey = self.keys.client_secret
            sock.curve_publickey = self.keys.client_public
            sock.curve_serverkey = self.keys.server_public

    def close(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None


def set_queues(sock: zmq.Socket, sndhwm: int, rcvhwm: int, buffer_bytes: int) -> None:
    """zmq's message queues (HWM) and, when ``buffer_bytes`` > 0, the kernel's TCP buffers."""
    sock.sndhwm = sndhwm
    sock.rcvhwm = rcvhwm
    if buffer_bytes > 0:
        sock.setsockopt(zmq.SNDBUF, buffer_bytes)
        sock.setsockopt(zmq.RCVBUF, buffer_bytes)


def bind_router(
    context: zmq.Context,
    security: Security,
    host: str,
    port: int,
    *,
    max_message_bytes: int,
    hwm: int,
    rcvhwm: int | None = None,
    buffer_bytes: int = 0,
) -> tuple[zmq.Socket, str]:
    """A ROUTER bound on host:port (port 0 = ephemeral); returns it and its ``host:port``."""
    sock = context.socket(zmq.ROUTER)
    sock.linger = 0
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
    # a member's DEALER carries a secret routing id; when its TCP connection is re-made (a healed
    # partition) the new connection takes the id over instead of being refused as a duplicate
    sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    set_queues(sock, hwm, hwm if rcvhwm is None else rcvhwm, buffer_bytes)
    security.server(sock)
    bind_host = f"[{host}]" if ":" in host else host
    try:
        sock.bind(f"tcp://{bind_host}:{port if port else '*'}")
    except zmq.ZMQError as exc:
        sock.close(0)
        raise TransportConfigError(f"cannot bind tcp://{bind_host}:{port or '*'}: {exc}") from None
    return sock, host_port(sock.getsockopt_string(zmq.LAST_ENDPOINT))


def connect_dealer(
    context: zmq.Context,
    security: Security,
    address: str,
    *,
    hwm: int,
    max_message_bytes: int,
    buffer_bytes: int = 0,
    routing_id: bytes | None = None,
    connect: bool = True,
) -> zmq.Socket:
    """A DEALER connected to a peer's ROUTER at ``host:port``; ``routing_id`` is what the peer's
    ROUTER sees as this connection's identity (the receiver binds a member's id to it). ``connect``
    False: set up only (the caller connects, e.g. after attaching a monitor)."""
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    if routing_id is not None:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    set_queues(sock, hwm, hwm, buffer_bytes)
    sock.setsockopt(zmq.MAXMSGSIZE, max_message_bytes)
    security.client(sock)
    if connect:
        sock.connect(tcp(address))
    return sock
