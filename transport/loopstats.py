"""Where an I/O thread's time goes: per-phase maxima of its loop, beat lateness, queue depths.

The join-burst investigation needed to know whether a member timed out because the
loop was busy (which phase), because beats went out late, or because they waited behind data in
a queue. These are cheap maxima written into the role's gauges (so `psrv status`, heartbeat
stats and the nodes' JSON lines carry them); ``reset()`` starts a new measuring window.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PHASES", "LoopStats"]

PHASES = ("receive", "send", "tick")


class LoopStats:
    """Maxima in milliseconds, kept in ``gauges`` (a Counters' gauge dict, read by any thread)."""

    def __init__(self, gauges: dict[str, Any]) -> None:
        self.gauges = gauges
        self.reset()

    def reset(self) -> None:
        g = self.gauges
        for phase in PHASES:
            g[f"loop_{phase}_max_ms"] = 0.0
        g["loop_max_ms"] = 0.0
        g["beat_late_max_ms"] = 0.0  # from a beat's due time to the moment it was handed to the socket(s)
        g["pending_max"] = 0  # deepest per-peer overflow queue seen (messages waiting for a full socket)
        g["loop_iterations"] = 0
        g["handler_ms"] = {}  # op -> [messages handled, total ms, max ms]

    def record(self, t0: float, t1: float, t2: float, t3: float) -> None:
        """One loop iteration: receive t0..t1, send/commands t1..t2, timers t2..t3."""
        g = self.gauges
        g["loop_iterations"] += 1
        for name, seconds in (("loop_receive_max_ms", t1 - t0), ("loop_send_max_ms", t2 - t1),
                              ("loop_tick_max_ms", t3 - t2), ("loop_max_ms", t3 - t0)):
            if seconds * 1000.0 > g[name]:
                g[name] = round(seconds * 1000.0, 2)

    def handled(self, op: str, seconds: float) -> None:
        entry = self.gauges["handler_ms"].get(op)
        ms = seconds * 1000.0
        if entry is None:
            self.gauges["handler_ms"][op] = [1, round(ms, 3), round(ms, 3)]
            return
        entry[0] += 1
        entry[1] = round(entry[1] + ms, 3)
        if ms > entry[2]:
            entry[2] = round(ms, 3)

    def beat_sent(self, late_s: float) -> None:
        if late_s * 1000.0 > self.gauges["beat_late_max_ms"]:
            self.gauges["beat_late_max_ms"] = round(late_s * 1000.0, 2)

    def queue_depth(self, depth: int) -> None:
        if depth > self.gauges["pending_max"]:
            self.gauges["pending_max"] = depth
