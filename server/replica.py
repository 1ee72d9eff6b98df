"""Is this replica what the master copy says it should be? The pure half of ``Node.check_replica``.

A node downloads a snapshot of the master copy together with the exact set of updates it includes
(the watermark plus the few sequences seen above it). Once the node has applied every one of those,
its replica must equal the snapshot plus the updates the node applied that the snapshot lacks (still
in its replay ring). Applying them to a copy of the snapshot and comparing is exact up to float
rounding (the order of additions differs), whatever the other workers are still sending. No sockets,
no clocks: the node's I/O thread calls these under its lock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from psrv.server.dedup import SeenUpdates

DEFAULT_TOLERANCE = 1e-6  # relative L2: float32 rounding of sums taken in another order stays far below


@dataclass(frozen=True)
class ReplicaCheck:
    """The outcome: ``status`` is "equal", "differs", "incomplete" (the ring no longer held what was
    needed) or "unavailable" (no snapshot in time, or a re-sync replaced the replica meanwhile)."""

    status: str
    relative_l2: float | None = None
    max_abs_difference: float | None = None
    replayed: int = 0  # updates this replica held beyond the snapshot
    detail: str = ""

    @property
    def diverged(self) -> bool:
        return self.status == "differs"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def covers(seen: SeenUpdates, watermark: dict[int, int], extra: dict[int, list[int]]) -> bool:
    """Whether every update in the snapshot's set was applied here too."""
    marks = seen.watermark()
    for origin, mark in watermark.items():
        have = marks.get(origin, 0)
        if have < mark and not all(seen.seen(origin, s) for s in range(have + 1, mark + 1)):
            return False
    return all(seen.seen(origin, s) for origin, seqs in extra.items() for s in seqs)


def expected_replica(
    master: np.ndarray, beyond: Iterable[tuple[int, int, np.ndarray, dict]],
    decode: Callable[[np.ndarray, np.ndarray], None],
) -> tuple[np.ndarray, int]:
    """The snapshot plus every (origin, seq, payload, fields) update it lacks; and how many there were."""
    expected = np.array(master, copy=True)
    count = 0
    for _origin, _seq, payload, _fields in beyond:
        decode(payload, expected)
        count += 1
    return expected, count


def compare(params: np.ndarray, expected: np.ndarray, replayed: int,
            tolerance: float = DEFAULT_TOLERANCE) -> ReplicaCheck:
    """Relative L2 distance of the replica from what it should be; "differs" above ``tolerance``."""
    live = np.asarray(params, dtype=np.float64)
    want = np.asarray(expected, dtype=np.float64)
    if live.shape != want.shape:
        return ReplicaCheck("differs", None, None, replayed,
                            f"replica has shape {live.shape}, the master copy {want.shape}")
    difference = live - want
    scale = max(float(np.linalg.norm(want)), 1e-30)
    relative = float(np.linalg.norm(difference)) / scale
    largest = float(np.max(np.abs(difference))) if difference.size else 0.0
    if not np.isfinite(relative) or relative > tolerance:
        return ReplicaCheck("differs", relative, largest, replayed,
                            f"relative L2 {relative:.3g} > tolerance {tolerance:g}")
    return ReplicaCheck("equal", relative, largest, replayed)


__all__ = ["DEFAULT_TOLERANCE", "ReplicaCheck", "compare", "covers", "expected_replica"]
