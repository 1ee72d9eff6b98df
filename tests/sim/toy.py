"""A toy controller and node speaking the events.py vocabulary: what the harness's own tests drive.

A star (every node a child of the controller), exactly-once by (origin, seq) sets, heartbeats with
contiguous watermarks, re-send of a node's unacknowledged updates, re-sync by download when a
watermark stays ahead, eviction of the silent, rejoin with a new id (unacknowledged updates of the
old id are dropped with the replica the download replaces). Small on purpose; ``broken`` switches
on one deliberate bug so the tests can show that the invariants catch it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.encoding import MalformedMessageError, decode
from psrv.server.updates import check_payload
from psrv.transport.codec import as_buffer
from psrv.transport.errors import FrameRejectedError
from psrv.transport.events import (
    Connect,
    Disconnect,
    Received,
    Reply,
    Send,
    Started,
    Stop,
    Stopping,
    Submit,
    Tick,
)
from psrv.transport.messages import Message, Op

BEAT_S = 0.1
TIMEOUT_S = 0.5


class Seen:
    """Per-origin sets of sequences with a contiguous watermark."""

    def __init__(self) -> None:
        self.sets: dict[int, set[int]] = {}
        self.marks: dict[int, int] = {}

    def add(self, origin: int, seq: int) -> bool:
        got = self.sets.setdefault(origin, set())
        if seq in got or seq <= self.marks.get(origin, 0):
            return False
        got.add(seq)
        mark = self.marks.get(origin, 0)
        while mark + 1 in got:
            mark += 1
            got.discard(mark)
        self.marks[origin] = mark
        return True

    def has(self, origin: int, seq: int) -> bool:
        return seq <= self.marks.get(origin, 0) or seq in self.sets.get(origin, ())

    def extra(self) -> dict[int, list[int]]:
        return {o: sorted(s) for o, s in self.sets.items() if s}


def _payload(buffer: Any) -> np.ndarray:
    return np.frombuffer(as_buffer(buffer), dtype=np.int32)


class ToyController:
    def __init__(self, hooks: Any, size: int, broken: str = "") -> None:
        self.hooks = hooks
        self.params = np.zeros(size)
        self.broken = broken
        self.members: dict[int, dict[str, Any]] = {}
        self.tokens: dict[str, int] = {}
        self.next_id = 1
        self.seen = Seen()
        self.next_beat = 0.0

    def handle(self, event: Any, now: float) -> list[Any]:
        out: list[Any] = []
        if isinstance(event, Tick):
            for node_id, m in list(self.members.items()):
                if now - m["heard"] > TIMEOUT_S:
                    del self.members[node_id]
                    out.append(Disconnect(node_id))
            if now >= self.next_beat:
                self.next_beat = now + BEAT_S
                beat = Message(
                    Op.HEARTBEAT, {"mesh_version": 0, "stats": {}, "watermark": dict(self.seen.marks)}, src=0
                )
                out.extend(Send(node_id, beat, urgent=True) for node_id in self.members)
            return out
        if not isinstance(event, Received):
            return out
        msg, rid = event.message, event.routing_id
        if msg.op is Op.JOIN:
            if rid is None:
                raise FrameRejectedError("bad_sender", "join not on the ROUTER")
            node_id = self.tokens.get(msg["token"])
            if node_id is None or node_id not in self.members:
                node_id, self.next_id = self.next_id, self.next_id + 1
                self.tokens[msg["token"]] = node_id
                self.members[node_id] = {"rid": rid, "heard": now}
                out.append(Connect(node_id, msg["address"]))
            elif self.members[node_id]["rid"] != rid:
                raise FrameRejectedError("bad_sender", "another connection's token")
            fields = {
                "node_id": node_id,
                "mesh": {},
                "restart": False,
                "heartbeat_s": BEAT_S,
                "missed_beats": 3,
                "token": msg["token"],
                "routes": {0: self.hooks.proc.routing_id.hex()},
            }
            out.append(Reply(rid, Message(Op.JOIN_REPLY, fields, src=0)))
            return out
        member = self.members.get(msg.src)
        if member is None or member["rid"] != rid:
            if rid is not None and member is None:
                out.append(
                    Reply(rid, Message(Op.EVICTED, {"reason": "not a member", "node_id": msg.src}, src=0))
                )
                return out
            raise FrameRejectedError("bad_sender", f"{msg.op} claiming {msg.src}")
        member["heard"] = now
        if msg.op is Op.UPDATE:
            f = msg.fields
            if f["origin"] != msg.src:
                raise FrameRejectedError("bad_origin", "a node sends only its own updates")
            if not self.seen.add(f["origin"], f["seq"]) and self.broken != "double_apply":
                return out
            payload = check_payload(_payload(msg.buffers[0]), self.params.size, "update", 1000.0)[0]
            try:
                decode(payload, self.params)
            except MalformedMessageError as exc:
                raise FrameRejectedError("bad_payload", str(exc)) from None
            self.hooks.applied(payload, f)
            relay = Message(Op.UPDATE, dict(f), [payload], src=0)
            out.extend(Send(n, relay, droppable=True) for n in self.members if n != msg.src)
        elif msg.op is Op.PARAMS_REQUEST:
            fields = {
                "request_id": msg["request_id"],
                "dtype": "<f8",
                "size": self.params.size,
                "updater_dtype": None,
                "updater_size": 0,
                "watermark": dict(self.seen.marks),
                "extra_seen": self.seen.extra(),
            }
            out.append(Send(msg.src, Message(Op.PARAMS_REPLY, fields, [self.params.copy()], src=0)))
        elif msg.op is Op.LEAVE:
            del self.members[msg.src]
            out.append(Disconnect(msg.src))
        return out

    def replica(self) -> np.ndarray:
        return self.params


class ToyNode:
    def __init__(self, hooks: Any, controller: str, name: str, size: int, broken: str = "") -> None:
        self.hooks = hooks
        self.controller = controller
        self.name = name
        self.broken = broken
        self.params = np.zeros(size)
        self.state = "joining"
        self.node_id: int | None = None
        self.previous_id: int | None = None
        self.token = f"{name}/{hooks.proc.name}"
        self.ctl_rid = ""
        self.seen = Seen()
        self.seq = 0
        self.unacked: dict[int, np.ndarray] = {}
        self.backlog: list[np.ndarray] = []
        self.held: list[tuple[dict, np.ndarray]] = []
        self.request = 0
        self.asked = self.heard = self.next_beat = self.next_join = 0.0
        self.behind = 0

    def handle(self, event: Any, now: float) -> list[Any]:
        if isinstance(event, Started):
            return [Connect(0, self.controller, listen=True), *self._join(now)]
        if isinstance(event, Tick):
            return self._tick(now)
        if isinstance(event, Submit):
            return self._submit(event.payload)
        if isinstance(event, Stopping):
            return [Send(0, Message(Op.LEAVE, {"reason": "stopping"}, src=self.node_id or -1)), Stop()]
        if isinstance(event, Received):
            return self._received(event, now)
        return []

    def _join(self, now: float) -> list[Any]:
        self.previous_id = self.node_id or self.previous_id
        self.state, self.node_id, self.next_join, self.heard = "joining", None, now + 0.3, now
        return [
            Send(
                0,
                Message(
                    Op.JOIN, {"address": self.hooks.proc.address, "name": self.name, "token": self.token}
                ),
            )
        ]

    def _apply(self, payload: np.ndarray, fields: dict) -> None:
        decode(payload, self.params)
        self.hooks.applied(payload, fields)

    def _submit(self, payload: np.ndarray) -> list[Any]:
        self._apply(payload, {"origin": self.node_id, "seq": 0})
        if self.node_id is None:
            self.backlog.append(payload)
            return []
        return self._send_own(payload)

    def _send_own(self, payload: np.ndarray) -> list[Any]:
        self.seq += 1
        self.unacked[self.seq] = payload
        return [Send(0, self._update(self.seq, payload))]

    def _update(self, seq: int, payload: np.ndarray) -> Message:
        fields = {
            "origin": self.node_id,
            "seq": seq,
            "iteration": 0,
            "epoch": 0,
            "tau": 1.0,
            "encoding": "sparse",
        }
        return Message(Op.UPDATE, fields, [payload], src=self.node_id)

    def _tick(self, now: float) -> list[Any]:
        out: list[Any] = []
        if self.state == "joining":
            return self._join(now) if now >= self.next_join else []
        if now - self.heard > TIMEOUT_S:
            return self._join(now)
        if self.state == "syncing" and now - self.asked > 0.3:
            out.extend(self._ask(now))
        if now >= self.next_beat:
            self.next_beat = now + BEAT_S
            out.append(
                Send(
                    0,
                    Message(
                        Op.HEARTBEAT, {"mesh_version": 0, "stats": {}, "watermark": {}}, src=self.node_id
                    ),
                    urgent=True,
                )
            )
        return out

    def _ask(self, now: float) -> list[Any]:
        self.state, self.asked, self.request = "syncing", now, self.request + 1
        return [
            Send(
                0,
                Message(
                    Op.PARAMS_REQUEST, {"request_id": self.request, "want_updater": False}, src=self.node_id
                ),
            )
        ]

    def _received(self, event: Received, now: float) -> list[Any]:
        msg = event.message
        from_ctl = event.via == 0 or (event.routing_id is not None and event.routing_id.hex() == self.ctl_rid)
        if not from_ctl or msg.src != 0:
            raise FrameRejectedError("bad_sender", f"{msg.op} from {msg.src} on an unknown connection")
        self.heard = now
        op = msg.op
        if op is Op.JOIN_REPLY and self.state == "joining":
            self.node_id, self.ctl_rid = msg["node_id"], msg["routes"].get(0, "")
            if self.node_id != self.previous_id:  # a new origin: what the old one owed is dropped
                self.unacked.clear()  # with the replica the download replaces
                self.seq = 0
            return self._ask(now)
        if op is Op.EVICTED:
            return self._join(now)
        if op is Op.UPDATE:
            payload = _payload(msg.buffers[0]).copy()
            if self.state == "syncing":
                self.held.append((dict(msg.fields), payload))
            elif self.state == "running" and self.seen.add(msg["origin"], msg["seq"]):
                self._apply(payload, msg.fields)
        elif op is Op.HEARTBEAT and self.state == "running":
            return self._beat(msg["watermark"], now)
        elif op is Op.PARAMS_REPLY and self.state == "syncing" and msg["request_id"] == self.request:
            return self._install(msg)
        return []

    def _beat(self, marks: dict, now: float) -> list[Any]:
        out: list[Any] = []
        acked = marks.get(self.node_id, 0)
        for seq in [s for s in self.unacked if s <= acked]:
            del self.unacked[seq]
        out.extend(Send(0, self._update(s, p)) for s, p in self.unacked.items())  # lost ones go again
        ahead = any(mark > self.seen.marks.get(o, 0) for o, mark in marks.items() if o != self.node_id)
        self.behind = self.behind + 1 if ahead else 0
        if self.behind >= 3:
            self.behind = 0
            out.extend(self._ask(now))
        return out

    def _install(self, msg: Message) -> list[Any]:
        self.params = np.frombuffer(as_buffer(msg.buffers[0]), dtype="<f8").astype(np.float64)
        self.hooks.installed()
        self.seen = Seen()
        for origin, mark in msg["watermark"].items():
            self.seen.marks[origin] = mark
        for origin, seqs in msg["extra_seen"].items():
            self.seen.sets[origin] = set(seqs)
        for fields, payload in self.held:
            if self.seen.add(fields["origin"], fields["seq"]):
                self._apply(payload, fields)
        self.held.clear()
        for seq, payload in self.unacked.items():  # ours the snapshot lacks: applied again, still owed
            if not self.seen.has(self.node_id, seq) or self.broken == "reapply_own":
                self._apply(payload, {"origin": self.node_id, "seq": seq})
        self.state = "running"
        out: list[Any] = []
        for payload in self.backlog:
            self._apply(payload, {"origin": self.node_id, "seq": 0})
            out.extend(self._send_own(payload))
        self.backlog.clear()
        return out

    def replica(self) -> np.ndarray:
        return self.params


class ToyRole:
    """Adapter: the harness's view of a toy machine."""

    def __init__(self, machine: Any) -> None:
        self.machine = machine

    def replica(self) -> np.ndarray:
        return self.machine.params

    def member_id(self) -> int | None:
        return getattr(self.machine, "node_id", 0)

    def ready(self) -> bool:
        return getattr(self.machine, "state", "running") == "running"

    def submit(self, payload: np.ndarray) -> list[Submit]:
        return [Submit(payload, slot=False)]


def toy_setup(broken: str = "", hostile: bool = True):
    from sim.hostile import HostileRole
    from sim.world import Setup

    return Setup(
        controller=lambda hooks, address, cfg: ToyRole(ToyController(hooks, cfg.model_size, broken)),
        node=lambda hooks, address, ctl, name, cfg: ToyRole(
            ToyNode(hooks, ctl, name, cfg.model_size, broken)
        ),
        hostile=HostileRole if hostile else None,
        resends_after_rejoin=False,  # the toy drops what a node submitted before it rejoined
    )
