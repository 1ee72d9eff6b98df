"""Catch-up helpers around ``dedup.SeenUpdates``: rebuild and query a downloaded seen set.

A parameter download says exactly which updates the parameters include: the watermark (every
seq at or below it) plus the few seqs seen out of order above it (``above_watermark()``).
"""

from __future__ import annotations

from psrv.server.dedup import SeenUpdates

__all__ = ["covered", "restore"]


def restore(window: int, watermark: dict[int, int], extra: dict[int, list[int]]) -> SeenUpdates:
    """A SeenUpdates holding exactly the downloaded set: the watermark plus the extra seqs."""
    seen = SeenUpdates(window)
    seen.mark_covered({int(o): int(w) for o, w in watermark.items()})
    for origin, seqs in extra.items():
        for seq in seqs:
            seen.first_time(int(origin), int(seq))
    return seen


def covered(watermark: dict[int, int], extra: dict[int, list[int]], origin: int, seq: int) -> bool:
    return seq <= watermark.get(origin, 0) or seq in extra.get(origin, ())
