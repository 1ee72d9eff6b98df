"""Clock offsets from the heartbeat round trips (server/clock_offset.py): NTP's arithmetic, the
minimum-round-trip choice, the real controller and node machines exchanging beats over a simulated
link with skewed clocks and asymmetric delays, and the driver's timeline, report and trace moved onto
the driver's clock with the error shown."""

from __future__ import annotations

import heapq
import itertools
import random
from html import escape as html_escape

import numpy as np
import pytest
from psrv.server.clock_offset import ClockEchoes, OffsetEstimator, clock_sample
from psrv.server.controller_machine import ControllerMachine
from psrv.server.mesh import CONTROLLER_ID
from psrv.server.node_machine import NodeMachine, NodeState
from psrv.spark.observe.report import CLOCK_ALIGNED, render_stats_html
from psrv.spark.observe.stats import clock_notes, on_driver_clock
from psrv.spark.observe.trace import chrome_trace
from psrv.transport.config import TransportConfig
from psrv.transport.events import Connect, Download, Received, Reply, Send, Started, Tick


def test_ntp_arithmetic_bounds_the_offset_by_half_the_round_trip() -> None:
    skew, forward, back, hold = 3.25, 0.030, 0.010, 0.2  # controller clock = node clock + skew
    t0 = 100.0
    t1 = t0 + forward + skew
    t2 = t1 + hold
    t3 = t0 + forward + hold + back
    sample = clock_sample(t0, t1, t2, t3)
    assert sample.rtt_s == pytest.approx(forward + back)  # the controller's hold is not on the wire
    assert sample.offset_s == pytest.approx(skew + (forward - back) / 2)
    assert abs(sample.offset_s - skew) <= sample.error_s + 1e-12


def test_the_estimate_is_the_shortest_round_trip_of_the_window() -> None:
    estimator = OffsetEstimator(window=3)
    assert estimator.best() is None
    for t0, rtt in ((0.0, 0.5), (1.0, 0.02), (2.0, 0.3)):
        estimator.add([t0, t0 + rtt / 2 + 1.0, t0 + rtt / 2 + 1.0], t0 + rtt)
    best = estimator.best()
    assert best is not None and best.rtt_s == pytest.approx(0.02) and best.offset_s == pytest.approx(1.0)
    for t0 in (3.0, 4.0, 5.0):  # the short one leaves the window
        estimator.add([t0, t0 + 0.2 + 1.0, t0 + 0.2 + 1.0], t0 + 0.4)
    assert estimator.best().rtt_s == pytest.approx(0.4)
    for bad in ([1.0, 2.0], [1.0, "x", 2.0], [1.0, float("nan"), 2.0], [5.0, 6.0, 5.5], None, [True, 1, 2]):
        assert estimator.add(bad, 7.0) is None  # malformed, or stamps running backwards
    assert estimator.best().rtt_s == pytest.approx(0.4)


def test_the_controller_echoes_each_stamp_once_and_not_at_all_without_a_wall_clock() -> None:
    clock = iter([10.0, 10.5])
    echoes = ClockEchoes(lambda: next(clock))
    echoes.heard(3, {"clock_sent": 7.0})
    echoes.heard(4, {"other": 1})  # a beat without a stamp (an older node)
    assert echoes.echoes() == {3: [7.0, 10.0, 10.5]}
    assert echoes.echoes() == {}
    silent = ClockEchoes(None)
    silent.heard(3, {"clock_sent": 7.0})
    assert silent.echoes() == {}


class _Link:
    """One controller machine and one node machine on a simulated link: each message is delivered after
    its direction's delay (plus seeded jitter); both machines tick every 20 ms; each reads its own wall
    clock, the simulated time plus its skew."""

    def __init__(self, node_skew: float, ctrl_skew: float, forward: float, back: float,
                 jitter: float) -> None:
        config = TransportConfig(heartbeat_s=0.1, missed_beats=5)
        self.now = 1000.0
        self.forward, self.back, self.jitter = forward, back, jitter
        self.rng = random.Random(3)
        self.ctrl = ControllerMachine(config, np.zeros(16, np.float32), session=b"\x11" * 16,
                                      wall_clock=lambda: self.now + ctrl_skew)
        self.node = NodeMachine(config, np.zeros(16, np.float32), "127.0.0.1:5000",
                                random_bytes=random.Random(7).randbytes,
                                wall_clock=lambda: self.now + node_skew)
        self.queue: list = []
        self.order = itertools.count()
        self.node_rid: bytes | None = None
        self._to_ctrl(Started("127.0.0.1:5000"))
        self._to_node(Started("127.0.0.1:6001"))

    def _later(self, delay: float, target: str, event) -> None:
        heapq.heappush(self.queue, (self.now + delay + self.rng.uniform(0, self.jitter), next(self.order),
                                    target, event))

    def _to_ctrl(self, event) -> None:
        for action in self.ctrl.handle(event, self.now):
            if isinstance(action, Reply) and action.routing_id == self.node_rid:
                self._later(self.back, "node", Received(action.message, routing_id=None, via=CONTROLLER_ID))
            elif isinstance(action, Download):
                self._later(self.back, "node", Received(action.message, routing_id=None, via=CONTROLLER_ID))
                if action.token is not None:
                    action.token.sent()
            # the data path (watermark beats, meshes, relayed updates) is not needed here

    def _to_node(self, event) -> None:
        for action in self.node.handle(event, self.now):
            if isinstance(action, Connect) and action.peer == CONTROLLER_ID:
                self.node_rid = action.routing_id
            elif isinstance(action, Send) and action.to == CONTROLLER_ID:
                self._later(self.forward, "ctrl", Received(action.message, routing_id=self.node_rid))
                if action.token is not None:
                    action.token.sent()

    def run(self, seconds: float) -> None:
        end = self.now + seconds
        next_tick = self.now
        while self.now < end:
            if self.queue and self.queue[0][0] <= next_tick:
                self.now, _, target, event = heapq.heappop(self.queue)
                (self._to_ctrl if target == "ctrl" else self._to_node)(event)
                continue
            self.now = next_tick
            self._to_ctrl(Tick())
            self._to_node(Tick())
            next_tick += 0.02


@pytest.mark.parametrize("node_skew, ctrl_skew, forward, back, jitter", [
    (0.0, 0.0, 0.002, 0.002, 0.0),
    (-2.5, 0.0, 0.030, 0.010, 0.0),  # a node 2.5 s behind, a slower way in than out
    (7.0, -1.0, 0.005, 0.040, 0.050),  # jittered: the shortest round trip wins
])
def test_the_machines_estimate_the_skew_within_the_error_they_report(node_skew, ctrl_skew, forward, back,
                                                                     jitter) -> None:
    link = _Link(node_skew, ctrl_skew, forward, back, jitter)
    link.run(3.0)
    assert link.node.state is not NodeState.JOINING
    gauges = link.node.counters_.gauges
    truth = ctrl_skew - node_skew  # what is added to the node's times to read the controller's clock
    offset, error = gauges["clock_offset_s"], gauges["clock_error_s"]
    assert abs(offset - truth) <= error + 1e-9
    assert error <= (forward + back + 2 * jitter) / 2 + 1e-9
    if jitter == 0.0:
        # NTP's estimate with fixed delays: off by exactly half the asymmetry; the bound is half the
        # round trip (the stamps are taken in the same tick the message is handled: nothing added)
        assert offset == pytest.approx(truth + (forward - back) / 2, abs=1e-9)
        assert error == pytest.approx((forward + back) / 2, abs=1e-9)
    # carried to the controller (the driver) in the node's next beat
    link.run(0.3)
    stats = link.ctrl.node_stats()[0]["stats"]
    assert abs(stats["clock_offset_s"] - truth) <= stats["clock_error_s"] + 1e-9


def test_without_wall_clocks_no_offset_is_estimated() -> None:
    link = _Link(0.0, 0.0, 0.002, 0.002, 0.0)
    link.node.timers._wall_clock = None  # noqa: SLF001 - as a node built without one
    link.ctrl._clocks = ClockEchoes(None)  # noqa: SLF001
    link.run(1.0)
    assert "clock_offset_s" not in link.node.counters_.gauges


def _worker_records(worker: str, start: float) -> list[dict]:
    return [{"worker": worker, "kind": "fit", "partition": 0, "start": start, "end": start + 0.5,
             "iteration": 1, "loss": 0.5},
            {"worker": worker, "kind": "metrics", "time": start + 0.6, "iteration": 1, "bytes": 10}]


def test_the_timeline_report_and_trace_are_on_the_drivers_clock_with_the_error_shown() -> None:
    skewed = _worker_records("hostb:2", 5000.0)  # this worker's clock is 3 s behind the driver's
    moved = on_driver_clock(skewed, 3.0, 0.0004)
    assert [(r.get("start"), r.get("end"), r.get("time")) for r in moved] == [
        (5003.0, 5003.5, None), (None, None, 5003.6)]
    assert skewed[0]["start"] == 5000.0  # the worker's own records are left as they were
    assert on_driver_clock(skewed, None, None) == skewed  # no estimate: nothing moved, nothing noted
    records = moved + on_driver_clock(_worker_records("hosta:1", 5003.00125), -0.00125, 0.0002) + [
        {"worker": "driver", "kind": "training_job", "start": 5002.9, "end": 5004.0}]
    notes = clock_notes(records)
    assert notes == {"hostb:2": "offset +3000.00 ms ±0.40 ms", "hosta:1": "offset -1.25 ms ±0.20 ms"}
    html = render_stats_html(records)
    assert html_escape(CLOCK_ALIGNED) in html and "offset +3000.00 ms ±0.40 ms" in html
    trace = chrome_trace(records)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"hosta:1 (offset -1.25 ms ±0.20 ms)", "hostb:2 (offset +3000.00 ms ±0.40 ms)", "driver"}
    fits = sorted(e["ts"] for e in trace["traceEvents"] if e.get("cat") == "fit")
    assert fits[0] == pytest.approx(fits[1], abs=0.01)  # the same driver time: aligned
