"""A hostile member: joins like a node, then sends forged and fuzzed frames to everyone.

The kinds: random bytes and broken headers; structurally wrong
fields (a watermark that is not a map of ints, a dtype numpy cannot parse, NaN taus); another
member's id or origin, sequence 10**12, forged LEAVE; controller-only ops (SHUTDOWN, EVICTED,
MESH, HEARTBEAT, PARAMS_REPLY) sent to nodes from a member's connection; an update of its own with
an absurd tau or the wrong model size; chunks claiming huge totals; a JOIN flood; absurd but valid
values (a watermark at 2**63-1, 256 stats). None of these may be applied, crash a handler, or stop
a process: the invariants after the run say whether any of them got through.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from psrv.encoding import sparse_message
from psrv.transport.codec import as_buffer, encode_frames, pack_header
from psrv.transport.events import Connect, Received, Send, Started, Tick
from psrv.transport.messages import CATALOGUE, INT64_MAX, PROTOCOL_VERSION, Message, Op

from sim.network import Process


def _complete(op: Op, fields: dict) -> dict:
    """``fields`` plus a plausible value for any field the catalogue requires that it lacks (the
    catalogue grows while the protocol changes; a hostile's frames should stay well-formed)."""
    out = dict(fields)
    for name, types in CATALOGUE[op].fields.items():
        if name not in out:
            out[name] = "ab" * 16 if str in types else 0 if int in types else {} if dict in types else None
    return out


def _frames(message: Message) -> list[bytes]:
    """The frames of a well-formed (if forged) message, whatever fields the catalogue added since."""
    whole = Message(message.op, _complete(message.op, message.fields), message.buffers, message.src)
    return [f if type(f) is bytes else bytes(as_buffer(f)) for f in encode_frames(whole)]


def _raw(header: dict, *buffers: bytes) -> list[bytes]:
    return [pack_header(header), *buffers]


class HostileRole:
    """Role and machine at once (it needs no adapter): ``handle`` joins, then attacks on each tick."""

    def __init__(self, world: Any, proc: Process) -> None:
        self.world, self.proc, self.machine = world, proc, self
        self.node_id: int | None = None
        self.next_attack = 0.0
        self.flooded = 0

    # the Role protocol: a hostile is never checked as a replica
    def replica(self) -> np.ndarray:
        return np.zeros(0)

    def member_id(self) -> int | None:
        return self.node_id

    def ready(self) -> bool:
        return True

    def submit(self, payload: np.ndarray) -> None:
        return None

    def _join(self, token: str, address: str | None = None) -> Send:
        fields = {"address": address or self.proc.address, "name": None, "token": token}
        return Send(0, Message(Op.JOIN, _complete(Op.JOIN, fields)))

    def handle(self, event: Any, now: float) -> list[Any]:
        if isinstance(event, Started):
            return [
                Connect(0, self.world.controller.address, listen=True),
                self._join(f"hostile/{self.proc.name}"),
            ]
        if isinstance(event, Received):
            if event.message.op is Op.JOIN_REPLY and self.node_id is None:
                self.node_id = event.message["node_id"]
            return []
        if isinstance(event, Tick) and not self.world.calm:
            world = self.world
            rng = world.sched.rng
            if world.sched.now < self.next_attack:
                return []
            self.next_attack = world.sched.now + rng.uniform(*world.config.hostile_every_s)
            name = rng.choice(ATTACKS)
            out = getattr(self, f"_attack_{name}")(rng)
            world.counts.counts[f"hostile_{name}"] += 1
            return out or []
        return []

    # ------------------------------------------------------------------ helpers
    def _targets(self, nodes_only: bool = False) -> list[Process]:
        nodes = [p for _, p in sorted(self.world.slots.items()) if p.live]
        return nodes if nodes_only else [self.world.controller, *nodes]

    def _victim(self, rng: Any) -> int:
        ids = [p.ids[-1] for p in self._targets(nodes_only=True) if p.ids]
        return rng.choice(ids) if ids else rng.randint(1, 8)

    def _put(self, target: Process | None, frames: list[bytes]) -> None:
        if target is not None and target.live:
            self.world.net.transmit(self.proc, target, frames, "data", None)

    def _put_any(self, rng: Any, frames: list[bytes], nodes_only: bool = False) -> None:
        targets = self._targets(nodes_only)
        if targets:
            self._put(rng.choice(targets), frames)

    def _payload(self, rng: Any, tau: float = 0.5, size: int | None = None) -> bytes:
        n = size or self.world.config.model_size
        index = np.array([rng.randrange(n)])
        return sparse_message(index, np.array([False]), n, tau).tobytes()

    # ------------------------------------------------------------------ attacks
    def _attack_random_bytes(self, rng: Any) -> None:
        self._put_any(rng, [rng.randbytes(rng.randint(0, 48)) for _ in range(rng.randint(1, 3))])

    def _attack_bad_header(self, rng: Any) -> None:
        header = rng.choice(
            (
                {"v": 99, "op": "heartbeat", "src": 0},
                {"v": PROTOCOL_VERSION, "op": "pwn", "src": 1},
                {"v": PROTOCOL_VERSION, "op": "update", "src": "0"},
                [1, 2, 3],
                {"v": PROTOCOL_VERSION, "op": "leave", "src": 1, "reason": "x", "extra": 1},
            )
        )
        self._put_any(rng, [pack_header(header)] if rng.random() < 0.8 else [b"\xc1" + rng.randbytes(8)])

    def _attack_bad_watermark(self, rng: Any) -> None:
        mark = rng.choice(({"x": 1}, {1: None}, {1: "9" * 5000}, {1: 2**64 - 1}, {True: 1}, {1: -5}, [1]))
        header = {"v": PROTOCOL_VERSION, "op": "heartbeat", "src": 0, "mesh_version": 1, "stats": {},
                  "watermark": mark}
        self._put_any(rng, _raw(header))

    def _attack_bad_dtype(self, rng: Any) -> None:
        dtype = rng.choice((",,", "(-1,)f4", "i4", "<f16", "O", ""))
        header = {
            "v": PROTOCOL_VERSION,
            "op": "params_reply",
            "src": 0,
            "request_id": 1,
            "dtype": dtype,
            "size": 1,
            "updater_dtype": None,
            "updater_size": 0,
            "watermark": {},
            "extra_seen": {},
        }
        self._put_any(rng, _raw(header, b"\0\0\0\0"), nodes_only=True)

    def _attack_bad_update_fields(self, rng: Any) -> None:
        fields = {
            "origin": self._victim(rng),
            "seq": 1,
            "iteration": 0,
            "epoch": 0,
            "tau": 0.5,
            "encoding": "sparse",
        }
        name, value = rng.choice(
            (
                ("tau", float("nan")),
                ("tau", float("inf")),
                ("tau", -1.0),
                ("seq", 0),
                ("origin", True),
                ("encoding", "zip"),
                ("iteration", 2**64 - 1),
                ("seq", -(2**63)),
            )
        )
        fields[name] = value
        header = {"v": PROTOCOL_VERSION, "op": "update", "src": self.node_id or 1, **fields}
        self._put_any(rng, _raw(header, self._payload(rng)))

    def _attack_forged_update(self, rng: Any) -> None:
        victim = self._victim(rng)
        seq = rng.choice((1, 2, 10**12, INT64_MAX))
        fields = {"origin": victim, "seq": seq, "iteration": 0, "epoch": 0, "tau": 0.5, "encoding": "sparse"}
        src = rng.choice((victim, self.node_id or victim, 0))
        self._put_any(
            rng,
            _raw({"v": PROTOCOL_VERSION, "op": "update", "src": src, **_complete(Op.UPDATE, fields)},
                 self._payload(rng)),
        )

    def _attack_forged_leave(self, rng: Any) -> None:
        self._put(
            self.world.controller, _frames(Message(Op.LEAVE, {"reason": "forged"}, src=self._victim(rng)))
        )

    def _attack_controller_op(self, rng: Any) -> None:
        victim = self._victim(rng)
        message = rng.choice(
            (
                Message(Op.SHUTDOWN, {"reason": "forged"}, src=0),
                Message(Op.EVICTED, {"reason": "forged", "node_id": victim}, src=0),
                Message(Op.MESH, {"mesh": {}, "version": 10**9, "routes": {0: "ab"}}, src=0),
                Message(
                    Op.HEARTBEAT, {"mesh_version": 10**9, "stats": {}, "watermark": {victim: 10**12}}, src=0
                ),
                Message(
                    Op.PARAMS_REPLY,
                    {
                        "request_id": rng.randint(0, 5),
                        "dtype": "<f8",
                        "size": self.world.config.model_size,
                        "updater_dtype": None,
                        "updater_size": 0,
                        "watermark": {victim: 10**12},
                        "extra_seen": {},
                    },
                    [np.full(self.world.config.model_size, 1e6)],
                    src=0,
                ),
                Message(
                    Op.JOIN_REPLY,
                    {
                        "node_id": victim,
                        "mesh": {},
                        "restart": True,
                        "heartbeat_s": 0.001,
                        "missed_beats": 1,
                        "token": "x",
                        "routes": {},
                    },
                    src=0,
                ),
            )
        )
        self._put_any(rng, _frames(message), nodes_only=True)

    def _attack_own_absurd_update(self, rng: Any) -> None:
        origin = self.node_id or 1
        tau, size = rng.choice(((1e30, None), (5000.0, None), (0.5, self.world.config.model_size * 2)))
        fields = {
            "origin": origin,
            "seq": rng.randint(1, 50),
            "iteration": 0,
            "epoch": 0,
            "tau": 0.5,
            "encoding": "sparse",
        }
        message = Message(Op.UPDATE, fields, [self._payload(rng, tau, size)], src=origin)
        self._put_any(rng, _frames(message))

    def _attack_huge_chunk(self, rng: Any) -> None:
        total = rng.choice((2**40, 2**31, 64 * 1024 * 1024))
        fields = {
            "msg_id": rng.randint(0, 100),
            "index": 0,
            "count": 2,
            "offset": 0,
            "total": total,
            "inner": {"v": PROTOCOL_VERSION, "op": "params_reply", "src": 0},
            "lengths": [total],
        }
        self._put_any(rng, _raw({"v": PROTOCOL_VERSION, "op": "chunk", "src": 0, **fields}, b"\0" * 16))

    def _attack_join_flood(self, rng: Any) -> list[Any]:
        if self.flooded >= 40:
            return []
        self.flooded += 10
        return [self._join(f"flood/{self.proc.name}/{self.flooded + i}", f"nowhere-{i}:1") for i in range(10)]

    def _attack_absurd_valid(self, rng: Any) -> None:
        src = self.node_id or 1
        stats = {f"s{i}": i for i in range(256)}
        message = rng.choice(
            (
                Message(
                    Op.HEARTBEAT,
                    {"mesh_version": INT64_MAX, "stats": stats, "watermark": {1: INT64_MAX}},
                    src=src,
                ),
                Message(Op.PARAMS_REQUEST, {"request_id": INT64_MAX, "want_updater": True}, src=src),
                Message(Op.STATUS_REQUEST, {}, src=-1),
                Message(Op.JOIN, {"address": "x" * 300, "name": "y" * 1024, "token": "z" * 128}),
            )
        )
        self._put(self.world.controller, _frames(message))


ATTACKS = tuple(name[len("_attack_") :] for name in vars(HostileRole) if name.startswith("_attack_"))
