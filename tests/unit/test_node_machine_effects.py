"""NodeMachine with ``params_outside=True``: its effects on the parameters leave as ``Apply`` and
``Install`` actions (in order: a download's Install before the replays it needs), the machine never
writes the parameters itself, and a row whose body does not decode is refused at intake, before it is
deduplicated, relayed or applied. Driven by events alone, as in test_node_machine.py."""

from __future__ import annotations

import threading

import numpy as np
from psrv.encoding.codec import sparse_message
from psrv.encoding.messages import decode
from psrv.server.locked import LockedMachine
from psrv.server.node_machine import NodeMachine, NodeState
from psrv.server.outside_params import OutsideParams
from psrv.transport.counters import Counters
from psrv.transport.events import Apply, Install, Send, Tick
from psrv.transport.messages import Message, Op
from test_node_machine import TAU, Harness, N, delta, rows, update


class Outside(Harness):
    """The harness with the parameters outside the machine: ``live`` is what a facade keeps, fed
    only by the actions (``carried`` lists them in order)."""

    def __init__(self, **config) -> None:
        super().__init__(**config)
        self.machine = NodeMachine(self.config, self.params, "127.0.0.1:5000",
                                   random_bytes=self.rng.randbytes, params_outside=True)
        self.live = np.zeros(N, dtype=np.float32)
        self.carried: list = []

    def handle(self, event, dt: float = 0.0) -> list:
        rest = []
        for action in super().handle(event, dt):
            if isinstance(action, Apply):
                self.carried.append(("apply", [dict(h) for h in action.headers]))
                for payload in action.payloads:
                    decode(payload, self.live)
            elif isinstance(action, Install):
                self.carried.append(("install", None))
                np.copyto(self.live, action.params)
            else:
                rest.append(action)
        return rest


def test_received_updates_leave_as_one_apply_and_the_machine_does_not_touch_params():
    h = Outside()
    h.join(1, others=(2,))
    h.catch_up()
    h.carried.clear()
    batch = Message(Op.UPDATES, {"updates": [[2, 1, 0, 0, TAU, "sparse"], [2, 2, 0, 0, TAU, "sparse"]]},
                    [sparse_message(np.array([i]), np.array([False]), N, TAU).tobytes() for i in (3, 9)],
                    src=2)
    h.from_node(batch, 2)
    assert [(kind, [(x["origin"], x["seq"]) for x in headers]) for kind, headers in h.carried] == [
        ("apply", [(2, 1), (2, 2)])]
    np.testing.assert_array_equal(h.live, delta(3) + delta(9))
    assert not h.params.any(), "the machine's host copy is only the download target"
    assert h.machine.counters_["updates_applied"] == 2
    h.from_node(update(2, 1, index=3), 2)  # a repeat: no action at all
    assert len(h.carried) == 1 and h.machine.counters_["duplicates_dropped"] == 1


def test_a_download_is_installed_before_the_updates_it_lacks_are_replayed():
    h = Outside()
    h.join(1, others=(2,))
    h.from_node(update(2, 1, index=3), 2)  # held during the download; the master includes it
    h.from_node(update(2, 2, index=5), 2)  # held; the master lacks it
    assert h.carried == []
    master = np.zeros(N, dtype=np.float32)
    master[10] = 4.0
    master += delta(3)
    h.catch_up(master, {2: 1})
    assert h.machine.state is NodeState.RUNNING
    assert [kind for kind, _ in h.carried] == ["install", "apply"]
    assert [(x["origin"], x["seq"]) for x in h.carried[1][1]] == [(2, 2)]
    np.testing.assert_array_equal(h.live, master + delta(5))


def test_the_backlog_is_reapplied_on_the_installed_copy_through_apply():
    h = Outside()
    h.join(1)
    seq, _ = h.submit(7)
    assert seq == 0
    actions = h.catch_up()
    assert [kind for kind, _ in h.carried] == ["install", "apply"]
    assert [rows(s) for s in h.sent(actions, Op.UPDATES, 0)] == [[(1, 1)]]
    np.testing.assert_array_equal(h.live, delta(7))


def test_a_body_that_does_not_decode_is_refused_before_dedup_and_relay():
    """Its header fits, its one index is beyond N: refused as bad_payload, not relayed, and the
    (origin, seq) it claimed stays free for the real update."""
    h = Outside()
    h.join(1, others=(2, 3))
    h.catch_up()
    h.carried.clear()
    payload = sparse_message(np.array([4]), np.array([False]), N, TAU)
    payload[-1] = N + 5  # index out of range: only a walk over the body finds it
    fields = {"origin": 2, "seq": 1, "iteration": 0, "epoch": 0, "tau": TAU, "encoding": "sparse"}
    actions = h.from_node(Message(Op.UPDATE, fields, [payload.tobytes()], src=2), 2)
    assert h.rejected("bad_payload") == 1
    assert not [a for a in actions if isinstance(a, Send) and a.message.op in (Op.UPDATE, Op.UPDATES)]
    assert h.carried == [] and h.machine.counters_["updates_received"] == 0
    h.from_node(update(2, 1, index=4), 2)  # the genuine 2/1 is not taken for a duplicate
    np.testing.assert_array_equal(h.live, delta(4))
    assert h.machine.counters_["duplicates_dropped"] == 0


def test_the_plain_machine_refuses_the_same_body_the_same_way():
    h = Harness()
    h.join(1, others=(2,))
    h.catch_up()
    payload = sparse_message(np.array([4]), np.array([False]), N, TAU)
    payload[-1] = 0  # a zero index (indices are 1-based)
    fields = {"origin": 2, "seq": 1, "iteration": 0, "epoch": 0, "tau": TAU, "encoding": "sparse"}
    h.from_node(Message(Op.UPDATE, fields, [payload.tobytes()], src=2), 2)
    assert h.rejected("bad_payload") == 1 and not h.params.any()
    h.from_node(update(2, 1, index=4), 2)
    np.testing.assert_array_equal(h.params, delta(4))


def test_locked_machine_carries_the_parameters_actions_out_under_the_lock():
    lock = threading.RLock()
    held: list[bool] = []

    class Emits:
        def handle(self, event, now):
            return [Apply((np.zeros(1, np.int32),), ({},)), Tick()]

    def under_lock(actions):
        held.append(lock._is_owned())
        return [a for a in actions if not isinstance(a, Apply)]

    def after(actions):
        held.append(lock._is_owned())
        return actions

    out = LockedMachine(Emits(), lock, after, under_lock).handle(Tick(), 1.0)
    assert held == [True, False] and [type(a) for a in out] == [Tick]


def test_a_hook_that_fails_after_the_checks_is_counted_and_logged(caplog):
    counters = Counters()
    calls: list[int] = []

    def apply(payload, header):
        calls.append(header["seq"])
        if header["seq"] == 2:
            raise RuntimeError("device lost")

    outside = OutsideParams(apply, counters, __import__("logging").getLogger("test"))
    headers = tuple({"origin": 2, "seq": s} for s in (1, 2, 3))
    rest = outside.carry_out([Apply((np.zeros(1, np.int32),) * 3, headers), Tick()])
    assert calls == [1, 2, 3], "one failure does not stop the others"
    assert counters["apply_errors"] == 1 and "device lost" in caplog.text
    assert [type(a) for a in rest] == [Tick]
