"""The timers of ``NodeMachine``: join attempts with back-off and their deadline, the controller's
silence (rejoin attempts until ``controller_lost_timeout_s``, then ControllerLostError), a frozen
process checking in, a download that stopped moving, and the node's own beats.

A mixin of server/node_machine.py (it uses the machine's state); ``now`` is the driver's time.
"""

from __future__ import annotations

from typing import Any

from psrv.server.liveness import BeatTimer
from psrv.server.node_state import NodeState
from psrv.server.warmup import params_checksum
from psrv.transport.errors import ControllerLostError, JoinError
from psrv.transport.messages import Message, Op

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

