"""Liveness rules both roles share, as plain objects that are told the time (``now``, monotonic
seconds) on every call: no clock, no thread, so the state machines and the simulation use them as is.

- ``BeatTimer``: when this process sends its next beat (the first one is due at once).
- ``Members`` (controller side): which members are alive. Any message from a member counts as a
  beat; one silent for MORE than ``heartbeat_s * missed_beats`` is reported once by ``expire``.
- ``PeerWatch`` (node side): has one peer (the controller) been silent for more than ``timeout_s``?
- ``FreezeGuard``: "this process was frozen": a gap between two of its own ticks longer than two
  beats was its own silence (SIGSTOP, swapping, a loaded machine), not the others'; the role then
  does not count that silence against anyone (the controller excuses every member, a node checks
  in with the controller before deciding it lost it).

"""

from __future__ import annotations

from enum import StrEnum

from psrv.server.clock_offset import CLOCK_ECHO
from psrv.server.mesh import CONTROLLER_ID
from psrv.transport.events import Reply, Send
from psrv.transport.messages import Message, Op

__all__ = [
    "BeatTimer", "FreezeGuard", "Members", "MemberState", "PeerWatch", "FROZEN_BEATS", "controller_beats",
]

FROZEN_BEATS = 2.0  # a tick gap longer than this many beats means this process was frozen


class MemberState(StrEnum):
    ONLINE = "online"
    OFFLINE = "offline"


def _positive(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


class BeatTimer:
    """``due(now)`` is True at most once per ``interval_s``; the first beat is due at once."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = _positive("interval_s", interval_s)
        self._next: float | None = None
        self.lateness_s = 0.0  # how late the last granted beat was (a busy loop shows here)

    def due(self, now: float) -> bool:
        if self._next is not None and now < self._next:
            return False
        self.lateness_s = 0.0 if self._next is None else now - self._next
        self._next = now + self.interval_s
        return True

    def remaining(self, now: float) -> float:
        """Seconds until the next beat is due (0 when due now)."""
        return 0.0 if self._next is None else max(0.0, self._next - now)

    def reset(self, now: float) -> None:
        """Count the interval from ``now``."""
        self._next = now + self.interval_s


class Members:
    """Controller-side liveness of every member it has heard of (ids are ints: deterministic order)."""

    def __init__(self, heartbeat_s: float = 1.0, missed_beats: int = 3) -> None:
        self.heartbeat_s = _positive("heartbeat_s", heartbeat_s)
        if isinstance(missed_beats, bool) or not isinstance(missed_beats, int) or missed_beats < 1:
            raise ValueError(f"missed_beats must be an int >= 1, got {missed_beats!r}")
        self.missed_beats = missed_beats
        self._last_heard: dict[int, float] = {}
        self._state: dict[int, MemberState] = {}

    @property
    def timeout_s(self) -> float:
        """Silence longer than this marks a member offline."""
        return self.heartbeat_s * self.missed_beats

    def heard(self, node_id: int, now: float) -> None:
        """Any message counts as a beat; an unknown or OFFLINE member becomes ONLINE."""
        self._last_heard[node_id] = now
        self._state[node_id] = MemberState.ONLINE

    joined = heard

    def left(self, node_id: int) -> None:
        """It said goodbye: OFFLINE now; ``expire`` will not report it."""
        if node_id in self._state:
            self._state[node_id] = MemberState.OFFLINE

    def forget(self, node_id: int) -> None:
        self._state.pop(node_id, None)
        self._last_heard.pop(node_id, None)

    def expire(self, now: float) -> list[int]:
        """Ids silent for more than ``timeout_s``, now OFFLINE; each reported once, ascending."""
        limit = self.timeout_s
        gone = sorted(
            nid for nid, state in self._state.items()
            if state is MemberState.ONLINE and now - self._last_heard[nid] > limit
        )
        for nid in gone:
            self._state[nid] = MemberState.OFFLINE
        return gone

    def excuse(self, now: float) -> None:
        """This process was frozen: every ONLINE member counts as heard now (their beats may still
        wait unread in the sockets)."""
        for nid, state in self._state.items():
            if state is MemberState.ONLINE:
                self._last_heard[nid] = now

    def state(self, node_id: int) -> MemberState:
        return self._state.get(node_id, MemberState.OFFLINE)

    def online(self) -> list[int]:
        return sorted(nid for nid, s in self._state.items() if s is MemberState.ONLINE)

    def known(self) -> list[int]:
        return sorted(self._state)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._state

    def silent_for(self, node_id: int, now: float) -> float:
        """Seconds since the member was last heard (KeyError if never heard)."""
        return now - self._last_heard[node_id]


class PeerWatch:
    """Node-side: notices when one peer (the controller) has gone silent for more than ``timeout_s``."""

    def __init__(self, timeout_s: float, now: float) -> None:
        self.timeout_s = _positive("timeout_s", timeout_s)
        self._last = now

    def heard(self, now: float) -> None:
        self._last = now

    def silent_for(self, now: float) -> float:
        return now - self._last

    def lost(self, now: float) -> bool:
        return now - self._last > self.timeout_s

    def remaining(self, now: float) -> float:
        return max(0.0, self.timeout_s - (now - self._last))


class FreezeGuard:
    """Tells a role, tick by tick, whether the time since its previous tick was its own silence."""

    def __init__(self, heartbeat_s: float, now: float | None = None) -> None:
        self.heartbeat_s = _positive("heartbeat_s", heartbeat_s)
        self._last = now

    def frozen_for(self, now: float) -> float:
        """The gap since the previous call when it exceeds ``FROZEN_BEATS`` beats (this process was
        frozen: excuse the others), else 0.0. The first call only starts the count."""
        last, self._last = self._last, now
        if last is None:
            return 0.0
        gap = now - last
        return gap if gap > FROZEN_BEATS * self.heartbeat_s else 0.0

    def restart(self, now: float) -> None:
        """Count from ``now`` (e.g. the loop just started: a warm-up before it was not a freeze)."""
        self._last = now


def controller_beats(
    member_ids: list[int], routing: dict[int, bytes], mesh_version: int, watermark: dict[int, int],
    clock_echoes: dict[int, list[float]] | None = None,
) -> list[Reply | Send]:
    """The controller's two beats per member. The liveness beat travels on its own path: back through
    the ROUTER on the connection the member joined from (``routing``; it carries only replies), never
    behind the relayed updates and download pieces queued on the controller's connection to it. The
    beat with the watermarks stays on that data connection, in order with the relayed updates: a
    node compares its own watermarks with it ("am I behind?"), and a watermark that overtook the
    updates it counts would make a node on a slow pipe re-sync for nothing. A liveness beat carries
    the member's clock echo, when there is one (psrv.server.clock_offset): the unqueued path keeps
    its round trip short."""
    fields = {"mesh_version": mesh_version, "stats": {}}
    alive = Message(Op.HEARTBEAT, {**fields, "watermark": {}}, src=CONTROLLER_ID)
    beat = Message(Op.HEARTBEAT, {**fields, "watermark": watermark}, src=CONTROLLER_ID)
    echoes = clock_echoes or {}
    out: list[Reply | Send] = []
    for node_id in member_ids:
        identity = routing.get(node_id)
        if identity is not None:
            echo = echoes.get(node_id)
            out.append(Reply(identity, alive if echo is None else Message(
                Op.HEARTBEAT, {**fields, "stats": {CLOCK_ECHO: echo}, "watermark": {}}, src=CONTROLLER_ID)))
        out.append(Send(node_id, beat))
    return out
