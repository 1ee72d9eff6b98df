"""TransportConfig: every knob of the controller and node roles, with the defaults a user expects."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from psrv.transport.errors import TransportConfigError

__all__ = ["MiB", "TransportConfig"]

MiB = 1024 * 1024


@dataclass
class TransportConfig:
    """Settings shared by a controller and its nodes (picklable: Spark ships it to the tasks).

    Sizes are bytes, times are seconds. ``keys`` is a ``psrv.transport.keys.KeySet`` or None
    (no CurveZMQ); ``keys_dir`` is read with ``read_keys`` when ``keys`` is None.
    """

    network_mask: str | None = None  # CIDR picking the local interface to bind and advertise
    host: str | None = None  # explicit address to bind and advertise; wins over network_mask
    port: int = 0  # 0 = an ephemeral port (nodes); the controller is normally given one
    mesh: str = "plain"  # "plain" (all nodes children of the controller) or "mesh" (BFS tree)
    fan_out: int = 8  # most children per place in MESH mode
    heartbeat_s: float = 1.0  # beat interval, both ways
    missed_beats: int = 3  # a node silent for this many beats is offline
    controller_timeout_s: float | None = None  # node side; None = heartbeat_s * (missed_beats + 0.5)
    join_timeout_s: float = 30.0  # join retries with back-off until this deadline
    controller_lost_timeout_s: float = 60.0  # node: after losing the controller, rejoin attempts this long
    catchup_timeout_s: float = 120.0  # the parameter download after joining must finish within this
    keys: Any = None  # KeySet for CurveZMQ, or None
    keys_dir: str | None = None  # directory written by `psrv keys`; used when keys is None
    max_message_bytes: int = 64 * MiB  # largest frame accepted (zmq MAXMSGSIZE + codec check)
    max_header_bytes: int = 4 * MiB  # largest msgpack header accepted
    chunk_bytes: int = 16 * MiB  # payloads larger than this travel in chunks of this size
    reassembly_limit_bytes: int = 2048 * MiB  # memory bound of incomplete chunked messages, per process
    # per sender; None = sized from the model: 8 x the parameters' bytes (params + updater state) + 2 chunks
    reassembly_peer_bytes: int | None = None
    reassembly_expiry_s: float = 30.0  # an incomplete chunked message older than this is dropped
    peer_queue_messages: int = 1000  # per-peer send queue (zmq SNDHWM); full -> dropped + counted
    submit_queue_messages: int = 1000  # node.submit() queue towards the I/O thread
    receive_queue_messages: int = 1000  # messages zmq holds per connection on receipt (RCVHWM)
    socket_buffer_bytes: int = 0  # kernel TCP send/receive buffer per socket (SNDBUF/RCVBUF); 0 = OS default
    submit_timeout_s: float = 5.0  # submit() waits this long for queue room, then SendQueueFullError
    dedup_window: int = 65536  # sequence window of the exactly-once filter, per origin
    max_nodes: int = 1024  # controller: members at most; a join beyond is refused (counted)
    max_pending_joins: int = 64  # controller: members admitted but not heard from since
    join_rate_per_s: float = 50.0  # controller: admitted joins per second (a burst of as many)
    # a departed member's late updates count this long, then its state goes; longer than a node's
    # controller_lost_timeout_s, so a node back from a partition can still re-send under its old id
    departed_kept_s: float = 90.0
    max_tau: float = 1000.0  # an update whose threshold exceeds this is refused (submitted, received)
    replay_ring_messages: int = 4096  # applied updates kept to rebuild params on a re-sync
    replay_ring_bytes: int = 256 * MiB
    node_name: str | None = None  # stable name of a worker (e.g. a Spark partition); rejoin -> restart flag
    linger_s: float = 1.0  # how long stop() lets queued frames leave
    log_interval_s: float = 5.0  # rate limit of repeated warnings (rejected frames, drops)
    status_stats: bool = True  # nodes report their counters (and a checksum) with each heartbeat
    checksum_max_params: int = 4_000_000  # heartbeat checksums are skipped above this size

    def __post_init__(self) -> None:
        self.validate()

    @property
    def effective_controller_timeout_s(self) -> float:
        if self.controller_timeout_s is not None:
            return self.controller_timeout_s
        return self.heartbeat_s * (self.missed_beats + 0.5)

    def validate(self) -> None:
        """Raise TransportConfigError naming the first field whose value cannot work."""

        def bad(field: str, expected: str) -> TransportConfigError:
            return TransportConfigError(
                f"TransportConfig.{field}: expected {expected}, got {getattr(self, field)!r}"
            )

        if self.mesh not in ("plain", "mesh"):
            raise bad("mesh", "'plain' or 'mesh'")
        if not 0 <= int(self.port) <= 65535:
            raise bad("port", "0..65535")
        if self.fan_out < 1:
            raise bad("fan_out", "an int >= 1")
        for name in (
            "heartbeat_s",
            "join_timeout_s",
            "controller_lost_timeout_s",
            "catchup_timeout_s",
            "reassembly_expiry_s",
            "submit_timeout_s",
            "log_interval_s",
        ):
            if not getattr(self, name) > 0:
                raise bad(name, "a positive number of seconds")
        if not (isinstance(self.max_tau, int | float) and self.max_tau > 0):
            raise bad("max_tau", "a positive number")
        if self.linger_s < 0:
            raise bad("linger_s", "a number of seconds >= 0")
        if self.missed_beats < 1:
            raise bad("missed_beats", "an int >= 1")
        if self.reassembly_peer_bytes is not None and int(self.reassembly_peer_bytes) < 1:
            raise bad("reassembly_peer_bytes", "a positive int or None (sized from the model)")
        if not self.join_rate_per_s > 0:
            raise bad("join_rate_per_s", "a positive number of joins per second")
        if not self.departed_kept_s >= 0:
            raise bad("departed_kept_s", "a number of seconds >= 0")
        if self.controller_timeout_s is not None and self.controller_timeout_s <= 0:
            raise bad("controller_timeout_s", "a positive number of seconds or None")
        for name in (
            "max_message_bytes",
            "max_header_bytes",
            "chunk_bytes",
            "reassembly_limit_bytes",
            "peer_queue_messages",
            "submit_queue_messages",
            "receive_queue_messages",
            "dedup_window",
            "replay_ring_messages",
            "replay_ring_bytes",
            "max_nodes",
            "max_pending_joins",
        ):
            if int(getattr(self, name)) < 1:
                raise bad(name, "a positive int")
        if int(self.socket_buffer_bytes) < 0:
            raise bad("socket_buffer_bytes", "an int >= 0 (0 = the OS default)")
        if self.chunk_bytes + self.max_header_bytes > self.max_message_bytes:
            raise bad(
                "chunk_bytes",
                f"chunk_bytes + max_header_bytes <= max_message_bytes ({self.max_message_bytes})",
            )

    def reassembly_budget(self, params_nbytes: int) -> tuple[int, int]:
        """(per sender, per process) bytes of incomplete chunked messages a process holds.

        The largest message a peer sends legitimately is a parameter download (params and the
        updater state); per process, four such senders at once, never above ``reassembly_limit_bytes``.
        """
        peer = self.reassembly_peer_bytes
        if peer is None:
            peer = 8 * params_nbytes + 2 * self.chunk_bytes
        return min(peer, self.reassembly_limit_bytes), min(4 * peer, self.reassembly_limit_bytes)

    def resolved_keys(self) -> Any:
        """The KeySet in force: ``keys``, else the one read from ``keys_dir``, else None."""
        if self.keys is not None:
            return self.keys
        if self.keys_dir:
            from psrv.transport.keys import read_keys  # lazy: keys imports zmq; a config needs no zmq

            return read_keys(self.keys_dir)
        return None

    def replace(self, **changes: Any) -> TransportConfig:
        return dataclasses.replace(self, **changes)
