"""The controller's master copy: every update applied to it exactly once, and snapshots of it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from psrv.server.dedup import SeenUpdates
from psrv.server.downloads import MasterSnapshot
from psrv.server.update_intake import apply_checked, check_row, first_arrival
from psrv.server.updates import unbatch
from psrv.server.warmup import params_checksum
from psrv.transport.config import TransportConfig
from psrv.transport.counters import Counters
from psrv.transport.errors import FrameRejectedError
from psrv.transport.events import Apply
from psrv.transport.messages import Message

__all__ = ["MasterCopy", "Reject"]

Reject = Callable[[str, str], None]


class MasterCopy:
    """The parameters (updated in place; the facade holds its lock around every event), the optional
    updater state, and ``seen``, the exactly-once filter of what was applied. ``params_outside``:
    the updates are handed out as ``Apply`` actions instead of decoded into ``params`` (the live
    parameters are elsewhere, or a simulation records each one)."""

    def __init__(
        self,
        config: TransportConfig,
        params: np.ndarray,
        *,
        updater_state: np.ndarray | None,
        params_outside: bool,
        counters: Counters | None,
        wall_clock: Callable[[], float] | None,
    ) -> None:
        self.config = config
        self.params = params
        self.updater_state = updater_state
        self.counters = counters if counters is not None else Counters()
        self.wall_clock = wall_clock or (lambda: 0.0)
        self.seen = SeenUpdates(config.dedup_window)
        self.params_outside = params_outside

    def fresh_updates(
        self, msg: Message, origin_allowed: Callable[[int, int], bool], reject: Reject
    ) -> list[tuple[dict, Any, np.ndarray]]:
        """The rows of an UPDATE(S) message as ``(fields, buffer, payload)`` that fit this model and
        arrive for the first time; a bad row is a counted rejection, a repeat a counted duplicate."""
        fresh = []
        for fields, buffer in unbatch(msg):
            origin = fields["origin"]
            try:
                if not origin_allowed(origin, msg.src):
                    raise FrameRejectedError(
                        "bad_origin", f"update of origin {origin} from {msg.src}: not a member it may relay"
                    )
                payload = check_row(fields, buffer, self.seen, self.params.size, self.config.max_tau)
            except FrameRejectedError as exc:
                reject(exc.reason, exc.detail)
                continue
            if first_arrival(fields, self.seen, self.counters):
                fresh.append((fields, buffer, payload))
        return fresh

    def apply(self, fresh: list[tuple[dict, Any, np.ndarray]]) -> Apply | None:
        """Apply the rows ``fresh_updates`` let through and count them: decoded into ``params``, or
        (``params_outside``) the ``Apply`` action that carries them out."""
        if not fresh:
            return None
        for fields, _, payload in fresh:
            if not self.params_outside:
                apply_checked(payload, self.params)
            self.counters.applied(fields["origin"])
        self.counters.gauges["last_applied_at"] = self.wall_clock()  # when the last update arrived
        if self.params_outside:
            return Apply(tuple(p for _, _, p in fresh), tuple(f for f, _, _ in fresh))
        return None

    def snapshot(self, version: int, want_updater: bool, members: dict[int, int]) -> MasterSnapshot:
        """A read-only copy with the exact set of updates it holds; ``members``: id -> dropped so far."""
        params = self.params.copy()
        updater = self.updater_state.copy() if want_updater else None
        params.flags.writeable = False
        if updater is not None:
            updater.flags.writeable = False
        return MasterSnapshot(
            params, updater, self.seen.watermark(), self.seen.above_watermark(), version, members
        )

    def counters_with_checksum(self, address: str) -> dict[str, Any]:
        snap = self.counters.snapshot()
        snap["node_id"] = 0
        snap["address"] = address
        snap.update(params_checksum(self.params))
        snap["checksum_updates"] = self.counters["updates_applied"]
        return snap
