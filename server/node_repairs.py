"""The repairs the controller's watermark beats drive on a node: own updates it still lacks after two
beats are sent again, a departed member's updates only this node still holds are handed up, and a
node behind on some origin for two beats re-syncs.

"Behind" is exact only where the missing copies would have come on the controller's own pipe (PLAIN,
or a member whose parent is the controller): the watermark beat travels behind them, so a gap it
shows is a copy that was dropped. A member below another node hears the other origins through that
parent, which the controller's beat may overtake: a parent starved for a few beats (a loaded machine)
but still alive holds the copies, and re-syncing for it downloads the whole model for nothing. There
the gap must also have stood still for the liveness timeout (``heartbeat_s * missed_beats``, on this
node's clock): a parent silent that long is declared offline and this node is given another, and a
gap that outlives it is a loss. Counting beats alone would not do: beats that queued while this node
was starved are read in one burst and span no time.

``BeatRepairs`` owns the last watermarks and when each repair last ran; it is given the node's view,
its update path (the dedup state, the own numbering and the replay ring the re-sends come from) and
its sync path (for the re-sync).
"""

from __future__ import annotations

from collections import deque

from psrv.server.mesh import CONTROLLER_ID
from psrv.server.node_catchup import SyncPath
from psrv.server.node_state import NodeState
from psrv.server.node_updates import UpdatePath
from psrv.server.node_view import NodeView
from psrv.server.updates import batch_message, groups
from psrv.transport.events import Notify, Send
from psrv.transport.messages import Message

__all__ = ["BeatRepairs"]


class BeatRepairs:
    """What the controller's watermark beats set going; see the module docstring."""

    def __init__(self, view: NodeView, updates: UpdatePath, sync: SyncPath) -> None:
        self.view, self.updates, self.sync = view, updates, sync
        # (theirs, own seq, ours, when it arrived), one per watermark beat since the last download
        self._watermarks: deque[tuple[dict, int, dict, float]] = deque(maxlen=self._history())
        self._last_resend = -1e18
        self._last_departed_resend: dict[int, float] = {}  # departed origin -> when we last re-sent for it

    def _history(self) -> int:
        """Beats kept: two beats back, or as many as span the liveness timeout (and a spare)."""
        return max(3, self.view.config.missed_beats + 3)

    def caught_up(self) -> None:
        """A download was installed: the watermarks from before it say nothing about the new replica
        (the pace the join reply set is known by now: the history is sized for it)."""
        self._watermarks = deque(maxlen=self._history())

    def rejoining(self) -> None:
        self._last_departed_resend = {}

    def on_watermarks(self, msg: Message) -> None:
        """The controller's beat with its watermarks, in order with the updates relayed to us on the
        same pipe."""
        view, updates = self.view, self.updates
        latest = {int(k): int(v) for k, v in msg["watermark"].items()}
        view.ctrl_origins = set(latest)
        self._prune_origins(latest)
        view.set_acknowledged(latest.get(view.node_id, 0))
        if updates.resent and updates.acknowledged_former(latest):
            view.emit(Notify("acknowledged"))  # the updates re-sent after a rejoin are in the master copy
        if view.state is not NodeState.RUNNING:
            return
        mine = updates.seen.watermark()
        self._watermarks.append((latest, updates.seq, mine, view.now))
        if len(self._watermarks) < 3:
            return
        # two beats ago; a gap is what is still missing AND not moving: a slow path (a backlog) moves
        old, own_seq_then, _, _ = self._watermarks[-3]
        quiet = view.config.heartbeat_s * view.config.missed_beats
        acknowledged = latest.get(view.node_id, 0)
        stuck = acknowledged == old.get(view.node_id, 0)
        if stuck and acknowledged < own_seq_then and view.now - self._last_resend > quiet:
            self._last_resend = view.now
            self._resend_own(acknowledged, own_seq_then)
        self._resend_departed(latest, old, quiet)
        behind = self._behind(mine, quiet)
        if behind and view.now - self.sync.download.last_sync > quiet:
            view.log.warning("node %d is behind the controller for origins %s: re-syncing", view.node_id,
                             behind[:8])
            self.sync.begin(f"behind for origins {behind[:8]}")

    def _behind(self, mine: dict[int, int], quiet: float) -> list[int]:
        """Origins this node lacks copies of: below the controller's watermark of a beat at least two
        beats back, and not moved since. Below a relay node that beat must also have arrived at least
        ``quiet`` ago (see the module docstring); none that old yet: nothing is called lost."""
        view = self.view
        entries = list(self._watermarks)[:-2]  # at least two beats back, newest last
        mesh = view.mesh
        if mesh is not None and view.node_id in mesh and mesh.parent(view.node_id) != CONTROLLER_ID:
            entries = [e for e in entries if view.now - e[3] >= quiet]
        if not entries:
            return []
        old, _, mine_then, _ = entries[-1]
        return [o for o, w in old.items()
                if o != view.node_id and mine.get(o, 0) < w and mine.get(o, 0) == mine_then.get(o, 0)]

    def _prune_origins(self, latest: dict[int, int]) -> None:
        """Forget what the controller forgot: departed origins no longer in its watermark."""
        view = self.view
        view.recent_origins &= view.ctrl_origins
        kept = view.config.departed_kept_s / 2  # the controller gives a departed member's gaps up by then
        for origin in [o for o, at in view.departed_at.items() if view.now - at > kept]:
            del view.departed_at[origin]
        if view.mesh is None:
            return
        seen = self.updates.seen
        for origin in seen.origins():
            # a departed member the controller never heard from is kept a while: we may hold its updates
            if origin not in latest and origin not in view.mesh and origin != view.node_id \
                    and origin not in view.departed_at:
                seen.forget(origin)

    def _send_up(self, origin: int, acknowledged: int, upto: int) -> int:
        """Send ``origin``'s updates above ``acknowledged`` (up to ``upto``) from the replay ring straight
        to the controller; how many."""
        view = self.view
        again = self.updates.replay.own(origin, acknowledged, upto)
        items = [({"origin": origin, "seq": seq, **fields}, payload) for seq, payload, fields in again]
        for group in groups(items):
            view.emit(Send(CONTROLLER_ID, batch_message(group, view.node_id), count=len(group)))
        return len(again)

    def _resend_own(self, acknowledged: int, upto: int) -> None:
        """Own updates sent two beats ago that the controller still lacks were lost in flight (a full
        queue or a dead relay on the way up): send them again from the replay ring, straight to the
        controller. Not along the mesh: in MESH mode the copy may have died past the first hop, and
        the neighbours that hold it would drop the re-send as a duplicate. The controller applies it
        and relays it to everyone (those who had it drop it as a duplicate)."""
        view = self.view
        count = self._send_up(view.node_id, acknowledged, upto)
        view.counters.add("updates_resent", count)
        view.log.warning("node %d: the controller lacks own updates %d..%d; resent %d from the ring",
                         view.node_id, acknowledged + 1, upto, count)

    def _resend_departed(self, latest: dict[int, int], old: dict[int, int], quiet: float) -> None:
        """Updates of a departed member that this node holds above the controller's watermark for it,
        stuck for two beats: the master lacks them (the member left before re-sending what died on
        its way up, e.g. at a relay's full queue in MESH mode) and nobody else will send them. Send
        them from the replay ring straight to the controller, which accepts a departed member's
        updates from any member while it retires it, applies what it lacks once and relays it on
        (whoever has it drops the copy). The controller gives up a departed member's gaps only
        later (``ControllerMachine``), so what a live replica holds reaches the master first."""
        view = self.view
        if view.mesh is None:
            return
        seen = self.updates.seen
        for origin in seen.origins():
            if origin == view.node_id or origin in view.mesh:
                continue
            mark = latest.get(origin)
            if mark is None and origin in view.departed_at:  # the controller never heard from it
                mark = 0
            if mark is None or mark != old.get(origin, 0):  # pruned already, or still moving
                continue
            top = seen.top_of(origin)
            if top <= mark or view.now - self._last_departed_resend.get(origin, -1e18) <= quiet:
                continue
            self._last_departed_resend[origin] = view.now
            view.counters.add("departed_resent", self._send_up(origin, mark, top))
        forgotten = [o for o in self._last_departed_resend if o not in latest and o not in view.departed_at]
        for origin in forgotten:  # the controller forgot it: so do we
            del self._last_departed_resend[origin]
