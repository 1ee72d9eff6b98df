"""Each node's wall-clock offset from the controller's, estimated from the heartbeat round trips.

The stats timeline and the trace put the workers' ``time.time()`` stamps on one axis; on several
machines those clocks differ (by milliseconds with NTP, by seconds without). The estimate is NTP's:
a node's beat carries its send time ``t0`` (node clock); the controller notes its arrival ``t1`` and
echoes both in its next liveness beat to that node, with that beat's send time ``t2`` (controller
clock); the node notes the arrival ``t3``. Then

    offset = ((t1 - t0) + (t2 - t3)) / 2        (controller clock minus node clock)
    rtt    = (t3 - t0) - (t2 - t1)               (the time on the wire, the controller's hold removed)

and the true offset lies within ``offset ± rtt / 2`` whatever the split of the delay between the two
directions. Of the last ``window`` samples the one with the smallest round trip is kept: queueing
only lengthens a round trip, so the shortest is the least disturbed and its bound the tightest.

Plain arithmetic on the stamps handed in: no clock is read here (the roles pass their own).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["CLOCK_ECHO", "CLOCK_SENT", "ClockEchoes", "ClockSample", "OffsetEstimator", "clock_sample"]

CLOCK_SENT = "clock_sent"  # a node's heartbeat stats: its wall clock when it sent the beat (t0)
CLOCK_ECHO = "clock"  # a liveness beat's stats: [t0, t1, t2] for the node it goes to
DEFAULT_WINDOW = 16


@dataclass(frozen=True)
class ClockSample:
    """One round trip: the offset it gives (controller minus node, seconds) and its round-trip time."""

    offset_s: float
    rtt_s: float

    @property
    def error_s(self) -> float:
        """The bound on this sample's error: half the round trip."""
        return self.rtt_s / 2.0


def clock_sample(t0: float, t1: float, t2: float, t3: float) -> ClockSample:
    """NTP's offset and round trip from the four stamps (see the module doc)."""
    return ClockSample(((t1 - t0) + (t2 - t3)) / 2.0, max(0.0, (t3 - t0) - (t2 - t1)))


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class OffsetEstimator:
    """The node's side: the minimum-round-trip sample of the last ``window`` round trips."""

    def __init__(self, window: int = DEFAULT_WINDOW) -> None:
        if window < 1:
            raise ValueError(f"window: expected a positive int, got {window!r}")
        self._samples: deque[ClockSample] = deque(maxlen=window)

    def add(self, echo: Any, t3: float) -> ClockSample | None:
        """Take a liveness beat's echo ``[t0, t1, t2]`` received at ``t3``; a malformed echo (or one
        whose stamps run backwards, e.g. after a clock step) is ignored."""
        if not isinstance(echo, list | tuple) or len(echo) != 3:
            return None
        stamps = [*echo, t3]
        if not all(_finite(t) for t in stamps):
            return None
        t0, t1, t2, t3 = (float(t) for t in stamps)
        if t3 < t0 or t2 < t1:
            return None
        sample = clock_sample(t0, t1, t2, t3)
        self._samples.append(sample)
        return sample

    def best(self) -> ClockSample | None:
        """The kept estimate (None before the first round trip)."""
        return min(self._samples, key=lambda s: s.rtt_s) if self._samples else None


class ClockEchoes:
    """The controller's side: each member's last beat stamp with its arrival time, echoed once in the
    next liveness beat to it. Without a wall clock (simulations) nothing is echoed."""

    def __init__(self, wall_clock: Callable[[], float] | None) -> None:
        self._wall_clock = wall_clock
        self._heard: dict[int, tuple[float, float]] = {}

    def heard(self, node_id: int, stats: Mapping[str, Any]) -> None:
        sent = stats.get(CLOCK_SENT)
        if self._wall_clock is not None and _finite(sent):
            self._heard[node_id] = (float(sent), self._wall_clock())

    def echoes(self) -> dict[int, list[float]]:
        """``{node_id: [t0, t1, t2]}`` for the beats about to go out (each stamp echoed once)."""
        if not self._heard or self._wall_clock is None:
            return {}
        t2 = self._wall_clock()
        out = {node_id: [t0, t1, t2] for node_id, (t0, t1) in self._heard.items()}
        self._heard.clear()
        return out
