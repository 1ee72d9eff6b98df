"""How another thread wakes the I/O loop out of its poll: an inproc PUSH/PULL pair, coalesced."""

from __future__ import annotations

import contextlib
import threading

import zmq

__all__ = ["WakePipe"]


class WakePipe:
    """One wake is enough for everything queued before the loop runs: ``wake()`` sends at most one
    message until the loop ``drain()``s. ``pull`` is what the loop polls.

    ``wake()`` runs on any thread, ``drain()`` and ``close()`` on the loop's. A zmq socket is not
    thread-safe: closing the PUSH socket while another thread is inside its ``send`` frees what that
    send uses and crashes the process (SIGSEGV). So the send and the close hold the same lock, and a
    wake after the close does nothing."""

    def __init__(self) -> None:
        self.pull: zmq.Socket | None = None
        self.push: zmq.Socket | None = None
        self._lock = threading.Lock()
        self._pending = False

    def open(self, ctx: zmq.Context, name: str) -> None:
        self.pull = ctx.socket(zmq.PULL)
        self.pull.linger = 0
        self.pull.bind(name)
        self.push = ctx.socket(zmq.PUSH)
        self.push.linger = 0
        self.push.sndhwm = 16
        self.push.connect(name)

    def wake(self) -> None:
        if self._pending:
            return
        with self._lock:
            if self._pending or self.push is None:  # closed (or never opened)
                return
            self._pending = True
            with contextlib.suppress(zmq.Again, zmq.ZMQError):  # a full pipe already wakes the loop
                self.push.send(b"", zmq.NOBLOCK)

    def drain(self) -> None:
        """Take every wake out of the pipe, then let ``wake()`` send again. In this order, a wake that
        came before the flag is cleared had its work queued before it (the loop handles that work after
        draining), and any later wake sends a message the next poll sees. The other order could take a
        wake's message out after clearing the flag, leaving the flag set with the pipe empty: every
        later wake would then wait for the poll's timeout."""
        while True:
            try:
                self.pull.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
        with self._lock:
            self._pending = False

    def close(self) -> None:
        """Close both ends; waits for a ``wake()`` in flight on another thread to finish its send."""
        with self._lock:
            sockets, self.pull, self.push = (self.pull, self.push), None, None
            for sock in sockets:
                if sock is not None and not sock.closed:
                    sock.close(0)
