"""The harness itself, driven by the toy machines (sim.toy): scheduler, links, faults, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from psrv.transport.codec import pack_header
from psrv.transport.events import Dropped, Received, Tick
from psrv.transport.messages import PROTOCOL_VERSION, Message, Op

from sim.faults import FaultCounts, Faults
from sim.network import Network, Process
from sim.scheduler import Scheduler
from sim.seeds import profile_rng, run_many, scaled, seed_list
from sim.toy import toy_setup
from sim.world import SimConfig, World


def test_scheduler_orders_by_time_then_insertion() -> None:
    sched = Scheduler(1)
    seen: list[str] = []
    sched.at(0.2, seen.append, "c")
    sched.at(0.1, seen.append, "a")
    sched.at(0.1, seen.append, "b")
    sched.at(0.5, seen.append, "late")
    sched.run(0.3)
    assert seen == ["a", "b", "c"] and sched.now == 0.3
    sched.after(-1.0, seen.append, "now")  # never in the past
    sched.run(0.3)
    assert seen[-1] == "now"


class _Sink:
    """A machine that records what it gets (for the network tests)."""

    def __init__(self) -> None:
        self.events: list = []

    def handle(self, event, now):
        self.events.append((now, event))
        return []


def _net(faults: Faults | None = None, bound: int = 4) -> tuple[Network, Process, Process, list]:
    sched = Scheduler(7)
    got: list = []
    net = Network(
        sched, faults or Faults(), FaultCounts(), lambda proc, ev: got.append((proc.name, ev)), bound=bound
    )
    a = Process("a", "node", 0, b"\x01" * 5, "tcp://a:1")
    b = Process("b", "node", 1, b"\x02" * 5, "tcp://b:1")
    net.attach(a)
    net.attach(b)
    net.connect(a, 9, b.address, None, True)
    return net, a, b, got


def _beat(src: int, version: int) -> Message:
    return Message(Op.HEARTBEAT, {"mesh_version": version, "stats": {}, "watermark": {}}, src=src)


def test_links_are_fifo_and_name_the_sender() -> None:
    net, a, b, got = _net(bound=1000)
    for i in range(50):
        net.send(a, 9, _beat(3, i), False, 1)
    net.sched.run(1.0)
    versions = [ev.message["mesh_version"] for _, ev in got]
    assert versions == list(range(50))
    assert all(isinstance(ev, Received) and ev.routing_id == a.routing_id for _, ev in got)


def test_reorder_fault_lets_messages_overtake() -> None:
    net, a, b, got = _net(Faults(reorder=0.5, jitter_s=0.01), bound=1000)
    for i in range(200):
        net.send(a, 9, _beat(3, i), False, 1)
    net.sched.run(2.0)
    versions = [ev.message["mesh_version"] for _, ev in got]
    assert sorted(versions) == list(range(200)) and versions != sorted(versions)
    assert net.counts.counts["reordered"] > 0


def test_full_link_drops_droppable_sends_and_says_so() -> None:
    net, a, b, got = _net(bound=4)
    for i in range(10):
        net.send(a, 9, _beat(3, i), True, 2)
    net.send(a, 9, _beat(3, 99), False, 1)  # not droppable: queued whatever the bound
    net.sched.run(1.0)
    dropped = [ev for name, ev in got if name == "a"]
    received = [ev.message["mesh_version"] for name, ev in got if name == "b"]
    assert received == [0, 1, 2, 3, 99]
    assert dropped == [Dropped(9, 2)] * 6


def test_loss_duplication_and_partition() -> None:
    net, a, b, got = _net(Faults(loss=0.3, duplicate=0.3), bound=10_000)
    for i in range(300):
        net.send(a, 9, _beat(3, i), False, 1)
    net.sched.run(5.0)
    c = net.counts.counts
    assert c["lost"] > 0 and c["duplicated"] > 0
    assert len(got) == 300 - c["lost"] + c["duplicated"]
    net.cut.update({("a", "b"), ("b", "a")})
    got.clear()
    net.send(a, 9, _beat(3, 1), False, 1)
    net.sched.run(6.0)
    assert not got


def test_reply_comes_back_on_the_askers_connection() -> None:
    net, a, b, got = _net()
    net.reply(b, a.routing_id, _beat(0, 5))
    net.sched.run(1.0)
    assert got == [("a", Received(got[0][1].message, None, 9))]
    net.reply(b, b"\x09" * 5, _beat(0, 5))  # nobody has that routing id: dropped like a ROUTER does
    assert net.counts.counts["reply_unroutable"] == 1


def test_hostile_frames_meet_the_real_codec() -> None:
    net, a, b, got = _net()
    net.transmit(a, b, [b"\xc7garbage"], "data", None)
    net.transmit(
        a,
        b,
        [
            pack_header(
                {"v": PROTOCOL_VERSION, "op": "heartbeat", "src": 0, "mesh_version": 1, "stats": {},
                 "watermark": {"x": 1}}
            )
        ],
        "data",
        None,
    )
    net.transmit(
        a,
        b,
        [
            pack_header(
                {
                    "v": PROTOCOL_VERSION,
                    "op": "params_reply",
                    "src": 0,
                    "request_id": 1,
                    "dtype": ",,",
                    "size": 1,
                    "updater_dtype": None,
                    "updater_size": 0,
                    "watermark": {},
                    "extra_seen": {},
                }
            ),
            b"1234",
        ],
        "data",
        None,
    )
    net.sched.run(1.0)
    assert not got
    assert b.rejected == {"bad_header": 1, "bad_field": 2}


def test_chunked_messages_are_reassembled() -> None:
    net, a, b, got = _net(bound=1000)
    params = np.arange(100, dtype="<f8")
    fields = {
        "request_id": 3,
        "dtype": "<f8",
        "size": 100,
        "updater_dtype": None,
        "updater_size": 0,
        "watermark": {1: 4},
        "extra_seen": {},
    }
    net.send(a, 9, Message(Op.PARAMS_REPLY, fields, [params], src=0), False, 1, chunk_bytes=128)
    net.sched.run(1.0)
    chunks = [ev for _, ev in got if type(ev).__name__ == "ChunkArrived"]
    whole = [ev for _, ev in got if isinstance(ev, Received)]
    assert len(chunks) == 7 and len(whole) == 1
    assert np.array_equal(np.frombuffer(bytes(whole[0].message.buffers[0]), "<f8"), params)


def _toy_run(seed: int, **overrides) -> World:
    cfg = SimConfig(faults=overrides.pop("faults", Faults()), **overrides)
    world = World(seed, toy_setup(overrides.pop("broken", "")), cfg)
    return world


def test_same_seed_same_trace_other_seed_other_trace() -> None:
    faults = Faults(
        loss=0.01,
        duplicate=0.05,
        reorder=0.1,
        jitter_s=0.01,
        partitions=1,
        freezes=1,
        crashes=1,
        clock_jumps=1,
        hostile=1,
    )
    one = World(5, toy_setup(), SimConfig(faults=faults)).run()
    two = World(5, toy_setup(), SimConfig(faults=faults)).run()
    other = World(6, toy_setup(), SimConfig(faults=faults)).run()
    assert one.digest == two.digest and one.stats == two.stats
    assert one.digest != other.digest
    one.check("tests/sim/test_harness.py")


def test_freeze_holds_messages_then_delivers_them_at_once() -> None:
    world = World(3, toy_setup(hostile=False), SimConfig(nodes=2, duration_s=0.6))
    handled: list[tuple[float, str]] = []
    real = world.handle

    def spy(proc, event):
        handled.append((world.sched.now, proc.name, type(event).__name__))
        real(proc, event)

    world.handle = spy
    world.start_controller()
    world.start_node(0)
    world.sched.run(0.3)
    ctl = world.controller
    ctl.frozen_until = 0.6
    world.sched.at(0.6, lambda: (world.net.thaw(ctl), world.handle(ctl, Tick())))
    world.sched.run(0.59)
    assert not [h for h in handled if h[1] == "ctl" and 0.3 < h[0] < 0.59]
    assert ctl.held  # the node's beats wait in its socket buffers
    world.sched.run(0.61)
    burst = [h for h in handled if h[1] == "ctl" and h[0] == 0.6]
    assert len(burst) >= 2 and not ctl.held


def test_crash_restarts_with_a_new_routing_id_and_the_clock_jump_is_monotonic() -> None:
    world = World(4, toy_setup(hostile=False), SimConfig(nodes=2))
    world.start_controller()
    world.start_node(0)
    world.sched.run(0.3)
    first = world.slots[0]
    from sim import injector

    injector.crash(world, 0.1)
    world.sched.run(0.5)
    second = world.slots[0]
    assert second is not first and not first.alive and second.routing_id != first.routing_id
    injector.clock_jump(world, 2.0, second)
    world.sched.run(0.7)
    assert 2.5 < second.last_now <= 2.7 and world.controller.last_now <= 0.7
    second.clock_offset = 0.0  # a clock that went back: the harness still hands out a monotonic now
    world.sched.run(0.8)
    assert second.last_now > 2.5


@pytest.mark.parametrize("broken", ["double_apply", "reapply_own"])
def test_the_invariants_catch_a_broken_machine(broken: str) -> None:
    """A toy with one deliberate bug fails: the checker is not vacuous."""
    faults = Faults(duplicate=0.2, loss=0.05) if broken == "double_apply" else Faults(loss=0.2)
    failed = 0
    for seed in range(6):
        result = World(seed, toy_setup(broken), SimConfig(faults=faults)).run()
        failed += bool(result.failures)
    assert failed >= 3


def test_toy_seeds() -> None:
    """The harness under every fault kind with the toy: no violation, and the faults did happen."""
    seeds = seed_list(scaled(100), first=10_000)
    totals = run_many(
        seeds,
        lambda seed: World(
            seed, toy_setup(), SimConfig(duration_s=1.0, faults=Faults.draw(profile_rng(seed)))
        ).run(),
        "tests/sim/test_harness.py::test_toy_seeds",
    )
    if len(seeds) > 50:
        for kind in (
            "lost",
            "duplicated",
            "reordered",
            "partitions",
            "freezes",
            "crashes",
            "clock_jumps",
            "leaves",
        ):
            assert totals.counts[kind] > 0, kind
        assert sum(v for k, v in totals.counts.items() if k.startswith("hostile_")) > 0
        assert totals.rejected["bad_header"] > 0 and totals.rejected["bad_field"] > 0
