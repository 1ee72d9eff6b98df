"""A heartbeat's stats on the wire: well-known names travel as one-byte codes.

A node's heartbeat carries its counters and gauges by name, about 20 of them each beat. Their
names were most of a beat's bytes (471 bytes a beat with a Spark task's gauges, 350-560 bytes a
node a second), which on a small model weighs as much as the updates themselves. On the wire the
names listed here travel as their position in ``STAT_NAMES`` in a flat ``known`` list
``[code, value, code, value, ...]`` beside the header's ``stats`` map, which keeps every other
name as it is; the receiver puts the names back before the catalogue checks the message, so every
handler sees the same ``stats`` map as before. A membership's first beat says only how its stats
differ from ``BEAT_BASELINE``, which the controller holds from the join. Codes are positions:
append new names, never reorder or remove one (that is a new protocol version).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from psrv.transport.errors import FrameRejectedError
from psrv.transport.loopstats import LoopStats

__all__ = ["BEAT_BASELINE", "STAT_NAMES", "compact_stats", "expand_stats"]

#: the names a node's heartbeat carries every beat (server/node_timers.py, the Spark task's progress
#: and failure gauges, the replica checksum, the clock stamp); append only
STAT_NAMES: tuple[str, ...] = (
    "updates_sent", "updates_received", "updates_applied", "updates_relayed", "duplicates_dropped",
    "updates_dropped_backpressure", "resyncs", "rejected_total", "state", "mesh_version",
    "beat_late_ms", "beat_gap_max_ms", "clock_offset_s", "clock_error_s", "clock_sent",
    "train_partition", "train_epoch", "train_steps", "train_examples", "train_bytes_out",
    "train_bytes_in", "train_loss", "train_job", "train_fatal",
    "params_sum", "params_abs_sum", "params_crc32",
    # protocol 6: the I/O loop's gauges (psrv.transport.loopstats)
    "loop_receive_max_ms", "loop_send_max_ms", "loop_tick_max_ms", "loop_max_ms", "beat_late_max_ms",
    "pending_max", "loop_iterations",
)
#: what the controller holds for a member from its join, and what the member's first beat says only
#: its differences from: the counters at zero and the loop's gauges as they start. A node's first
#: beat of a membership was a full one, and on a small model whose fit lasts a second or two it is
#: the only beat a node sends: most of its values were these zeros.
def _loop_gauges_at_start() -> dict[str, Any]:
    gauges: dict[str, Any] = {}
    LoopStats(gauges)  # the values its reset() starts a window with
    return {name: value for name, value in gauges.items() if name in STAT_NAMES}  # not handler_ms


BEAT_BASELINE: MappingProxyType[str, Any] = MappingProxyType({
    **dict.fromkeys(STAT_NAMES[:8], 0),  # the counters, rejected_total the last
    "beat_late_ms": 0.0,
    **_loop_gauges_at_start(),
})
_CODES = {name: code for code, name in enumerate(STAT_NAMES)}
_SCALARS = (int, float, str, bool, type(None))


def compact_stats(stats: dict[str, Any]) -> tuple[list[Any], dict[str, Any]]:
    """``(known, rest)``: the well-known names' ``[code, value, ...]`` and the other names' map."""
    known: list[Any] = []
    rest: dict[str, Any] = {}
    for name, value in stats.items():
        code = _CODES.get(name)
        if code is None or not isinstance(value, _SCALARS):
            rest[name] = value  # an unknown name, or a value that needs the map's own checks
        else:
            known += (code, value)
    return known, rest


def expand_stats(known: Any, rest: Any) -> dict[str, Any]:
    """The stats map ``compact_stats`` was given; FrameRejectedError (bad_field) for a ``known``
    list that is not pairs of a code this version knows and a scalar, or names a stat twice."""
    if not isinstance(known, list | tuple) or len(known) % 2:
        raise FrameRejectedError(
            "bad_field", f"heartbeat: known must be [code, value, ...], got {known!r:.80}")
    if not isinstance(rest, dict):
        raise FrameRejectedError(
            "bad_field", f"heartbeat: stats must be a map, got {type(rest).__name__}")
    stats = dict(rest)
    for index in range(0, len(known), 2):
        code, value = known[index], known[index + 1]
        if type(code) is not int or not 0 <= code < len(STAT_NAMES):
            raise FrameRejectedError(
                "bad_field", f"heartbeat: stat code {code!r:.40}, expected 0..{len(STAT_NAMES) - 1}")
        if not isinstance(value, _SCALARS):
            raise FrameRejectedError("bad_field", f"heartbeat: stat {STAT_NAMES[code]} must be a scalar, "
                                                  f"got {type(value).__name__}")
        name = STAT_NAMES[code]
        if name in stats:
            raise FrameRejectedError("bad_field", f"heartbeat: stat {name} given twice")
        stats[name] = value
    return stats
