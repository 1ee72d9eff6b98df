"""The node's clocks: join attempts with back-off and their deadline, the controller's silence
(rejoin attempts until ``controller_lost_timeout_s``, then ControllerLostError), a frozen process
checking in, and the node's own beats. ``now`` is the driver's time.

``Timers`` owns the beat timer, the freeze guard, the watch on the controller and the join
attempts (token, back-off, deadline); it reads the node's shared view and emits its actions there.
What the machine does when they fire (rejoin, re-sync, the download's retries) stays with the
machine and the other parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from psrv.server.clock_offset import CLOCK_ECHO, CLOCK_SENT, OffsetEstimator
from psrv.server.identity import SESSION_BYTES
from psrv.server.liveness import BeatTimer, FreezeGuard, PeerWatch
from psrv.server.mesh import CONTROLLER_ID
from psrv.server.node_state import NodeState
from psrv.server.node_view import NodeView
from psrv.server.warmup import params_checksum
from psrv.transport.errors import ControllerLostError, JoinError
from psrv.transport.events import Connect
from psrv.transport.messages import Message, Op
from psrv.transport.stat_codes import BEAT_BASELINE

__all__ = ["BACKOFF_FIRST_S", "BACKOFF_MAX_S", "FULL_BEATS_ONLY", "FULL_STATS_EVERY", "StatsDelta", "Timers"]

_STATS_KEYS = ("updates_sent", "updates_received", "updates_applied", "updates_relayed",
               "duplicates_dropped", "updates_dropped_backpressure", "resyncs")
BACKOFF_FIRST_S = 0.1
BACKOFF_MAX_S = 2.0
FULL_STATS_EVERY = 10  # beats: every tenth carries all the stats, the others what changed
FULL_BEATS_ONLY = frozenset({"handler_ms"})  # stats refreshed at the controller by the full beats only
_MISSING = object()


class StatsDelta:
    """What of a beat's stats to send: every ``full_every`` beats, and when a name went away, all
    of them; otherwise only those that changed since the previous beat (the controller merges them
    into what it holds), the first beat of a membership what differs from ``baseline`` (what the
    controller holds from the join). Most stats stand still between two beats (the flags, the ids,
    the rarely moving counters), and a beat that carried them all was most of a node's bytes on a
    small model. The full beats bound how long a value can stay stale at the controller should a
    beat ever be lost, and carry the ``full_only`` stats: diagnostics that move with every message
    handled (``handler_ms``) and would otherwise ride on every beat."""

    def __init__(self, full_every: int = FULL_STATS_EVERY, baseline: Mapping[str, Any] | None = None,
                 full_only: frozenset[str] = FULL_BEATS_ONLY) -> None:
        if full_every < 1:
            raise ValueError(f"full_every must be >= 1, got {full_every}")
        self.full_every = full_every
        self.baseline = dict(BEAT_BASELINE if baseline is None else baseline)
        self.full_only = full_only
        self._sent: dict[str, Any] = dict(self.baseline)
        self._since_full = 0

    def reset(self) -> None:
        """A new membership (the controller holds the baseline for us): the next beat says how we
        differ from it."""
        self._sent = dict(self.baseline)
        self._since_full = 0

    def next(self, stats: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """``(stats to send, delta)`` for this beat's ``stats``."""
        sent, self._sent = self._sent, dict(stats)
        self._since_full += 1
        if self._since_full >= self.full_every or not sent.keys() <= stats.keys():
            self._since_full = 0
            return stats, False
        full_only = self.full_only
        return {k: v for k, v in stats.items()
                if k not in full_only and _changed(sent.get(k, _MISSING), v)}, True


def _changed(old: Any, new: Any) -> bool:
    return old is _MISSING or type(old) is not type(new) or old != new


class Timers:
    """What happens as time passes; see the module docstring."""

    def __init__(self, view: NodeView, random_bytes: Callable[[int], bytes],
                 wall_clock: Callable[[], float] | None = None) -> None:
        self.view = view
        self._random = random_bytes
        self._wall_clock = wall_clock  # stamps for the clock offset (none: not estimated)
        self.clock = OffsetEstimator()
        heartbeat_s = view.config.heartbeat_s
        self._beat = BeatTimer(heartbeat_s)
        self._freeze = FreezeGuard(heartbeat_s)
        self._watch: PeerWatch | None = None  # the controller's liveness, once joined
        self.token = ""  # of the current join attempts (a reply carries it back)
        self.join_attempts = 0
        self._join_started = self._next_join = 0.0
        self._backoff = BACKOFF_FIRST_S
        self._lost_since: float | None = None  # when the controller was lost (rejoining since)
        self._last_ctrl_beat: float | None = None
        self._stats = StatsDelta()

    # ------------------------------------------------------------------ joining
    def begin_join(self, first: bool = False) -> None:
        """A new join: a new token and session, a new connection to the controller. The ``first``
        join watches the handshake (other security settings are said at once); a rejoin does not,
        as a controller going down mid-handshake must not read as a refusal."""
        view = self.view
        view.state = NodeState.JOINING
        self.token = self._random(16).hex()
        view.session = self._random(SESSION_BYTES)
        # a new session, a new connection to the controller: replies (JOIN_REPLY, PARAMS_REPLY, its
        # liveness beats) come back on it; the old one (a previous membership) is replaced
        view.emit(Connect(CONTROLLER_ID, view.controller_address, routing_id=view.link_id(CONTROLLER_ID),
                          listen=True, watch_handshake=first))
        self._join_started = view.now
        self.join_attempts = 0
        self._next_join = view.now
        self._backoff = BACKOFF_FIRST_S

    def tick_joining(self, now: float) -> None:
        """Send the next JOIN when its back-off is over; raise at the join (or rejoin) deadline."""
        view = self.view
        config = view.config
        if self._lost_since is not None:
            if now - self._lost_since > config.controller_lost_timeout_s:
                raise ControllerLostError(
                    f"node {view.address} lost the controller at {view.controller_address} and could not "
                    "rejoin within controller_lost_timeout_s = "
                    f"{config.controller_lost_timeout_s:.1f} s "
                    f"({self.join_attempts} join attempts); "
                    "what it submitted since is not in the master copy")
        elif now - self._join_started > config.join_timeout_s:
            raise JoinError(
                f"could not join the controller at {view.controller_address} from local address "
                f"{view.address}: no reply to {self.join_attempts} join attempts within "
                f"{config.join_timeout_s:.1f} s (is the controller running and reachable, and do the "
                "keys match?)")
        if now >= self._next_join:
            self.join_attempts += 1
            view.send_ctrl(Message(Op.JOIN, {"address": view.address, "name": config.node_name,
                                             "token": self.token, "session": view.session.hex()}))
            self._next_join = now + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def joined(self, paced: bool) -> None:
        """The controller took us in (``paced``: at its own heartbeat pace, now in the view's config)."""
        view = self.view
        self._lost_since = None
        self._stats.reset()  # a new member record at the controller, with the baseline stats
        if paced:
            self._beat = BeatTimer(view.config.heartbeat_s)
            self._freeze = FreezeGuard(view.config.heartbeat_s, view.now)
        self._watch = PeerWatch(view.config.effective_controller_timeout_s, view.now)

    def next_timer(self) -> float | None:
        """When the next JOIN attempt is due while joining, else None."""
        return self._next_join if self.view.state is NodeState.JOINING else None

    # ------------------------------------------------------------------ the controller's liveness
    def heard(self, now: float) -> None:
        """A sign of life of the controller's."""
        if self._watch is not None:
            self._watch.heard(now)

    def check_frozen(self, now: float) -> None:
        """This process was frozen (SIGSTOP, swapping): the silence was ours, not the controller's;
        beat at once and let the controller say whether we are still a member."""
        stalled = self._freeze.frozen_for(now)
        if self._watch is not None and stalled:
            self.view.log.warning("node %d was frozen for %.1f s; checking in with the controller",
                                  self.view.node_id, stalled)
            self._watch.heard(now)
            self._beat = BeatTimer(self.view.config.heartbeat_s)

    def controller_lost(self, now: float) -> bool:
        """Has the controller been silent too long (a partition or a paused driver)? Counted and
        logged; the caller rejoins and then calls ``lost_at``."""
        view = self.view
        if self._watch is None or not self._watch.lost(now):
            return False
        view.log.warning("node %d (%s) lost the controller at %s: silent for %.1f s (timeout %.1f s); "
                         "rejoining for up to %.1f s", view.node_id, view.address,
                         view.controller_address,
                         self._watch.silent_for(now), self._watch.timeout_s,
                         view.config.controller_lost_timeout_s)
        view.counters.add("controller_lost")
        return True

    def lost_at(self, now: float) -> None:
        """Rejoin attempts for the lost controller started at ``now`` (the deadline counts from it)."""
        self._lost_since = now

    def liveness_beat(self, now: float, stats: dict[str, Any] | None = None) -> None:
        """The controller's liveness beat: note the longest silence between two of them, and the
        round trip its clock echo closes (the offset estimate goes out as gauges, in our beats)."""
        gauges = self.view.counters.gauges
        if self._last_ctrl_beat is not None:
            gap = (now - self._last_ctrl_beat) * 1000.0
            if gap > gauges.get("beat_gap_max_ms", 0.0):
                gauges["beat_gap_max_ms"] = round(gap, 2)
        self._last_ctrl_beat = now
        echo = (stats or {}).get(CLOCK_ECHO)
        if echo is not None and self._wall_clock is not None and self.clock.add(echo, self._wall_clock()):
            best = self.clock.best()
            assert best is not None  # a sample was just added
            gauges["clock_offset_s"], gauges["clock_error_s"] = best.offset_s, best.error_s

    # ------------------------------------------------------------------ our own beats
    def beat(self, now: float) -> None:
        """Send our heartbeat (stats, mesh version) when it is due."""
        if self._beat.due(now):
            self.view.counters.gauges["beat_late_ms"] = round(self._beat.lateness_s * 1000.0, 2)
            self._send_heartbeat()

    def beat_stats(self) -> dict[str, Any]:
        """What our beat reports now, in full (the beat itself may carry only what changed)."""
        view = self.view
        counters = view.counters
        stats: dict[str, Any] = {k: counters[k] for k in _STATS_KEYS}
        stats["rejected_total"] = counters.rejected_total()
        stats["state"] = str(view.state)
        stats.update(counters.gauges)  # e.g. mesh_version, and whatever the embedding process reports
        if self._wall_clock is not None:
            stats[CLOCK_SENT] = self._wall_clock()  # the controller echoes it (clock offset)
        if (view.config.status_stats and view.state is NodeState.RUNNING
                and view.params.size <= view.config.checksum_max_params):
            stats.update(params_checksum(view.params))  # not while syncing: no master copy yet to compare
        return stats

    def _send_heartbeat(self) -> None:
        view = self.view
        version = view.mesh.version if view.mesh is not None else 0
        stats, delta = self._stats.next(self.beat_stats())
        fields = {"mesh_version": version, "stats": stats, "watermark": {}}
        if delta:
            fields["delta"] = True
        # urgent: never behind our own queued updates
        view.send_ctrl(Message(Op.HEARTBEAT, fields, src=view.node_id), urgent=True)

