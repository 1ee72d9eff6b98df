"""A one-shot request to a controller without joining (what `psrv status` uses)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

import zmq
from psrv.transport.codec import decode_frames, encode_frames
from psrv.transport.config import TransportConfig
from psrv.transport.errors import FrameRejectedError, JoinError
from psrv.transport.handshake import HandshakeWatch
from psrv.transport.messages import Message, Op
from psrv.transport.netmask import choose_address
from psrv.transport.sockets import Security, connect_dealer, tcp

__all__ = ["request_status"]


def request_status(
    address: str, config: TransportConfig | None = None, timeout_s: float = 5.0
) -> dict[str, Any]:
    """The controller's status dict; retries with back-off until ``timeout_s``, then JoinError
    (SecurityMismatchError at once when the controller refuses this process's security settings)."""
    config = config or TransportConfig()
    context = zmq.Context()
    security = Security(context, config.resolved_keys(), serve=False)
    sock = connect_dealer(context, security, address, hwm=100, max_message_bytes=config.max_message_bytes,
                          connect=False)
    watch = HandshakeWatch(sock, address, security.enabled)  # a refused handshake is said at once
    sock.connect(tcp(address))
    deadline = time.monotonic() + timeout_s
    backoff, attempts = 0.1, 0
    try:
        while time.monotonic() < deadline:
            attempts += 1
            with contextlib.suppress(zmq.Again):  # no connection yet (or a refused handshake)
                sock.send_multipart(encode_frames(Message(Op.STATUS_REQUEST)), flags=zmq.NOBLOCK)
            wait = min(backoff, max(0.0, deadline - time.monotonic()))
            watch.check()
            if sock.poll(int(wait * 1000) + 1):
                try:
                    reply = decode_frames(
                        sock.recv_multipart(copy=False),
                        max_message_bytes=config.max_message_bytes,
                        max_header_bytes=config.max_header_bytes,
                    )
                except FrameRejectedError:
                    continue
                if reply.op is Op.STATUS_REPLY:
                    return reply["status"]
            watch.check()
            backoff = min(backoff * 2, 1.0)
        local = config.host or choose_address(config.network_mask)
        raise JoinError(
            f"no reply from the controller at {address} (local address {local}) after {attempts} "
            f"attempts within {timeout_s:.1f} s: is it running and reachable, and do the keys match?"
        )
    finally:
        watch.close()
        sock.close(0)
        security.close()
        context.term()
