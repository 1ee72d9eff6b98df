"""Small updates in one compact frame: the same updates back bit for bit, a lone one or a batch,
nothing the frame cannot carry exactly, and no frame, however broken, taken for updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.encoding import compact, encode, update_frame
from psrv.encoding.errors import MalformedMessageError
from psrv.encoding.update_header import FIELD_NAMES, INT64_MAX, payload_header
from psrv.server.updates import batch_message, unbatch
from psrv.transport.codec import decode_frames, encode_frames, frame_size
from psrv.transport.errors import FrameRejectedError
from psrv.transport.messages import PROTOCOL_VERSION, Message, Op

INT64 = st.integers(-INT64_MAX, INT64_MAX)
IDS = st.integers(1, INT64_MAX)


def update(n: int, values: list[float], tau: float) -> np.ndarray | None:
    message = encode(np.array(values, dtype=np.float32), tau)
    return None if message is None else compact(message)


def row_for(payload: np.ndarray, origin: int, seq: int, iteration: int, epoch: int) -> list:
    header = payload_header(payload, int(payload[1]))
    return [origin, seq, iteration, epoch, header.tau, header.form]


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(1, 2000),
    data=st.data(),
    tau=st.floats(1e-3, 5.0),
    src=st.integers(-1, 2**40),
    origin=IDS,
    seq=IDS,
    iteration=INT64,
    epoch=INT64,
    own=st.booleans(),
)
def test_every_update_a_node_makes_comes_back_bit_for_bit(
    n: int, data: st.DataObject, tau: float, src: int, origin: int, seq: int, iteration: int, epoch: int,
    own: bool,
) -> None:
    values = data.draw(st.lists(st.floats(-8.0, 8.0, width=32), min_size=n, max_size=n))
    payload = update(n, values, tau)
    if payload is None:
        return
    if own and src > 0:
        origin = src
    row = row_for(payload, origin, seq, iteration, epoch)
    sent = Message(Op.UPDATES, {"updates": [row]}, [payload], src=src)
    frames = encode_frames(sent)
    if payload.nbytes <= update_frame.MAX_PAYLOAD_BYTES:
        assert len(frames) == 1 and update_frame.is_update_frame(frames[0][0])
        assert len(frames[0]) < payload.nbytes + 40, "the frame must be smaller than the old form"
    received = decode_frames(frames)
    assert received.op is Op.UPDATES and received.src == src
    assert received.fields == {"updates": [row]}
    (fields, buffer), = unbatch(received)
    assert [fields[name] for name in FIELD_NAMES] == row
    assert bytes(memoryview(buffer).cast("B")) == payload.tobytes()


def test_a_node_s_own_small_update_costs_a_fraction_of_its_old_form() -> None:
    """The seq task's model (788 parameters) with 9 elements a message: the update's whole frame is
    smaller than its payload was alone."""
    rng = np.random.default_rng(0)
    residual = rng.standard_normal(788).astype(np.float32)
    tau = float(np.sort(np.abs(residual))[-9])
    payload = compact(encode(residual, tau))
    row = row_for(payload, 3, 1500, 3000, 1)
    message = batch_message([(dict(zip(FIELD_NAMES, row, strict=True)), payload)], src=3)
    frames = encode_frames(message)
    old = Message(Op.UPDATES, message.fields, message.buffers, src=3).header()
    from psrv.transport.codec import pack_header

    old_bytes = len(pack_header(old)) + payload.nbytes
    assert len(frames) == 1 and len(frames[0]) < payload.nbytes
    assert old_bytes - len(frames[0]) >= 50


@pytest.mark.parametrize(
    "change",
    [
        {"tau": 0.25},  # not the payload's own τ
        {"encoding": "sparse"},  # not the payload's form
        {"iteration": 2**63},  # out of range: the msgpack form carries it to its rejection
        {"origin": 0},
    ],
    ids=repr,
)
def test_what_the_frame_cannot_carry_exactly_travels_as_before(change: dict) -> None:
    payload = update(40, [0.0] * 10 + [3.0] * 5 + [0.0] * 25, 0.5)
    assert payload is not None
    row = row_for(payload, 3, 7, 11, 1)
    fields = {**dict(zip(FIELD_NAMES, row, strict=True)), **change}
    message = Message(Op.UPDATES, {"updates": [[fields[n] for n in FIELD_NAMES]]}, [payload], src=2)
    assert update_frame.pack(2, message["updates"], [payload], PROTOCOL_VERSION) is None
    frames = encode_frames(message)
    assert len(frames) == 2 and not update_frame.is_update_frame(frames[0][0])


def test_a_large_update_keeps_its_zero_copy_buffer() -> None:
    n = 200_000
    payload = update(n, [1.0] * n, 0.5)  # a bitmap of 50 KB
    assert payload is not None and payload.nbytes > update_frame.MAX_PAYLOAD_BYTES
    frames = encode_frames(Message(Op.UPDATES, {"updates": [row_for(payload, 1, 1, 0, 0)]}, [payload], 1))
    assert len(frames) == 2 and frames[1] is payload


def test_a_relayed_frame_is_sent_compact_too() -> None:
    payload = update(40, [3.0] + [0.0] * 39, 0.5)
    assert payload is not None
    relayed = memoryview(bytearray(payload.tobytes()))
    message = Message(Op.UPDATES, {"updates": [row_for(payload, 4, 2, 9, 0)]}, [relayed], src=2)
    frames = encode_frames(message)
    assert len(frames) == 1
    assert bytes(memoryview(decode_frames(frames).buffers[0]).cast("B")) == payload.tobytes()


def good_frame() -> bytes:
    payload = update(100, [0.0] * 50 + [2.0, -2.0, 2.0] + [0.0] * 47, 0.5)
    assert payload is not None
    frame = update_frame.pack(5, [row_for(payload, 5, 300, 600, 2)], [payload], PROTOCOL_VERSION)
    assert frame is not None
    return frame


def test_a_frame_cut_before_its_body_is_refused() -> None:
    """ZeroMQ delivers whole frames; still, a frame that ends inside its fields is refused as a broken
    header, never read past its end (a cut body is the payload checks' and the full decode's to find,
    as for the msgpack form)."""
    frame = good_frame()
    body_starts = len(frame) - 3  # the three elements' packed body, as good_frame makes it
    assert frame[body_starts - 4:body_starts] == np.float32(0.5).tobytes()
    for end in range(1, body_starts):
        with pytest.raises(FrameRejectedError) as info:
            decode_frames([frame[:end]])
        assert info.value.reason in {"unknown_version", "bad_header", "bad_field", "bad_payload"}, end
    with pytest.raises(FrameRejectedError) as info:
        decode_frames([frame, b"extra"])
    assert info.value.reason == "bad_buffers"


def test_a_broken_layout_names_its_problem() -> None:
    frame = good_frame()
    with pytest.raises(MalformedMessageError, match="over 10 bytes"):
        update_frame.unpack(frame[:2] + b"\xff" * 12)
    with pytest.raises(MalformedMessageError, match="not a minimal"):
        update_frame.unpack(frame[:2] + bytes([0x82, 0x00]) + frame[3:])
    with pytest.raises(MalformedMessageError, match="ends inside"):
        update_frame.unpack(frame[:4])
    with pytest.raises(MalformedMessageError, match="not a compact"):
        update_frame.unpack(b"\x84\x00")
    with pytest.raises(ValueError, match="versions 0 to 31"):
        update_frame.pack(1, [[1, 1, 0, 0, 0.5, "sparse"]], [np.zeros(4, np.int32)], 32)


def test_another_protocol_version_is_refused_as_such() -> None:
    """A compact frame names its protocol version, as a msgpack header does with ``v``; garbage that
    repeats the tag byte names an impossible one."""
    frame = good_frame()
    for version in (PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1):
        other = frame[:1] + bytes([version << 3 | frame[1] & 0x07]) + frame[2:]
        with pytest.raises(FrameRejectedError) as info:
            decode_frames([other])
        assert info.value.reason == "unknown_version"
    for garbage in (bytes([update_frame.TAG]) * 30, bytes([update_frame.TAG])):
        with pytest.raises(FrameRejectedError) as info:
            decode_frames([garbage])
        assert info.value.reason == "unknown_version"


@settings(max_examples=500, deadline=None)
@given(st.binary(min_size=0, max_size=80), st.integers(0, 7))
def test_no_frame_of_garbage_stops_the_decoder(body: bytes, low_bits: int) -> None:
    frame = bytes([update_frame.TAG, PROTOCOL_VERSION << 3 | low_bits]) + body
    try:
        message = decode_frames([frame])
    except FrameRejectedError as exc:
        assert exc.reason in {"bad_header", "bad_field", "bad_payload", "bad_buffers"}
        return
    # what passes is a well-formed update by every check of the catalogue
    assert message.op is Op.UPDATES and len(message.buffers) == 1
    assert frame_size(message.buffers[0]) % 4 == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**64 - 1))
def test_varints_round_trip_to_the_last_bit(value: int) -> None:
    out = bytearray((update_frame.TAG, 0))
    update_frame._uvarint(value, out)  # noqa: SLF001 - the frame's own building block
    assert update_frame._varint_at(bytes(out), 2, "x") == (value, len(out))  # noqa: SLF001


@settings(max_examples=150, deadline=None)
@given(data=st.data(), count=st.integers(2, 12), src=st.integers(-1, 300))
def test_a_batch_comes_back_row_by_row_and_bit_for_bit(data: st.DataObject, count: int, src: int) -> None:
    """Updates that queued up (a busy relay, a fast producer) travel as one frame too: every row and
    every payload in order, each form, own and relayed origins mixed."""
    rows, payloads = [], []
    for _ in range(count):
        n = data.draw(st.integers(1, 300))
        values = data.draw(st.lists(st.floats(-8.0, 8.0, width=32), min_size=n, max_size=n))
        payload = update(n, values, data.draw(st.floats(1e-2, 4.0)))
        if payload is None:
            payload = update(n, [9.0] * n, 1.0)
        origin = src if src > 0 and data.draw(st.booleans()) else data.draw(IDS)
        rows.append(row_for(payload, origin, data.draw(IDS), data.draw(INT64), data.draw(INT64)))
        payloads.append(payload)
    message = Message(Op.UPDATES, {"updates": rows}, payloads, src=src)
    frames = encode_frames(message)
    total = sum(p.nbytes for p in payloads)
    assert (len(frames) == 1) == (total <= update_frame.MAX_PAYLOAD_BYTES)
    received = decode_frames(frames)
    assert received.src == src and received.fields == {"updates": rows}
    assert [bytes(memoryview(b).cast("B")) for b in received.buffers] == [p.tobytes() for p in payloads]


def test_a_batch_frame_names_what_breaks_it() -> None:
    payload = update(40, [3.0] + [0.0] * 39, 0.5)
    assert payload is not None
    rows = [row_for(payload, 2, seq, 0, 0) for seq in (1, 2)]
    frame = update_frame.pack(2, rows, [payload, payload], PROTOCOL_VERSION)
    assert frame is not None and frame[1] & 0x07 == update_frame.BATCH
    assert decode_frames([frame]).fields == {"updates": rows}
    with pytest.raises(MalformedMessageError, match="after its last update"):
        update_frame.unpack(frame + b"\x00")
    with pytest.raises(MalformedMessageError, match="runs past"):
        update_frame.unpack(frame[:-1])
    with pytest.raises(MalformedMessageError, match="a batch of 1 updates"):
        update_frame.unpack(frame[:3] + b"\x01" + frame[4:])
    with pytest.raises(MalformedMessageError, match="form 3"):
        update_frame.unpack(frame[:4] + b"\x03" + frame[5:])
    with pytest.raises(MalformedMessageError, match="flags 0x08"):
        update_frame.unpack(frame[:4] + b"\x08" + frame[5:])
    assert update_frame.pack(2, rows, [payload], PROTOCOL_VERSION) is None  # rows and payloads differ


def test_a_batch_over_the_limit_keeps_its_zero_copy_buffers() -> None:
    payload = update(3000, [1.0] * 3000, 0.5)  # a bitmap of 768 bytes
    assert payload is not None
    count = update_frame.MAX_PAYLOAD_BYTES // payload.nbytes + 1
    rows = [row_for(payload, 1, seq, 0, 0) for seq in range(1, count + 1)]
    frames = encode_frames(Message(Op.UPDATES, {"updates": rows}, [payload] * count, src=1))
    assert len(frames) == count + 1 and all(f is payload for f in frames[1:])
