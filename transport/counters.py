"""Per-process counters of a role, and a rate-limited logger for floods of the same warning."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

__all__ = ["COUNTER_NAMES", "Counters", "RateLimitedLog"]

COUNTER_NAMES = (
    "updates_sent",  # own updates submitted and sent
    "updates_received",  # UPDATE messages received (including duplicates)
    "updates_applied",  # updates applied to the local parameters (exactly once each)
    "updates_relayed",  # copies forwarded to neighbours
    "duplicates_dropped",  # received again after being seen once
    "updates_dropped_backpressure",  # copies not queued because a peer's queue was full
    "updates_resent",  # own updates sent again because the controller still lacked them
    "frames_in",
    "frames_out",
    "bytes_in",
    "bytes_out",
    "heartbeat_bytes_out",  # of bytes_out, the heartbeats' (liveness and stats, not training data)
    "resyncs",  # parameter downloads (the first catch-up included)
    "resync_incomplete",  # re-syncs that could not replay everything (replay ring too short)
    "joins",
    "leaves",
    "offline",  # controller: membership events
)


class Counters:
    """Counters written by the role's I/O thread only (so plain dict updates under the GIL are safe)
    and read from any thread; ``snapshot()`` is what `psrv status` and the node's JSON line show."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: Counter[str] = Counter({name: 0 for name in COUNTER_NAMES})
        self._rejected: Counter[str] = Counter()
        self._applied_by_origin: Counter[int] = Counter()
        self.gauges: dict[str, Any] = {"mesh_version": 0}

    def add(self, name: str, amount: int = 1) -> None:
        self._values[name] += amount

    def received(self, frames: int, nbytes: int) -> None:
        values = self._values
        values["frames_in"] += frames
        values["bytes_in"] += nbytes

    def reject(self, reason: str) -> None:
        self._rejected[reason] += 1

    def applied(self, origin: int) -> None:
        self._values["updates_applied"] += 1
        self._applied_by_origin[origin] += 1

    def __getitem__(self, name: str) -> int:
        return self._values[name]

    def rejected_total(self) -> int:
        return sum(dict(self._rejected).values())

    def snapshot(self) -> dict[str, Any]:
        with self._lock:  # dict(...) copies atomically under the GIL even while the I/O thread writes
            out: dict[str, Any] = dict(self._values)
            rejected = dict(self._rejected)
            out["rejected"] = rejected
            out["rejected_total"] = sum(rejected.values())
            out["applied_by_origin"] = {int(k): v for k, v in sorted(dict(self._applied_by_origin).items())}
        out.update(self.gauges)
        return out


class RateLimitedLog:
    """Log a warning at most once per ``interval_s`` per key, saying how many were suppressed."""

    def __init__(
        self, logger: logging.Logger, interval_s: float = 5.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.logger = logger
        self.interval_s = interval_s
        self.clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: Counter[str] = Counter()

    def warning(self, key: str, message: str, *args: Any) -> bool:
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval_s:
            self._suppressed[key] += 1
            return False
        suppressed = self._suppressed.pop(key, 0)
        self._last[key] = now
        suffix = f" ({suppressed} more like this suppressed)" if suppressed else ""
        self.logger.warning(message + suffix, *args)
        return True
