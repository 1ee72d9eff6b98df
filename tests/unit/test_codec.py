"""The header codec without sockets: round trips, and every rejection reason."""

from __future__ import annotations

import contextlib

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.transport.codec import decode_frames, encode_frames, pack_header, update_payload
from psrv.transport.errors import FrameRejectedError
from psrv.transport.header_codes import FIELD_NAMES, OP_NAMES
from psrv.transport.messages import PROTOCOL_VERSION, Message, Op

UPDATE_FIELDS = {"origin": 3, "seq": 7, "iteration": 11, "epoch": 1, "tau": 1e-3, "encoding": "sparse"}


def sample(op: Op) -> Message:
    params = np.arange(6, dtype=np.float32)
    samples = {
        Op.JOIN: ({"address": "127.0.0.1:5000", "name": "part-3", "token": "abc", "session": "ab" * 16}, []),
        Op.JOIN_REPLY: (
            {
                "node_id": 4,
                "mesh": {"version": 2},
                "restart": True,
                "heartbeat_s": 0.5,
                "missed_beats": 3,
                "token": "abc",
                "routes": {0: "00ff", 1: "a1b2"},
            },
            [],
        ),
        Op.MESH: ({"mesh": {"nodes": [[0, -1, "x", [1]]]}, "version": 9, "routes": {0: "00ff"}}, []),
        Op.UPDATE: (UPDATE_FIELDS, [np.array([5, 1, 2, 3], dtype=np.int32)]),
        Op.UPDATES: (
            {"updates": [[3, 7, 11, 1, 1e-3, "sparse"], [4, 2, 0, 0, 0.5, "bitmap"]]},
            [np.array([5, 1, 2, 3], dtype=np.int32), np.array([1, 2], dtype=np.int32)],
        ),
        Op.PARAMS_REQUEST: ({"request_id": 1, "want_updater": False}, []),
        Op.PARAMS_REPLY: (
            {
                "request_id": 1,
                "dtype": "<f4",
                "size": 6,
                "updater_dtype": None,
                "updater_size": 0,
                "watermark": {1: 10, 2: 3},
                "extra_seen": {2: [5, 6]},
                "given_up": {3: [4]},
            },
            [params],
        ),
        Op.CHUNK: (
            {
                "msg_id": 1,
                "index": 0,
                "count": 2,
                "offset": 0,
                "total": 8,
                "inner": {"op": "update"},
                "lengths": [8],
            },
            [b"abcd"],
        ),
        Op.HEARTBEAT: ({"mesh_version": 3, "stats": {"updates_sent": 4, "my_gauge": 1.5, "state": "running"},
                        "watermark": {1: 2}, "delta": True}, []),
        Op.LEAVE: ({"reason": "done"}, []),
        Op.EVICTED: ({"reason": "unknown", "node_id": 3}, []),
        Op.SHUTDOWN: ({"reason": "stop"}, []),
        Op.STATUS_REQUEST: ({}, []),
        Op.STATUS_REPLY: ({"status": {"nodes": []}}, []),
    }
    fields, buffers = samples[op]
    return Message(op, dict(fields), list(buffers), src=2)


def as_bytes(frames: list) -> list[bytes]:
    return [f if isinstance(f, bytes) else memoryview(f).cast("B").tobytes() for f in frames]


@pytest.mark.parametrize("op", list(Op))
def test_every_op_round_trips(op: Op) -> None:
    message = sample(op)
    decoded = decode_frames(as_bytes(encode_frames(message)))
    assert decoded.op is op and decoded.src == 2
    assert decoded.fields == message.fields
    assert [bytes(b) for b in decoded.buffers] == as_bytes(message.buffers)


def test_update_payload_is_a_view_of_the_frame_not_a_copy() -> None:
    frame = bytearray(np.array([5, 1, 2, 3], dtype=np.int32).tobytes())
    message = decode_frames([pack_header(sample(Op.UPDATE).header()), memoryview(frame)])
    payload = update_payload(message)
    assert payload.tolist() == [5, 1, 2, 3]
    frame[0] = 9
    assert payload[0] == 9, "the payload must alias the received buffer"


def test_encode_passes_buffers_through_untouched() -> None:
    array = np.array([1, 2], dtype=np.int32)
    frames = encode_frames(Message(Op.UPDATE, UPDATE_FIELDS, [array], src=1))
    assert frames[1] is array


def header(**changes) -> bytes:
    h = sample(Op.UPDATE).header()
    h.update(changes)
    return pack_header({k: v for k, v in h.items() if v is not ...})


PAYLOAD = np.array([5, 1, 2, 3], dtype=np.int32).tobytes()


@pytest.mark.parametrize(
    ("frames", "reason"),
    [
        ([], "empty"),
        ([b"\xc7\xff\x00garbage"], "bad_header"),
        ([b"\xc1\xff\x00garbage"], "unknown_version"),  # a compact update's tag, version 31
        ([msgpack.packb([1, 2, 3])], "bad_header"),
        ([header(v=PROTOCOL_VERSION + 1), PAYLOAD], "unknown_version"),
        ([header(v=...), PAYLOAD], "unknown_version"),
        ([header(op="teleport"), PAYLOAD], "unknown_type"),
        ([header(op=len(OP_NAMES)), PAYLOAD], "unknown_type"),  # past the last op code
        ([header(op=-1), PAYLOAD], "unknown_type"),
        ([header(op=4.0), PAYLOAD], "unknown_type"),
        ([msgpack.packb({**msgpack.unpackb(header()), FIELD_NAMES.index("seq"): 7}), PAYLOAD],
         "bad_header"),  # a field by name and by code
        ([msgpack.packb({**msgpack.unpackb(header()), len(FIELD_NAMES): 7}), PAYLOAD], "bad_header"),
        ([msgpack.packb({**msgpack.unpackb(header()), b"seq": 7}), PAYLOAD], "bad_header"),
        ([msgpack.packb({**msgpack.unpackb(header()), 1.5: 7}), PAYLOAD], "bad_header"),
        ([header(src="me"), PAYLOAD], "bad_field"),
        ([header(src=-7), PAYLOAD], "bad_field"),
        ([header(seq=...), PAYLOAD], "bad_field"),
        ([header(seq="7"), PAYLOAD], "bad_field"),
        ([header(seq=True), PAYLOAD], "bad_field"),
        ([header(seq=0), PAYLOAD], "bad_field"),
        ([header(extra=1), PAYLOAD], "bad_field"),
        ([header()], "bad_buffers"),
        ([header(), PAYLOAD, PAYLOAD], "bad_buffers"),
        ([header(), PAYLOAD[:-1]], "bad_payload"),
        ([header(), b""], "bad_payload"),
    ],
)
def test_bad_frames_are_rejected_with_their_reason(frames: list, reason: str) -> None:
    with pytest.raises(FrameRejectedError) as info:
        decode_frames(frames)
    assert info.value.reason == reason
    assert info.value.detail  # says what was expected and what came


def test_size_limits() -> None:
    with pytest.raises(FrameRejectedError) as info:
        decode_frames([header(), PAYLOAD], max_header_bytes=10)
    assert info.value.reason == "header_too_large"
    with pytest.raises(FrameRejectedError) as info:
        decode_frames([header(), PAYLOAD * 100], max_message_bytes=1000)
    assert info.value.reason == "message_too_large"


def test_a_batch_must_have_one_well_formed_row_per_buffer() -> None:
    from psrv.server.updates import MAX_BATCH, batch_message, groups, unbatch

    message = sample(Op.UPDATES)
    items = unbatch(decode_frames(as_bytes(encode_frames(message))))
    assert [f["origin"] for f, _ in items] == [3, 4] and items[1][0]["encoding"] == "bitmap"
    assert batch_message(items, src=1).op is Op.UPDATES
    lone = batch_message(items[:1], src=1)  # a lone update is an UPDATES of one row: 3 bytes smaller
    assert lone.op is Op.UPDATES and unbatch(decode_frames(as_bytes(encode_frames(lone)))) == items[:1]
    big = 2**62 + 12345  # ids are random 63-bit numbers
    fields = {"origin": big, "seq": 1234, "iteration": 1234, "epoch": 3, "tau": 1.23e-3, "encoding": "packed"}
    named = len(encode_frames(Message(Op.UPDATE, fields, [b"1234"], src=big))[0])
    assert (named, len(encode_frames(batch_message([(fields, b"1234")], src=big))[0])) == (54, 51)
    assert [len(g) for g in groups([({}, b"1234")] * (MAX_BATCH + 3))] == [MAX_BATCH, 3]
    for rows, reason in [
        ([[3, 7, 11, 1, 1e-3, "sparse"]], "bad_buffers"),
        ([[3, 7, 11, 1, 1e-3, "sparse"], [4, 2, 0, 0, 0.5]], "bad_field"),
        ([[3, 7, 11, 1, 1e-3, "sparse"], [4, 0, 0, 0, 0.5, "x"]], "bad_field"),
        ([[3, 7, 11, 1, 1e-3, "sparse"], [4, True, 0, 0, 0.5, "x"]], "bad_field"),
    ]:
        bad = Message(Op.UPDATES, {"updates": rows}, list(message.buffers), src=2)
        with pytest.raises(FrameRejectedError) as info:
            decode_frames(as_bytes(encode_frames(bad)))
        assert info.value.reason == reason
    odd = Message(Op.UPDATES, message.fields, [message.buffers[0], b"abc"], src=2)
    with pytest.raises(FrameRejectedError, match="int32"):
        decode_frames(as_bytes(encode_frames(odd)))


def test_params_reply_buffer_must_match_its_header() -> None:
    message = sample(Op.PARAMS_REPLY)
    message.fields["size"] = 7
    with pytest.raises(FrameRejectedError) as info:
        decode_frames(as_bytes(encode_frames(message)))
    assert info.value.reason == "bad_payload"
    message.fields.update(size=6, dtype="<i4")
    with pytest.raises(FrameRejectedError, match="float"):
        decode_frames(as_bytes(encode_frames(message)))


def test_inconsistent_chunk_is_rejected() -> None:
    message = sample(Op.CHUNK)
    message.fields["offset"] = 6  # 6 + 4 > total 8
    with pytest.raises(FrameRejectedError) as info:
        decode_frames(as_bytes(encode_frames(message)))
    assert info.value.reason == "bad_chunk"


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_random_bytes_never_escape_as_anything_but_a_rejection(frames: list[bytes]) -> None:
    with contextlib.suppress(FrameRejectedError):
        decode_frames(frames)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(
        st.one_of(
            st.sampled_from(
                ["v", "op", "src", "origin", "seq", "tau", "encoding", "iteration", "epoch", "x"]
            ),
            st.integers(-2, len(FIELD_NAMES) + 2),  # names and codes, known and not
        ),
        st.one_of(st.integers(-3, 3), st.text(max_size=3), st.none(), st.floats(), st.booleans()),
        max_size=10,
    )
)
def test_random_headers_never_escape_as_anything_but_a_rejection(h: dict) -> None:
    with contextlib.suppress(FrameRejectedError):
        decode_frames([pack_header(h), PAYLOAD])


def encoded(n: int = 64) -> np.ndarray:
    from psrv.encoding import encode

    residual = np.zeros(n, dtype=np.float32)
    residual[[1, 5]] = [2.0, -2.0]
    return encode(residual, 1.0)


def test_payload_header_check_is_structural_and_names_the_problem() -> None:
    from psrv.server.updates import check_payload

    message = encoded()
    payload, info = check_payload(message, 64, "update")
    assert payload is message or np.shares_memory(payload, message)
    assert (info.form, info.count, info.n, info.tau) == ("sparse", 2, 64, 1.0)
    bitmap = np.array([40, 40, np.float32(0.5).view(np.int32), 1, 1, 2, 3], dtype=np.int32)
    assert check_payload(bitmap, 40, "update")[1].count is None  # a bitmap's count needs the body
    form7 = np.concatenate([message[:3], [7], message[4:]]).astype(np.int32)
    cases = {
        "this model has 65": (message, 65, np.inf),
        "header alone": (message[:3], 64, np.inf),
        "indices but its header says": (np.concatenate([message, message[-1:]]), 64, np.inf),
        "unknown message form": (form7, 64, np.inf),
        "positive finite": (np.concatenate([message[:2], [0], message[3:]]).astype(np.int32), 64, np.inf),
        "max_tau": (message, 64, 0.5),
        "1-D int32": (message.astype(np.int64), 64, np.inf),
    }
    for expected, (payload, size, max_tau) in cases.items():
        with pytest.raises(FrameRejectedError, match=expected) as info_:
            check_payload(payload, size, "update", max_tau)
        assert info_.value.reason == "bad_payload" and info_.value.detail.startswith("update: ")


def test_restored_seen_set_is_exactly_the_downloaded_one() -> None:
    from psrv.server.seen import covered, restore

    watermark, extra = {1: 5, 2: 0}, {2: [3, 4], 3: [9]}
    seen = restore(1024, watermark, extra)
    for origin, seq in [(1, 1), (1, 5), (2, 3), (2, 4), (3, 9)]:
        assert covered(watermark, extra, origin, seq) and not seen.first_time(origin, seq)
    for origin, seq in [(1, 6), (2, 1), (2, 5), (3, 1), (4, 1)]:
        assert not covered(watermark, extra, origin, seq) and seen.first_time(origin, seq)


def test_a_mesh_packed_once_encodes_exactly_like_a_plain_one() -> None:
    from psrv.server.mesh import MeshOrganizer
    from psrv.transport.codec import PackedDict

    mesh = MeshOrganizer("mesh", 2)
    for i in range(1, 40):
        mesh.add_node(mesh.allocate_id(), f"10.0.0.{i}:7000")
    snapshot = mesh.to_dict()
    for routes in ({0: "ab"}, {i: "cd" * 8 for i in range(20)}):  # beside a small and a large value
        fields = {"version": mesh.version, "routes": routes}
        packed = encode_frames(Message(Op.MESH, {"mesh": PackedDict(snapshot), **fields}, src=0))
        plain = encode_frames(Message(Op.MESH, {"mesh": snapshot, **fields}, src=0))
        assert packed == plain and decode_frames(packed)["mesh"] == snapshot
