"""What a refused ZeroMQ handshake means: the peer runs with other security settings.

ZeroMQ drops a connection whose security mechanism does not match (CurveZMQ on one side, none on the
other) or whose CurveZMQ handshake fails (another key set) without a word to the application: the
client would wait for a reply until its deadline. The socket monitor does see the refusal; this
module turns its events into one clear error, naming the option that makes both sides agree.
"""

from __future__ import annotations

import contextlib

import zmq
from psrv.transport.errors import SecurityMismatchError
from zmq.utils.monitor import recv_monitor_message

__all__ = ["HandshakeWatch", "mismatch_message"]

_EVENTS = (zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_AUTH)


_INSECURE = ("the controller at {address} runs without keys (--insecure) and this process uses CurveZMQ "
             "keys: pass --insecure here too (in code: a TransportConfig with neither keys nor keys_dir), or "
             "restart the controller with --keys")


def mismatch_message(address: str, secure: bool, event: int, value: int) -> str | None:
    """The error a handshake event means for a client that is ``secure`` (None: no refusal)."""
    refused = event in (zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL, zmq.EVENT_HANDSHAKE_FAILED_AUTH)
    mismatch = (event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
    if mismatch or (refused and not secure):  # a client without keys holds no wrong key set
        if secure:
            return _INSECURE.format(address=address)
        return (f"the controller at {address} uses CurveZMQ keys and this process runs without keys "
                "(--insecure): pass --keys DIR with the controller's key set instead of --insecure (in code: "
                "TransportConfig(keys_dir=DIR))")
    if refused or (event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and secure):
        return (f"the controller at {address} refused the CurveZMQ handshake: its key set is not the one "
                "given here; pass --keys DIR with the key set the controller was started with (in code: "
                "TransportConfig(keys_dir=DIR))")
    return None


class HandshakeWatch:
    """Watches one client socket's handshakes; :meth:`check` raises SecurityMismatchError on a refusal."""

    def __init__(self, sock: zmq.Socket, address: str, secure: bool) -> None:
        self.address = address
        self.secure = secure
        self.succeeded = False
        self._monitor = sock.get_monitor_socket(_EVENTS)
        self._sock = sock

    def check(self, timeout_s: float = 0.0) -> None:
        """Read the events so far (waiting up to ``timeout_s`` for the first); raise on a refusal."""
        wait_ms = int(timeout_s * 1000)
        while self._monitor.poll(wait_ms):
            wait_ms = 0
            event = recv_monitor_message(self._monitor)
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.succeeded = True
                continue
            kind = int(event["event"])
            message = mismatch_message(self.address, self.secure, kind, int(event["value"]))
            if message is None:
                continue
            if kind == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL and self.secure and self._accepts_plain():
                message = _INSECURE.format(address=self.address)  # a dropped CurveZMQ hello, not wrong keys
            raise SecurityMismatchError(message)

    def _accepts_plain(self, timeout_s: float = 1.0) -> bool:
        """Whether the peer completes a handshake without CurveZMQ: a peer that drops a CurveZMQ hello
        either holds other keys or runs without keys, and only this tells the two apart."""
        probe = self._sock.context.socket(zmq.DEALER)
        probe.linger = 0
        monitor = probe.get_monitor_socket(_EVENTS)
        try:
            probe.connect(self._sock.getsockopt_string(zmq.LAST_ENDPOINT))
            if monitor.poll(int(timeout_s * 1000)):
                return recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
            return False
        finally:
            probe.disable_monitor()
            monitor.close(0)
            probe.close(0)

    def close(self) -> None:
        with contextlib.suppress(zmq.ZMQError):
            self._sock.disable_monitor()
        self._monitor.close(0)
