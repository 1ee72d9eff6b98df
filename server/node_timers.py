"""The timers of ``NodeMachine``: join attempts with back-off and their deadline, the controller's
silence (rejoin attempts until ``controller_lost_timeout_s``, then ControllerLostError), a frozen
process checking in, a download that stopped moving, the node's own beats, and the controller's
beats: the watermarks that drive the repairs (own updates re-sent, a departed member's updates
re-sent, a re-sync when behind).

A mixin of server/node_machine.py (it uses the machine's state); ``now`` is the driver's time.
"""

from __future__ import annotations

from typing import Any

from psrv.server.liveness import BeatTimer
from psrv.server.node_state import NodeState
from psrv.server.warmup import params_checksum
from psrv.transport.errors import ControllerLostError, JoinError
from psrv.transport.messages import Message, Op

__all__ = ["BACKOFF_MAX_S", "Timers"]

_STATS_KEYS = ("updates_sent", "updates_received", "updates_applied", "updates_relayed",
               "duplicates_dropped", "updates_dropped_backpressure", "resyncs")
BACKOFF_MAX_S = 2.0


class Timers:
    """What happens as time passes (``Tick``); see the module docstring."""

    def _tick(self, now: float) -> None:
        self._release_held()
        stalled = self._freeze.frozen_for(now)
        if self._watch is not None and stalled:
            # this process was frozen (SIGSTOP, swapping): the silence was ours, not the controller's;
            # beat at once and let the controller say whether we are still a member
            self.log.warning("node %d was frozen for %.1f s; checking in with the controller", self.node_id,
                             stalled)
            self._watch.heard(now)
            self._beat = BeatTimer(self.config.heartbeat_s)
        if self.state is NodeState.JOINING:
            self._tick_joining(now)
            return
        if self._watch is not None and self._watch.lost(now):
            # a partition or a paused driver: keep trying to rejoin for controller_lost_timeout_s;
            # on rejoin the replica is replaced by the master copy (see README: partitions)
            self.log.warning("node %d (%s) lost the controller at %s: silent for %.1f s (timeout %.1f s); "
                             "rejoining for up to %.1f s", self.node_id, self.address,
                             self.controller_address,
                             self._watch.silent_for(now), self._watch.timeout_s,
                             self.config.controller_lost_timeout_s)
            self.counters_.add("controller_lost")
            self._rejoin("lost the controller")
            self._lost_since = now
            return
        if self.state is NodeState.SYNCING:
            if self.download.timed_out(now):
                raise JoinError(f"node {self.node_id}: the parameter download from {self.controller_address} "
                                f"did not finish within {self.config.catchup_timeout_s:.1f} s "
                                f"({self.download.requests()} request(s))")
            if self.download.retry_due(now):
                self.log.warning("node %d: no part of the parameter download arrived for a while; "
                                 "asking again",
                                 self.node_id)
                self.counters_.add("download_retries")
                self._request_params()
        if self._beat.due(now):
            self.counters_.gauges["beat_late_ms"] = round(self._beat.lateness_s * 1000.0, 2)
            self._send_heartbeat()

    def _tick_joining(self, now: float) -> None:
        if self._lost_since is not None:
            if now - self._lost_since > self.config.controller_lost_timeout_s:
                raise ControllerLostError(
                    f"node {self.address} lost the controller at {self.controller_address} and could not "
                    "rejoin within controller_lost_timeout_s = "
                    f"{self.config.controller_lost_timeout_s:.1f} s "
                    f"({self._join_attempts} join attempts); "
                    "what it submitted since is not in the master copy")
        elif now - self._join_started > self.config.join_timeout_s:
            raise JoinError(
                f"could not join the controller at {self.controller_address} from local address "
                f"{self.address}: no reply to {self._join_attempts} join attempts within "
                f"{self.config.join_timeout_s:.1f} s (is the controller running and reachable, and do the "
                "keys match?)")
        if now >= self._next_join:
            self._join_attempts += 1
            self._send_ctrl(Message(Op.JOIN, {"address": self.address, "name": self.config.node_name,
                                              "token": self._token, "session": self.session.hex()}))
            self._next_join = now + self._backoff
            self._backoff = min(self._backoff * 2, BACKOFF_MAX_S)

    def _send_heartbeat(self) -> None:
        stats: dict[str, Any] = {k: self.counters_[k] for k in _STATS_KEYS}
        stats["rejected_total"] = self.counters_.rejected_total()
        stats["state"] = str(self.state)
        stats.update(self.counters_.gauges)  # e.g. mesh_version, and whatever the embedding process reports
        if self.config.status_stats and self.params.size <= self.config.checksum_max_params:
            stats.update(params_checksum(self.params))
        version = self.mesh.version if self.mesh is not None else 0
        self._send_ctrl(Message(Op.HEARTBEAT, {"mesh_version": version, "stats": stats, "watermark": {}},
                                src=self.node_id), urgent=True)  # never behind our own queued updates

    def next_timer(self) -> float | None:
        """The driver time of the next JOIN attempt while joining (a driver may tick then), else None."""
        return self._next_join if self.state is NodeState.JOINING and self.stopped is False else None

    # ------------------------------------------------------------------ the controller's beats
    def on_heartbeat(self, msg: Message, routing_id: bytes | None) -> None:
        if self.state is NodeState.JOINING:
            return
        if routing_id is None:  # the controller's liveness beat, on our own connection: a sign of life only
            if self._last_ctrl_beat is not None:  # the longest silence between two of the controller's beats
                gap = (self._now - self._last_ctrl_beat) * 1000.0
                if gap > self.counters_.gauges.get("beat_gap_max_ms", 0.0):
                    self.counters_.gauges["beat_gap_max_ms"] = round(gap, 2)
            self._last_ctrl_beat = self._now
            return
        # the beat with the watermarks, in order with the updates relayed to us on the same pipe
        latest = {int(k): int(v) for k, v in msg["watermark"].items()}
        self._ctrl_origins = set(latest)
        self._prune_origins(latest)
        self._set_acknowledged(latest.get(self.node_id, 0))
        if self.state is not NodeState.RUNNING:
            return
        mine = self.seen.watermark()
        self._ctrl_watermarks.append((latest, self.seq, mine))
        if len(self._ctrl_watermarks) < self._ctrl_watermarks.maxlen:
            return
        # two beats ago; a gap is what is still missing AND not moving: a slow path (a backlog) moves
        old, own_seq_then, mine_then = self._ctrl_watermarks[0]
        quiet = self.config.heartbeat_s * self.config.missed_beats
        acknowledged = latest.get(self.node_id, 0)
        stuck = acknowledged == old.get(self.node_id, 0)
        if stuck and acknowledged < own_seq_then and self._now - self._last_resend > quiet:
            self._last_resend = self._now
            self._resend_own(acknowledged, own_seq_then)
        self._resend_departed(latest, old, quiet)
        behind = [o for o, w in old.items()
                  if o != self.node_id and mine.get(o, 0) < w and mine.get(o, 0) == mine_then.get(o, 0)]
        if behind and self._now - self.download.last_sync > quiet:
            self.log.warning("node %d is behind the controller for origins %s: re-syncing", self.node_id,
                             behind[:8])
            self._begin_sync(f"behind for origins {behind[:8]}")

    def _prune_origins(self, latest: dict[int, int]) -> None:
        """Forget what the controller forgot: departed origins no longer in its watermark."""
        self._recent_origins &= self._ctrl_origins
        kept = self.config.departed_kept_s / 2  # the controller gives a departed member's gaps up by then
        for origin in [o for o, at in self._departed_at.items() if self._now - at > kept]:
            del self._departed_at[origin]
        if self.mesh is None:
            return
        for origin in self.seen.origins():
            # a departed member the controller never heard from is kept a while: we may hold its updates
            if origin not in latest and origin not in self.mesh and origin != self.node_id \
                    and origin not in self._departed_at:
                self.seen.forget(origin)
