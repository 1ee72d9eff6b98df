"""A heartbeat's stats: well-known names travel as codes, and a node sends what changed since its
previous beat (its first beat of a membership: what differs from the baseline the controller holds
from the join), all of it every tenth beat; the controller merges. The property: what the controller
holds after each beat is exactly the node's full stats of that beat, but for the stats that ride on
the full beats only, which are those of the last full beat."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.server.node_state import NodeState
from psrv.server.node_timers import FULL_BEATS_ONLY, FULL_STATS_EVERY, StatsDelta
from psrv.transport.codec import decode_frames, encode_frames, pack_header
from psrv.transport.errors import FrameRejectedError
from psrv.transport.events import Received, Tick
from psrv.transport.loopstats import LoopStats
from psrv.transport.messages import PROTOCOL_VERSION, Message, Op
from psrv.transport.stat_codes import BEAT_BASELINE, STAT_NAMES, compact_stats, expand_stats

from tests.unit.test_controller_machine import join, machine, rid_of
from tests.unit.test_node_machine import Harness, joined
from tests.unit.test_node_machine_rejoin import _cut_off, _rejoin_as

SPARK_BEAT = {  # what a Spark task's node reports each beat
    **{name: 1234 for name in STAT_NAMES[:8]}, "state": "running", "mesh_version": 3, "beat_late_ms": 1.25,
    "beat_gap_max_ms": 1020.5, "clock_offset_s": 0.0012, "clock_error_s": 0.0003, "clock_sent": 1.7e9,
    "train_partition": 3, "train_epoch": 1, "train_steps": 25, "train_examples": 800,
    "train_bytes_out": 12345, "train_bytes_in": 54321, "train_loss": 0.6931,
}


#: a Spark task's node's first beat of a fit, as logged from a real run (8 tasks of `seq`, protocol 5):
#: 292 bytes as a full beat, most of them zeros and the loop gauges' names
FIRST_SPARK_BEAT = {
    "updates_sent": 0, "updates_received": 0, "updates_applied": 0, "updates_relayed": 0,
    "duplicates_dropped": 0, "updates_dropped_backpressure": 0, "resyncs": 1, "rejected_total": 0,
    "state": "syncing", "mesh_version": 2, "loop_receive_max_ms": 0.0, "loop_send_max_ms": 0.0,
    "loop_tick_max_ms": 0.0, "loop_max_ms": 0.0, "beat_late_max_ms": 0.0, "pending_max": 0,
    "loop_iterations": 0, "handler_ms": {"join_reply": [1, 0.33, 0.33]}, "beat_late_ms": 0.0,
    "clock_sent": 1796344757.6750715,
}


def beat_bytes(stats: dict, **extra) -> int:
    message = Message(Op.HEARTBEAT, {"mesh_version": 3, "stats": stats, "watermark": {}, **extra}, src=5)
    return sum(len(frame) for frame in encode_frames(message))


def round_trip(stats: dict, **extra) -> Message:
    message = Message(Op.HEARTBEAT, {"mesh_version": 3, "stats": stats, "watermark": {}, **extra}, src=5)
    return decode_frames(encode_frames(message))


# ------------------------------------------------------------------------------ codes on the wire


def test_every_well_known_name_and_any_other_round_trips_exactly() -> None:
    stats = {name: index * 1.5 if index % 2 else index for index, name in enumerate(STAT_NAMES)}
    stats.update({"my_gauge": "x", "nested": {"a": 1}, "state": "running", "train_loss": float("inf")})
    assert round_trip(stats).fields["stats"] == stats
    assert round_trip({}).fields["stats"] == {}


def test_names_as_codes_cut_a_spark_beat_to_less_than_half() -> None:
    plain = len(pack_header({"v": PROTOCOL_VERSION, "op": "heartbeat", "src": 5, "mesh_version": 3,
                             "stats": SPARK_BEAT, "watermark": {}}))
    assert beat_bytes(SPARK_BEAT) < plain / 2, (beat_bytes(SPARK_BEAT), plain)


def test_a_value_that_is_no_scalar_keeps_its_name() -> None:
    known, rest = compact_stats({"train_loss": [1, 2], "updates_sent": 3})
    assert rest == {"train_loss": [1, 2]} and known == [STAT_NAMES.index("updates_sent"), 3]


@pytest.mark.parametrize("known, why", [
    ([0], "code, value"), ("01", "code, value"), ([len(STAT_NAMES), 1], "stat code"), ([-1, 1], "stat code"),
    ([True, 1], "stat code"), ([0, [1]], "scalar"), ([0, 1, 0, 2], "twice"),
])
def test_a_bad_known_list_is_rejected_as_a_bad_field(known, why) -> None:
    with pytest.raises(FrameRejectedError, match=why) as caught:
        expand_stats(known, {})
    assert caught.value.reason == "bad_field"


def test_a_code_that_repeats_a_name_in_the_map_is_rejected_on_the_wire() -> None:
    header = {"v": PROTOCOL_VERSION, "op": "heartbeat", "src": 5, "mesh_version": 1, "watermark": {},
              "stats": {"updates_sent": 1}, "known": [0, 2]}
    with pytest.raises(FrameRejectedError, match="twice"):
        decode_frames([msgpack.packb(header)])


def test_a_beat_without_the_delta_flag_reads_as_a_full_one() -> None:
    assert round_trip({"x": 1}).fields["delta"] is None
    assert round_trip({"x": 1}, delta=True).fields["delta"] is True
    header = {"v": PROTOCOL_VERSION, "op": "heartbeat", "src": 5, "mesh_version": 1, "watermark": {},
              "stats": {}, "delta": 1}
    with pytest.raises(FrameRejectedError, match="delta"):
        decode_frames([msgpack.packb(header)])


# ------------------------------------------------------------------------------ deltas at the node


scalars = st.one_of(st.integers(-5, 5), st.sampled_from([0.5, 1.0, True, False, "running", "joining", None]))
names = st.sampled_from(["a", "b", "c", "d", "updates_sent", "state", "slow"])
stat_maps = st.dictionaries(names, scalars, max_size=7)
baselines = st.dictionaries(st.sampled_from(["a", "b", "updates_sent"]), scalars, max_size=3)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(stat_maps, st.booleans()), min_size=1, max_size=30), st.integers(1, 5), baselines)
def test_merging_what_is_sent_gives_every_beats_full_stats(beats, full_every, baseline) -> None:
    """A receiver that starts from the baseline at each join, replaces on a full beat and merges a
    delta holds exactly each beat's stats, whatever the sequence (values changing type, names coming
    and going, rejoins), but for a full-only stat, which holds the value of the last full beat."""
    deltas = StatsDelta(full_every, baseline, full_only=frozenset({"slow"}))
    held: dict = dict(baseline)
    last_full: dict = {}
    since_full = 0
    for stats, rejoin in beats:
        if rejoin:
            deltas.reset()
            held, last_full, since_full = dict(baseline), {}, 0
        sent, delta = deltas.next(dict(stats))
        since_full = since_full + 1 if delta else 0
        assert since_full < full_every
        if delta:
            assert "slow" not in sent
            held = {**held, **sent}
        else:
            held, last_full = dict(sent), dict(sent)
        fast = {k: v for k, v in stats.items() if k != "slow"}
        assert {k: v for k, v in held.items() if k != "slow"} == fast
        assert all(type(held[k]) is type(v) for k, v in fast.items())
        if "slow" in held:
            assert held["slow"] == last_full["slow"] or held["slow"] == baseline.get("slow")


def test_a_first_beat_says_only_how_it_differs_from_the_baseline() -> None:
    deltas = StatsDelta()
    sent, delta = deltas.next(dict(FIRST_SPARK_BEAT))
    assert delta and sent == {"resyncs": 1, "state": "syncing", "mesh_version": 2,
                              "clock_sent": FIRST_SPARK_BEAT["clock_sent"]}
    fast = {k: v for k, v in FIRST_SPARK_BEAT.items() if k not in FULL_BEATS_ONLY}
    assert {**BEAT_BASELINE, **sent} == fast
    # 292 bytes as a full beat under protocol 5; its names as codes alone leave the zeros
    assert beat_bytes(sent, delta=True) <= 50 < beat_bytes(FIRST_SPARK_BEAT) <= 200, (
        beat_bytes(sent, delta=True), beat_bytes(FIRST_SPARK_BEAT))
    deltas.reset()  # a rejoin: the baseline again
    assert deltas.next(dict(FIRST_SPARK_BEAT)) == (sent, True)


def test_a_node_without_a_baseline_stat_beats_in_full() -> None:
    stats = {k: v for k, v in FIRST_SPARK_BEAT.items() if k != "loop_iterations"}
    assert StatsDelta().next(dict(stats)) == (stats, False)


def test_handler_times_ride_on_the_full_beats_only() -> None:
    deltas = StatsDelta()
    beats = [deltas.next({**FIRST_SPARK_BEAT, "handler_ms": {"updates": [n, 0.1 * n, 0.1]}})
             for n in range(1, 2 * FULL_STATS_EVERY + 1)]
    assert [delta for _, delta in beats].count(False) == 2
    assert all(("handler_ms" in sent) == (not delta) for sent, delta in beats)


def test_a_delta_carries_only_what_changed_and_every_tenth_beat_all() -> None:
    deltas = StatsDelta()
    assert deltas.next(dict(SPARK_BEAT)) == (SPARK_BEAT, False)
    changed = {"updates_sent": 1300, "train_steps": 26, "clock_sent": 1.7e9 + 1}
    assert deltas.next({**SPARK_BEAT, **changed}) == (changed, True)
    assert deltas.next({**SPARK_BEAT, **changed}) == ({}, True)
    kinds = [deltas.next({**SPARK_BEAT, "train_steps": step})[1] for step in range(FULL_STATS_EVERY)]
    assert kinds.count(False) == 1 and kinds.index(False) == FULL_STATS_EVERY - 3
    assert beat_bytes(changed, delta=True) < beat_bytes(SPARK_BEAT) / 2


def test_a_name_that_went_away_makes_the_next_beat_full() -> None:
    deltas = StatsDelta()
    deltas.next({"a": 1, "b": 2})
    assert deltas.next({"a": 1}) == ({"a": 1}, False)


def sent_beats(h, actions) -> list[Message]:
    return [send.message for send in h.sent(actions, Op.HEARTBEAT, 0)]


def test_a_node_beats_its_differences_after_joining_then_what_changed_and_so_again_after_a_rejoin() -> None:
    h = joined()
    LoopStats(h.machine.counters_.gauges)  # as the I/O loop keeps them
    first = sent_beats(h, h.handle(Tick(), dt=1.0))
    assert len(first) == 1 and first[0].fields.get("delta") is True
    full = h.machine.timers.beat_stats()
    assert {**BEAT_BASELINE, **round_trip(first[0]["stats"]).fields["stats"]} == {
        k: v for k, v in full.items() if k not in FULL_BEATS_ONLY}
    assert "updates_sent" not in first[0]["stats"] and first[0]["stats"]["state"] == "running"
    h.submit(3)
    second = sent_beats(h, h.handle(Tick(), dt=1.0))
    assert second[0].fields.get("delta") is True
    assert second[0]["stats"]["updates_sent"] == 1 and "resyncs" not in second[0]["stats"]
    _cut_off(h)
    _rejoin_as(h, 5)
    h.catch_up()
    assert h.machine.state is NodeState.RUNNING
    again = [m for _ in range(3) for m in sent_beats(h, h.handle(Tick(), dt=1.0))]
    assert again and again[0].fields.get("delta") is True and again[0].src == 5
    # said again to the new membership's record, though unchanged since the previous one's last beat
    assert again[0]["stats"]["updates_sent"] == 1 and again[0]["stats"]["resyncs"] >= 1


def test_a_syncing_node_reports_no_checksum_of_its_replica() -> None:
    h = Harness()
    h.join(1)
    assert h.machine.state is NodeState.SYNCING
    assert not {"params_sum", "params_crc32"} & set(h.machine.timers.beat_stats())
    h.catch_up()
    assert {"params_sum", "params_abs_sum", "params_crc32"} <= set(h.machine.timers.beat_stats())


# ------------------------------------------------------------------------------ the controller merges


def stats_of(m, node_id: int) -> dict:
    return next(n["stats"] for n in m.status(10.0)["nodes"] if n["id"] == node_id)


def test_the_controller_merges_a_delta_and_replaces_on_a_full_beat() -> None:
    m = machine()
    node_id, _ = join(m, 1, 0.0)

    def beat(stats: dict, now: float, **extra) -> None:
        fields = {"mesh_version": 0, "stats": stats, "watermark": {}, **extra}
        message = Message(Op.HEARTBEAT, fields, src=node_id)
        m.handle(Received(decode_frames(encode_frames(message)), rid_of(1)), now)

    beat({"updates_sent": 1, "state": "running", "my_gauge": 7}, 1.0)
    before = stats_of(m, node_id)
    beat({"updates_sent": 2}, 2.0, delta=True)
    assert stats_of(m, node_id) == {"updates_sent": 2, "state": "running", "my_gauge": 7}
    assert before == {"updates_sent": 1, "state": "running", "my_gauge": 7}  # a status handed out stays
    beat({"updates_sent": 3}, 3.0)
    assert stats_of(m, node_id) == {"updates_sent": 3}


def test_a_member_holds_the_baseline_from_its_join_and_its_first_beat_merges_into_it() -> None:
    m = machine()
    node_id, _ = join(m, 1, 0.0)
    assert stats_of(m, node_id) == BEAT_BASELINE
    sent, delta = StatsDelta().next(dict(FIRST_SPARK_BEAT))
    message = Message(Op.HEARTBEAT, {"mesh_version": 0, "stats": sent, "watermark": {}, "delta": delta},
                      src=node_id)
    m.handle(Received(decode_frames(encode_frames(message)), rid_of(1)), 1.0)
    assert stats_of(m, node_id) == {k: v for k, v in FIRST_SPARK_BEAT.items() if k not in FULL_BEATS_ONLY}
