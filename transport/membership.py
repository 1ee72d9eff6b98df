"""Liveness policy, both ways, as plain objects driven by an injected clock (no sockets, no threads).

- ``Membership`` (controller side): which nodes are alive. Any message from a node counts as a
  beat. A node silent for MORE than ``heartbeat_s * missed_beats`` seconds is reported by
  ``expire()`` exactly once and marked OFFLINE; hearing from it again makes it ONLINE again
  (the runtime decides whether such a node must rejoin).
- ``ControllerWatch`` (node side): has the controller been silent for more than ``timeout_s``?
- ``HeartbeatTimer``: when to send the next beat; the first beat is due at once.

The clock is any ``Callable[[], float]`` returning seconds (default ``time.monotonic``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum

__all__ = ["NodeState", "Membership", "ControllerWatch", "HeartbeatTimer"]

Clock = Callable[[], float]


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


class NodeState(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"


class Membership:
    """Controller-side liveness of every node it has heard of."""

    def __init__(self, heartbeat_s: float = 1.0, missed_beats: int = 3, clock: Clock = time.monotonic):
        self.heartbeat_s = _positive("heartbeat_s", heartbeat_s)
        if isinstance(missed_beats, bool) or not isinstance(missed_beats, int) or missed_beats < 1:
            raise ValueError(f"missed_beats must be an int >= 1, got {missed_beats!r}")
        self.missed_beats = missed_beats
        self._clock = clock
        self._last_heard: dict[int, float] = {}
        self._state: dict[int, NodeState] = {}

    @property
    def timeout_s(self) -> float:
        """Silence longer than this marks a node offline."""
        return self.heartbeat_s * self.missed_beats

    def joined(self, node_id: int) -> None:
        """A node registered (first time or again): ONLINE, heard now."""
        self._last_heard[node_id] = self._clock()
        self._state[node_id] = NodeState.ONLINE

    def heard(self, node_id: int) -> None:
        """Any message from the node counts as a beat; an unknown or OFFLINE node becomes ONLINE."""
        self.joined(node_id)

    def left(self, node_id: int) -> None:
        """The node said goodbye: OFFLINE now, and ``expire()`` will not report it."""
        if node_id in self._state:
            self._state[node_id] = NodeState.OFFLINE

    def forget(self, node_id: int) -> None:
        """Drop every record of the node (bounded memory for long jobs with many restarts)."""
        self._state.pop(node_id, None)
        self._last_heard.pop(node_id, None)

    def expire(self) -> list[int]:
        """Ids silent for more than ``timeout_s``, now marked OFFLINE; each reported once, ascending."""
        now = self._clock()
        limit = self.timeout_s
        gone = sorted(
            nid
            for nid, state in self._state.items()
            if state is NodeState.ONLINE and now - self._last_heard[nid] > limit
        )
        for nid in gone:
            self._state[nid] = NodeState.OFFLINE
        return gone

    def state(self, node_id: int) -> NodeState:
        """ONLINE or OFFLINE; a node never heard of (or forgotten) is OFFLINE."""
        return self._state.get(node_id, NodeState.OFFLINE)

    def online(self) -> list[int]:
        """Ids currently ONLINE, ascending (call ``expire()`` first for an up-to-date view)."""
        return sorted(nid for nid, s in self._state.items() if s is NodeState.ONLINE)

    def known(self) -> list[int]:
        """Every id ever heard and not forgotten, ascending."""
        return sorted(self._state)

    def silent_for(self, node_id: int) -> float:
        """Seconds since the node was last heard (KeyError if never heard)."""
        return self._clock() - self._last_heard[node_id]


class ControllerWatch:
    """Node-side: notices when the controller has gone silent, so the node can stop instead of hang."""

    def __init__(self, timeout_s: float = 5.0, clock: Clock = time.monotonic):
        self.timeout_s = _positive("timeout_s", timeout_s)
        self._clock = clock
        self._last = clock()

    def heard(self) -> None:
        """Any message from the controller counts."""
        self._last = self._clock()

    def silent_for(self) -> float:
        """Seconds since the controller was last heard (or since this watch was created)."""
        return self._clock() - self._last

    def lost(self) -> bool:
        """True once the controller has been silent for more than ``timeout_s``."""
        return self.silent_for() > self.timeout_s

    def remaining(self) -> float:
        """Seconds left before ``lost()`` turns True (0 when already lost): a deadline for waits."""
        return max(0.0, self.timeout_s - self.silent_for())


class HeartbeatTimer:
    """Decides when to send the next beat: ``due()`` is True at most once per interval."""

    def __init__(self, interval_s: float = 1.0, clock: Clock = time.monotonic):
        self.interval_s = _positive("interval_s", interval_s)
        self._clock = clock
        self._next: float | None = None  # None: the first beat is due at once
        self.lateness_s = 0.0  # how late the last beat ``due()`` granted was (a busy loop shows here)

    def due(self) -> bool:
        """True when a beat should go out now; the next one is then due ``interval_s`` later."""
        now = self._clock()
        if self._next is not None and now < self._next:
            return False
        self.lateness_s = 0.0 if self._next is None else now - self._next
        self._next = now + self.interval_s
        return True

    def remaining(self) -> float:
        """Seconds until the next beat is due (0 when due now): a poll timeout for the event loop."""
        if self._next is None:
            return 0.0
        return max(0.0, self._next - self._clock())

    def reset(self) -> None:
        """Count the interval from now (e.g. after another message already served as a beat)."""
        self._next = self._clock() + self.interval_s
