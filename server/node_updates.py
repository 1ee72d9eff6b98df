"""The node's update path: own updates numbered and sent out, received ones checked, deduplicated,
relayed (never back where they came from) and applied once, and the rows held for a newer mesh view.

``UpdatePath`` owns what only it changes: the own numbering (``seq``), the dedup state (``seen``),
the replay ring (``replay``), the backlog submitted while (re)joining, the own updates gathered for
one batch, the rows waiting for a newer view, and the ids held before a rejoin (``former``) whose
unacknowledged updates the catch-up re-applies and re-sends (``rebase``). It reads the node's shared
view (server/node_view.py) and emits its actions there: with ``params_outside`` every apply is an
``Apply`` action (the facade carries it out where the live parameters are), else updates are decoded
into the view's ``params``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.server.dedup import SeenUpdates
from psrv.server.mesh import CONTROLLER_ID
from psrv.server.node_guard import HeldQueue, origin_allowed, patience_s
from psrv.server.node_state import NodeState, SlotToken
from psrv.server.node_view import NodeView
from psrv.server.replay import Entry, ReplayLog
from psrv.server.seen import covered, restore
from psrv.server.update_intake import apply_checked, check_row, first_arrival
from psrv.server.updates import batch_message, groups, unbatch
from psrv.transport.errors import FrameRejectedError
from psrv.transport.events import Apply, ReleaseSlots, Send, Submit
from psrv.transport.messages import Message

__all__ = ["UpdatePath"]

Fresh = list[tuple[dict, Any, np.ndarray]]  # (fields, buffer, payload) rows seen for the first time


class UpdatePath:
    """Own updates out, received updates in; see the module docstring."""

    def __init__(self, view: NodeView, params_outside: bool) -> None:
        self.view = view
        self.params_outside = params_outside
        config = view.config
        self.seen = SeenUpdates(config.dedup_window)
        self.replay = ReplayLog(config.replay_ring_messages, config.replay_ring_bytes)
        self.seq = 0
        self.submitted_seq = 0  # what the last Submit was numbered (0: kept in the backlog)
        self.backlog: list[tuple[np.ndarray, dict]] = []
        self.gathered: list[dict] = []  # own updates of submits with ``more`` set
        self.last_applied_now: float | None = None  # driver time of the last applied update
        self._stale: HeldQueue[tuple[dict, Any, np.ndarray, int, int]] = HeldQueue()  # bad_origin rows
        # the ids this process held before a rejoin -> the highest seq it numbered under each; their
        # unacknowledged updates stay in the ring until the controller holds them (``resent``)
        self.former: dict[int, int] = {}
        self.resent: dict[int, int] = {}  # former id -> the highest seq re-sent, until acknowledged

    # ------------------------------------------------------------------ membership changes
    def rejoining(self) -> None:
        """A new membership: nothing of the old one is relayed or deduplicated against, and of the ring
        only the own updates the controller has not acknowledged stay (``former``): the catch-up
        re-sends those the master copy lacks (``rebase``)."""
        view = self.view
        self._stale.clear()
        if view.node_id > 0 and self.seq:
            self.former[view.node_id] = self.seq
        acknowledged = {view.node_id: view.acknowledged}
        self.replay.keep_only(lambda o, s: o in self.former and s > acknowledged.get(o, 0))
        self.seen = SeenUpdates(view.config.dedup_window)

    def stopping(self) -> int:
        """Drop what was never sent; the number of submit slots those updates held."""
        self.backlog.clear()
        slots = sum(1 for item in self.gathered if item.get("slot"))
        self.gathered = []
        return slots

    # ------------------------------------------------------------------ own updates
    def submit(self, event: Submit) -> None:
        """Number and remember one checked own update (applied locally already), then send it (or
        gather it while ``more`` says another follows); while (re)joining keep it in the backlog."""
        view = self.view
        if view.state is NodeState.RUNNING:
            self.seq += 1
            self.submitted_seq = self.seq
            self.replay.remember(view.node_id, self.seq, event.payload, event.fields)
            self.gathered.append({"origin": view.node_id, "seq": self.seq, "payload": event.payload,
                                  "fields": event.fields, "slot": event.slot})
            if not event.more:
                self.flush_gathered()
            return
        self.submitted_seq = 0
        self.backlog.append((event.payload, event.fields))
        if len(self.backlog) > view.config.replay_ring_messages:
            # dropped consistently: the catch-up replaces the parameters it was applied to
            del self.backlog[0]
            view.counters.add("backlog_dropped")
        if event.slot:
            view.emit(ReleaseSlots(1))

    def flush_gathered(self) -> None:
        items, self.gathered = self.gathered, []
        self.send_own(items)

    def send_backlog(self) -> None:
        """After a catch-up: apply, number and send what was submitted while joining (its local apply
        was just overwritten by the master copy)."""
        backlog, self.backlog = self.backlog, []
        sends = []
        for payload, fields in backlog:
            self.apply_local(payload)
            self.seq += 1
            self.replay.remember(self.view.node_id, self.seq, payload, fields)
            sends.append({"origin": self.view.node_id, "seq": self.seq, "payload": payload, "fields": fields})
        if sends:
            self.send_own(sends)

    def send_own(self, items: list[dict]) -> None:
        """Send own updates (batched when several queued up); see batch.py."""
        view = self.view
        ready: list[tuple[dict, np.ndarray, bool]] = []
        for item in items:
            if item["origin"] != view.node_id or view.mesh is None:
                if item.get("slot"):
                    view.emit(ReleaseSlots(1))
                continue  # submitted before a rejoin: the re-sync replaced the params it was applied to
            self.seen.first_time(item["origin"], item["seq"])
            ready.append(({"origin": item["origin"], "seq": item["seq"], **item["fields"]}, item["payload"],
                          bool(item.get("slot"))))
        if not ready:
            return
        targets = view.mesh.relay_targets(view.node_id, came_from=None)
        for group in groups(ready, size_of=lambda item: item[1].nbytes):
            slots = sum(1 for _, _, holds in group if holds)
            token = None
            if slots and targets:
                token = SlotToken(len(targets), slots)
            elif slots:
                view.emit(ReleaseSlots(slots))
            self._relay([(fields, payload) for fields, payload, _ in group], came_from=None, token=token)
            view.counters.add("updates_sent", len(group))

    def _relay(
        self, items: list[tuple[dict, Any]], came_from: int | None, token: SlotToken | None = None
    ) -> None:
        """Send ``(fields, buffer)`` updates to every neighbour but ``came_from`` (None: our own,
        never dropped; relayed copies are droppable)."""
        view = self.view
        own = came_from is None
        for target in view.mesh.relay_targets(view.node_id, came_from=came_from):
            if target != CONTROLLER_ID and target not in view.peers:
                if token is not None and token.sent():
                    view.emit(ReleaseSlots(token.count))
                continue
            for group in groups(items) if token is None else [items]:
                view.emit(Send(target, batch_message(group, view.node_id), droppable=not own, token=token,
                               count=len(group)))
                if not own:
                    view.counters.add("updates_relayed", len(group))

    # ------------------------------------------------------------------ received updates
    def on_update(self, msg: Message) -> None:
        """An UPDATE or UPDATES from a member (authenticated): its fresh rows relayed and applied."""
        if self.view.state is NodeState.JOINING:
            return
        fresh = self._fresh_updates(msg)
        if fresh:
            self._take(fresh, msg.src)

    def _take(self, fresh: Fresh, came_from: int) -> None:
        """Relay and apply (or, while downloading, hold) updates seen for the first time."""
        self._relay([(f, b) for f, b, _ in fresh], came_from=came_from)
        if self.view.state is NodeState.SYNCING:
            for fields, _, payload in fresh:
                if not self.replay.hold(fields["origin"], fields["seq"], payload, fields):
                    self.view.counters.add("updates_dropped_backpressure")
            return
        self._apply_fresh([(fields, payload) for fields, _, payload in fresh])

    def _fresh_updates(self, msg: Message) -> Fresh:
        """The rows of an UPDATE(S) that fit this model and arrive for the first time; a bad row is a
        counted rejection, a repeat a counted duplicate, and a row of an origin our mesh view does not
        explain yet waits for a newer MESH (see node_guard.py)."""
        view = self.view
        fresh = []
        for fields, buffer in unbatch(msg):
            try:
                payload = check_row(fields, buffer, self.seen, view.params.size, view.config.max_tau)
                if fields["origin"] == view.node_id and self.seen.seen(view.node_id, fields["seq"]):
                    # our own update back from the controller's relay of a re-send: a duplicate; an own
                    # seq we never sent is forged (it would be applied twice) and refused below
                    self._first_time(fields)
                    continue
                if not self._origin_ok(fields["origin"], msg.src):
                    if fields["origin"] != view.node_id and self._stale.hold(
                        view.now, (fields, buffer, payload, msg.src, view.mesh.version)
                    ):
                        view.counters.add("held_stale_mesh")
                        continue
                    raise FrameRejectedError("bad_origin", f"update of origin {fields['origin']} from "
                                             f"{msg.src}: not a member it may relay")
            except FrameRejectedError as exc:
                view.reject(exc.reason, exc.detail)
                continue
            if self._first_time(fields):
                fresh.append((fields, buffer, payload))
        return fresh

    def _first_time(self, fields: dict) -> bool:
        return first_arrival(fields, self.seen, self.view.counters)

    def _origin_ok(self, origin: int, came_from: int) -> bool:
        view = self.view
        return origin_allowed(view.mesh, view.node_id, origin, came_from, view.allowed_departed())

    def release_stale(self) -> None:
        """A newer view arrived (or time passed): take the held rows it explains, refuse the ones
        that waited too long."""
        view = self.view
        if not len(self._stale) or view.mesh is None:
            return
        wait = patience_s(view.config.heartbeat_s)
        version = view.mesh.version
        ready, expired = self._stale.release(
            view.now, wait, lambda r: r[4] < version and self._origin_ok(r[0]["origin"], r[3]))
        for fields, _, _, came_from, _ in expired:
            view.reject("bad_origin", f"update of origin {fields['origin']} from {came_from}: not a "
                        f"member it may relay (held {wait:.1f} s for a newer mesh)")
        for fields, buffer, payload, came_from, _ in ready:
            if view.state is not NodeState.JOINING and self._first_time(fields):
                self._take([(fields, buffer, payload)], came_from)

    # ------------------------------------------------------------------ applying
    def rebase(self, watermark: dict[int, int], extra: dict[int, list[int]],
               given_up: dict[int, list[int]] | None = None) -> tuple[int, list[int]]:
        """The master copy (including ``watermark`` and ``extra``) was just installed: replay the updates
        applied here that it lacks, apply those held during the download that it lacks, and deduplicate
        from now on against it. Own updates of a former id whose seq the controller gave up (``given_up``:
        the master never held them and refuses that (origin, seq) now) go to the backlog, sent as new
        updates of this id. Returns (how many were replayed, origins the ring was too short for)."""
        extra_sets = {o: set(s) for o, s in extra.items()}
        replayed = 0
        incomplete = self.replay.incomplete(watermark)
        seen = restore(self.view.config.dedup_window, watermark, extra)
        former, renumbered = self._former_missing(watermark, extra_sets, given_up or {})
        self._renumber(renumbered)
        for origin, seq, payload, fields in self.replay.missing_from(watermark, extra_sets):
            self._apply_update(payload, fields)  # applied here, not (yet) in the master copy
            seen.first_time(origin, seq)
            replayed += 1
        for origin, seq, payload, fields in former:
            self._apply_update(payload, fields)  # lost with the old membership: re-applied, re-sent below
            seen.first_time(origin, seq)
            self.replay.remember(origin, seq, payload, fields)
            replayed += 1
        held = [(fields, payload) for origin, seq, payload, fields in self.replay.take_held()  # (download)
                if seen.first_time(origin, seq)]
        self._apply_fresh(held)
        self.seen = seen
        self._resend_former(former)
        return replayed, incomplete

    def _former_missing(
        self, watermark: dict[int, int], extra: dict[int, set[int]], given_up: dict[int, list[int]]
    ) -> tuple[list[Entry], list[Entry]]:
        """The own updates of former ids (taken out of the ring) that the downloaded copy lacks: those
        the controller still accepts under their (origin, seq) (it counts a departed member's origin,
        in the watermark, until ``departed_kept_s`` after it left), and those whose seq it gave up. The
        others are counted ``own_updates_lost`` and logged."""
        view = self.view
        taken = self.replay.take(set(self.former))
        gave_up = {o: set(s) for o, s in given_up.items() if o in self.former}
        renumbered = [e for e in taken if e[1] in gave_up.get(e[0], ())]
        missing = [e for e in taken
                   if e[1] not in gave_up.get(e[0], ()) and not covered(watermark, extra, e[0], e[1])]
        lost = sum(len(seqs) - sum(1 for e in renumbered if e[0] == o)  # given up and not in the ring
                   for o, seqs in gave_up.items() if self.former[o])  # (0: counted at an earlier download)
        for origin, top in list(self.former.items()):
            ours = {s for o, s, _, _ in missing if o == origin}
            if not self._counted(origin, watermark):  # forgotten by the controller: it refuses them now
                lost += len(ours)
                del self.former[origin]
                missing = [e for e in missing if e[0] != origin]
                continue
            gone = [s for s in range(watermark.get(origin, 0) + 1, top + 1)
                    if s not in extra.get(origin, ()) and s not in ours and s not in gave_up.get(origin, ())]
            lost += len(gone)
            if not ours:
                del self.former[origin]
            else:
                self.former[origin] = 0  # its range is checked: a later download counts nothing again
        if lost:
            view.counters.add("own_updates_lost", lost)
            view.log.error("node %d: %d own update(s) of before the rejoin cannot be delivered (the replay "
                           "ring was too short, or the controller forgot the old id: departed_kept_s)",
                           view.node_id, lost)
        return missing, renumbered

    def _renumber(self, entries: list[Entry]) -> None:
        """Own updates of a former id that the controller gave up: into the backlog, which the catch-up
        applies, numbers under this id and sends right after (each is applied once: the old (origin,
        seq) is refused everywhere the master's watermark reached, and the master never held it)."""
        if not entries:
            return
        self.backlog[:0] = [(payload, fields) for _, _, payload, fields in entries]
        self.view.counters.add("updates_renumbered_after_rejoin", len(entries))
        self.view.log.warning("node %d: %d own update(s) of its former id(s) %s were given up by the "
                              "controller; sending them again under this id", self.view.node_id,
                              len(entries), sorted({e[0] for e in entries}))

    def _counted(self, origin: int, watermark: dict[int, int]) -> bool:
        """Does the controller still count ``origin``: in its watermark, or a member of the mesh (the
        controller has not noticed yet that its node left: it accepts the re-sends once it has, and the
        beat repairs send them again then)?"""
        mesh = self.view.mesh
        return origin in watermark or (mesh is not None and origin in mesh)

    def _resend_former(self, entries: list[Entry]) -> None:
        """Send the re-applied updates of former ids straight to the controller, under their own
        (origin, seq): it accepts a departed member's updates while it retires it, applies each once
        and relays it (whoever holds it already drops the copy); a re-send that is lost again is
        repeated by the beat repairs (``BeatRepairs``), as for any departed origin."""
        if not entries:
            return
        view = self.view
        for origin, seq, _, _ in entries:
            self.resent[origin] = max(self.resent.get(origin, 0), seq)
        items = [({"origin": o, "seq": s, **f}, p) for o, s, p, f in entries]
        for group in groups(items):
            view.emit(Send(CONTROLLER_ID, batch_message(group, view.node_id), count=len(group)))
        view.counters.add("updates_resent_after_rejoin", len(entries))
        view.log.warning("node %d: re-sent %d own update(s) of its former id(s) %s that the master copy "
                         "lacked", view.node_id, len(entries), sorted({e[0] for e in entries}))

    def acknowledged_former(self, watermark: dict[int, int]) -> bool:
        """The controller's watermarks arrived: forget the re-sent updates they hold (or can no longer
        hold: an origin it forgot). True when something changed."""
        done = [o for o, top in self.resent.items()
                if watermark.get(o, 0) >= top or not self._counted(o, watermark)]
        for origin in done:
            del self.resent[origin]
            self.former.pop(origin, None)
        return bool(done)

    def _apply_fresh(self, rows: list[tuple[dict, np.ndarray]]) -> None:
        """Apply received updates seen for the first time (checked whole at intake, so none fails),
        count them and remember them for replays."""
        if not rows:
            return
        if self.params_outside:
            self.view.emit(Apply(tuple(p for _, p in rows), tuple(f for f, _ in rows)))
        for fields, payload in rows:
            if not self.params_outside:
                apply_checked(payload, self.view.params)
            self.view.counters.applied(fields["origin"])
            self.replay.remember(fields["origin"], fields["seq"], payload, fields)
        self.last_applied_now = self.view.now

    def _apply_update(self, payload: np.ndarray, header: dict) -> None:
        """Apply one checked update (a replay) without counting it."""
        if self.params_outside:
            self.view.emit(Apply((payload,), (header,)))
        else:
            apply_checked(payload, self.view.params)

    def apply_local(self, payload: np.ndarray) -> None:
        """Apply an own update (checked whole when it was submitted) to the live parameters: those
        of the backlog after a catch-up, whose first local apply the download overwrote."""
        self._apply_update(payload, {})
