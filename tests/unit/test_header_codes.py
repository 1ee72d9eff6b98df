"""A header's field names and op travel as codes: every name of the catalogue has one, every message
round-trips exactly, a control message takes a fraction of its named bytes, and no key or code,
however absurd, escapes as anything but a rejection with its reason."""

from __future__ import annotations

import os

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.transport.codec import decode_frames, encode_frames, pack_header
from psrv.transport.errors import FrameRejectedError
from psrv.transport.header_codes import FIELD_NAMES, OP_NAMES, compact_header, expand_header
from psrv.transport.messages import CATALOGUE, PROTOCOL_VERSION, RESERVED, Message, Op

from tests.unit.test_codec import sample
from tests.unit.test_heartbeat_stats import SPARK_BEAT


def test_every_name_of_the_catalogue_and_every_op_has_a_one_byte_code() -> None:
    names = {name for schema in CATALOGUE.values() for name in schema.fields} | set(RESERVED) - {"v"}
    assert names | {"known"} == set(FIELD_NAMES) and len(FIELD_NAMES) == len(set(FIELD_NAMES))
    assert set(OP_NAMES) == {op.value for op in Op} and len(OP_NAMES) == len(set(OP_NAMES))
    assert len(FIELD_NAMES) <= 128 and len(OP_NAMES) <= 128  # msgpack's positive fixint: one byte
    assert "v" not in FIELD_NAMES  # every version reads every other's version by name


@pytest.mark.parametrize("op", list(Op), ids=[op.value for op in Op])
def test_every_op_travels_by_code_and_comes_back_exactly(op: Op) -> None:
    message = sample(op)
    frames = encode_frames(message)
    header = msgpack.unpackb(frames[0], strict_map_key=False) if frames[0][:1] != b"\xc1" else None
    if header is not None:  # (a compact update frame has no msgpack header)
        assert set(header) - {"v"} <= set(range(len(FIELD_NAMES))), header.keys()
        assert header[FIELD_NAMES.index("op")] == OP_NAMES.index(op.value)
    back = decode_frames(frames)
    assert (back.op, back.src, back.fields) == (message.op, message.src, message.fields)


def test_a_header_that_names_its_fields_is_still_accepted() -> None:
    named = pack_header({"v": PROTOCOL_VERSION, "op": "leave", "src": 4, "reason": "done"})
    assert decode_frames([named]).fields == {"reason": "done"}
    mixed = pack_header({"v": PROTOCOL_VERSION, FIELD_NAMES.index("op"): OP_NAMES.index("leave"), "src": 4,
                         FIELD_NAMES.index("reason"): "done"})
    assert decode_frames([mixed]).fields == {"reason": "done"}


def test_another_version_is_refused_by_name_whatever_its_keys() -> None:
    old = pack_header({"v": PROTOCOL_VERSION - 1, "op": "leave", "src": 4, "reason": "done"})
    coded = pack_header(compact_header({"v": PROTOCOL_VERSION + 1, "op": "leave", "src": 4, "reason": "x"}))
    for frame in (old, coded):
        with pytest.raises(FrameRejectedError, match="protocol version") as caught:
            decode_frames([frame])
        assert caught.value.reason == "unknown_version"


def test_a_nodes_messages_of_a_fit_take_a_fraction_of_their_named_bytes() -> None:
    """What a Spark task's node sends beside its updates: a join, a master-copy request, its beats
    and a leave; their names were most of their bytes."""
    messages = [
        Message(Op.JOIN, {"address": "tcp://127.0.0.1:45123", "name": "1a2b3c4d-p3",
                          "token": os.urandom(16).hex(), "session": os.urandom(16).hex()}),
        Message(Op.PARAMS_REQUEST, {"request_id": 1, "want_updater": True}, src=5),
        Message(Op.HEARTBEAT, {"mesh_version": 3, "stats": SPARK_BEAT, "watermark": {}}, src=5),
        Message(Op.LEAVE, {"reason": "done"}, src=5),
    ]
    coded = [sum(len(f) for f in encode_frames(m)) for m in messages]
    named = [len(pack_header(expand_header(msgpack.unpackb(encode_frames(m)[0], strict_map_key=False))))
             for m in messages]
    assert coded[1] <= named[1] / 4 and coded[3] <= named[3] / 2, (coded, named)
    assert sum(coded) <= 0.75 * sum(named), (coded, named)


def test_a_key_neither_name_nor_code_or_a_field_twice_is_a_bad_header() -> None:
    for key, why in [(len(FIELD_NAMES), "unknown field code"), (-1, "unknown field code"),
                     (b"reason", "string or a code"), (None, "string or a code"), (2.5, "string or a code"),
                     ("reason", "twice")]:
        header = {"v": PROTOCOL_VERSION, 0: OP_NAMES.index("leave"), 1: 4, FIELD_NAMES.index("reason"): "x",
                  key: "y"}
        with pytest.raises(FrameRejectedError, match=why) as caught:
            decode_frames([msgpack.packb(header)])
        assert caught.value.reason == "bad_header"
    for code in (len(OP_NAMES), -1):
        with pytest.raises(FrameRejectedError, match="message type code") as caught:
            expand_header({"v": PROTOCOL_VERSION, "op": code})
        assert caught.value.reason == "unknown_type"


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from([*FIELD_NAMES, "v", "other"]),
                       st.one_of(st.integers(), st.text(max_size=4), st.none(), st.sampled_from(OP_NAMES)),
                       max_size=12))
def test_expanding_a_compacted_header_gives_it_back_exactly(header: dict) -> None:
    if "op" in header and type(header["op"]) is not str:  # a message's op is its name
        header["op"] = "heartbeat"
    assert expand_header(compact_header(header)) == header
