"""The update path of ``NodeMachine``: own updates out, received ones checked, deduplicated, relayed
(never back where they came from) and applied once, and the rows held for a newer mesh view.

A mixin of server/node_machine.py (it uses the machine's state: ``mesh``, ``seen``, ``replay``,
``counters_``, ``_emit``...); split out to keep each module one job and short.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import psrv.encoding as encoding
from psrv.server.mesh import CONTROLLER_ID
from psrv.server.node_guard import origin_allowed, patience_s
from psrv.server.node_state import NodeState, SlotToken
from psrv.server.update_intake import apply_once, check_row, first_arrival
from psrv.server.updates import batch_message, groups, unbatch
from psrv.transport.errors import FrameRejectedError
from psrv.transport.events import ReleaseSlots, Send
from psrv.transport.messages import Message

__all__ = ["UpdatePath"]


class UpdatePath:
    """Own updates out, received updates in; see the module docstring."""

    def _send_own(self, items: list[dict]) -> None:
        """Send own updates (batched when several queued up); see batch.py."""
        ready: list[tuple[dict, np.ndarray, bool]] = []
        for item in items:
            if item["origin"] != self.node_id or self.mesh is None:
                if item.get("slot"):
                    self._emit(ReleaseSlots(1))
                continue  # submitted before a rejoin: the re-sync replaced the params it was applied to
            self.seen.first_time(item["origin"], item["seq"])
            ready.append(({"origin": item["origin"], "seq": item["seq"], **item["fields"]}, item["payload"],
                          bool(item.get("slot"))))
        if not ready:
            return
        targets = self.mesh.relay_targets(self.node_id, came_from=None)
        for group in groups(ready, size_of=lambda item: item[1].nbytes):
            slots = sum(1 for _, _, holds in group if holds)
            token = None
            if slots and targets:
                token = SlotToken(len(targets), slots)
            elif slots:
                self._emit(ReleaseSlots(slots))
            self._relay([(fields, payload) for fields, payload, _ in group], came_from=None, token=token)
            self.counters_.add("updates_sent", len(group))

    def _relay(
        self, items: list[tuple[dict, Any]], came_from: int | None, token: SlotToken | None = None
    ) -> None:
        """Send ``(fields, buffer)`` updates to every neighbour but ``came_from`` (None: our own,
        never dropped; relayed copies are droppable)."""
        own = came_from is None
        for target in self.mesh.relay_targets(self.node_id, came_from=came_from):
            if target != CONTROLLER_ID and target not in self._peers:
                if token is not None and token.sent():
                    self._emit(ReleaseSlots(token.count))
                continue
            for group in groups(items) if token is None else [items]:
                self._emit(Send(target, batch_message(group, self.node_id), droppable=not own, token=token,
                                count=len(group)))
                if not own:
                    self.counters_.add("updates_relayed", len(group))

    def _resend_own(self, acknowledged: int, upto: int) -> None:
        """Own updates sent two beats ago that the controller still lacks were lost in flight (a full
        queue or a dead relay on the way up): send them again from the replay ring, straight to the
        controller. Not along the mesh: in MESH mode the copy may have died past the first hop, and
        the neighbours that hold it would drop the re-send as a duplicate. The controller applies it
        and relays it to everyone (those who had it drop it as a duplicate)."""
        again = self.replay.own(self.node_id, acknowledged, upto)
        items = [({"origin": self.node_id, "seq": seq, **fields}, payload) for seq, payload, fields in again]
        for group in groups(items):
            self._emit(Send(CONTROLLER_ID, batch_message(group, self.node_id), count=len(group)))
        self.counters_.add("updates_resent", len(again))
        self.log.warning("node %d: the controller lacks own updates %d..%d; resent %d from the ring",
                         self.node_id, acknowledged + 1, upto, len(again))

    def _resend_departed(self, latest: dict[int, int], old: dict[int, int], quiet: float) -> None:
        """Updates of a departed member that this node holds above the controller's watermark for it,
        stuck for two beats: the master lacks them (the member left before re-sending what died on
        its way up, e.g. at a relay's full queue in MESH mode) and nobody else will send them. Send
        them from the replay ring straight to the controller, which accepts a departed member's
        updates from any member while it retires it, applies what it lacks once and relays it on
        (whoever has it drops the copy). The controller gives up a departed member's gaps only
        later (``ControllerMachine``), so what a live replica holds reaches the master first."""
        if self.mesh is None:
            return
        for origin in self.seen.origins():
            if origin == self.node_id or origin in self.mesh:
                continue
            mark = latest.get(origin)
            if mark is None and origin in self._departed_at:  # the controller never heard from it
                mark = 0
            if mark is None or mark != old.get(origin, 0):  # pruned already, or still moving
                continue
            top = self.seen.top_of(origin)
            if top <= mark or self._now - self._last_departed_resend.get(origin, -1e18) <= quiet:
                continue
            self._last_departed_resend[origin] = self._now
            again = self.replay.own(origin, mark, top)
            items = [({"origin": origin, "seq": seq, **fields}, payload) for seq, payload, fields in again]
            for group in groups(items):
                self._emit(Send(CONTROLLER_ID, batch_message(group, self.node_id), count=len(group)))
            self.counters_.add("departed_resent", len(again))
        forgotten = [o for o in self._last_departed_resend if o not in latest and o not in self._departed_at]
        for origin in forgotten:  # the controller forgot it: so do we
            del self._last_departed_resend[origin]

    def _take(self, fresh: list[tuple[dict, Any, np.ndarray]], came_from: int) -> None:
        """Relay and apply (or, while downloading, hold) updates seen for the first time."""
        self._relay([(f, b) for f, b, _ in fresh], came_from=came_from)
        if self.state is NodeState.SYNCING:
            for fields, _, payload in fresh:
                if not self.replay.hold(fields["origin"], fields["seq"], payload, fields):
                    self.counters_.add("updates_dropped_backpressure")
            return
        if self._apply_many is not None and len(fresh) > 1:
            self._apply_batch(fresh)
            return
        for fields, _, payload in fresh:
            if self._apply_counted(payload, fields):
                self.replay.remember(fields["origin"], fields["seq"], payload, fields)

    def _fresh_updates(self, msg: Message) -> list[tuple[dict, Any, np.ndarray]]:
        """The rows of an UPDATE(S) as ``(fields, buffer, payload)`` that fit this model and arrive for
        the first time; a bad row is a counted rejection, a repeat a counted duplicate, and a row of an
        origin our mesh view does not explain yet waits for a newer MESH (see node_guard.py)."""
        fresh = []
        for fields, buffer in unbatch(msg):
            try:
                payload = self._fits(fields, buffer)
                if fields["origin"] == self.node_id and self.seen.seen(self.node_id, fields["seq"]):
                    # our own update back from the controller's relay of a re-send: a duplicate; an own
                    # seq we never sent is forged (it would be applied twice) and refused below
                    self._first_time(fields)
                    continue
                if not self._origin_ok(fields["origin"], msg.src):
                    if fields["origin"] != self.node_id and self._stale.hold(
                        self._now, (fields, buffer, payload, msg.src, self.mesh.version)
                    ):
                        self.counters_.add("held_stale_mesh")
                        continue
                    raise FrameRejectedError("bad_origin", f"update of origin {fields['origin']} from "
                                             f"{msg.src}: not a member it may relay")
            except FrameRejectedError as exc:
                self._reject(exc.reason, exc.detail)
                continue
            if self._first_time(fields):
                fresh.append((fields, buffer, payload))
        return fresh

    def _fits(self, fields: dict, buffer: Any) -> np.ndarray:
        return check_row(fields, buffer, self.seen, self.params.size, self.config.max_tau)

    def _first_time(self, fields: dict) -> bool:
        return first_arrival(fields, self.seen, self.counters_)

    def _origin_ok(self, origin: int, came_from: int) -> bool:
        return origin_allowed(self.mesh, self.node_id, origin, came_from,
                              self._recent_origins | self._ctrl_origins)

    def _release_held(self) -> None:
        """A newer view arrived (or time passed): handle what it explains, refuse what waited too long."""
        wait = patience_s(self.config.heartbeat_s)
        if len(self._unknown):
            ready, expired = self._unknown.release(
                self._now, wait, lambda e: self._routes.sender(e.routing_id) is not None)
            for event in expired:
                self._reject("bad_sender", f"{event.message.op} claiming node {event.message.src} from a "
                             f"connection never announced within {wait:.1f} s")
            for event in ready:
                self._on_received(event, held=True)
        if len(self._stale) and self.mesh is not None:
            version = self.mesh.version
            ready, expired = self._stale.release(
                self._now, wait, lambda r: r[4] < version and self._origin_ok(r[0]["origin"], r[3]))
            for fields, _, _, came_from, _ in expired:
                self._reject("bad_origin", f"update of origin {fields['origin']} from {came_from}: not a "
                             f"member it may relay (held {wait:.1f} s for a newer mesh)")
            for fields, buffer, payload, came_from, _ in ready:
                if self.state is not NodeState.JOINING and self._first_time(fields):
                    self._take([(fields, buffer, payload)], came_from)

    def _apply_batch(self, fresh: list[tuple[dict, Any, np.ndarray]]) -> None:
        """Several updates through the ``apply_many`` hook, counted like one by one."""
        results = self._apply_many([p for _, _, p in fresh], [f for f, _, _ in fresh])
        for (fields, _, payload), error in zip(fresh, results, strict=True):
            if error is not None:
                self._reject("bad_payload", f"update {fields.get('origin')}/{fields.get('seq')}: {error}")
                continue
            self.counters_.applied(fields["origin"])
            self.last_applied_now = self._now
            self.replay.remember(fields["origin"], fields["seq"], payload, fields)

    def _apply_counted(self, payload: np.ndarray, fields: dict) -> bool:
        """Apply one received update and count it; one that does not decode is a counted rejection."""
        try:
            self._apply_update(payload, fields)
        except FrameRejectedError as exc:
            self._reject(exc.reason, exc.detail)
            return False
        self.counters_.applied(fields["origin"])
        self.last_applied_now = self._now
        return True

    def _apply_update(self, payload: np.ndarray, header: dict) -> None:
        apply_once(payload, header, hook=self._apply_hook, params=self.params)

    def apply_local(self, payload: np.ndarray) -> None:
        """Apply an own update to the live parameters (``submit(apply_locally=True)``; the caller
        holds the facade's lock), through the ``apply`` hook when the parameters live behind it."""
        if self._apply_hook is not None:  # the live parameters are behind the hook
            self._apply_hook(payload, {})
            return
        encoding.decode(payload, self.params)

    _decode_local = apply_local  # (the name the simulation adapters use)
