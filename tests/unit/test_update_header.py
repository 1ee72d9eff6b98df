"""psrv.encoding.update_header: the one definition of an update's header, and the wire it gives.

The named golden frames below are protocol 2's: the frames written by the code before the header
moved into encoding/ (main at 4875062, ``transport/batch.py`` + ``transport/payload.py``), plus the
one-row UPDATES that protocol 2 sends for a lone update, with the version byte raised to today's
(``a17601`` -> ``a17606``); they are still accepted. What is sent is the compact frame and, since
protocol 5, headers whose fields travel by code; the wire must stay byte-identical to them.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psrv.encoding import encode, message_info, update_header
from psrv.encoding.errors import MalformedMessageError
from psrv.encoding.update_header import (
    FIELD_NAMES,
    MalformedHeaderError,
    UpdateHeader,
    check_fields,
    parse_fields,
    parse_row,
    payload_header,
)
from psrv.server.updates import batch_message, unbatch
from psrv.transport.codec import decode_frames, encode_frames
from psrv.transport.errors import FrameRejectedError
from psrv.transport.messages import CATALOGUE, Message, Op

F1 = {"origin": 3, "seq": 7, "iteration": 11, "epoch": 1, "tau": 0.5, "encoding": "sparse"}
F2 = {"origin": 4, "seq": 2**40, "iteration": -5, "epoch": 0, "tau": 0.25, "encoding": "bitmap"}
SPARSE_HEX = "02000000280000000000003f0000000003000000f8ffffff"
BITMAP_HEX = "28000000280000000000803e01000000ffff0800ffff0000ff000000"
#: an UPDATE's header as sent since protocol 5 (version 6 now): "v" by name, every other field and the op by
#: code (psrv.transport.header_codes): {"v": 6, 0: 3 (update), 1: 2, 13: 3, 14: 7, 15: 11, 16: 1, 17: 0.5,
#: 18: "sparse"}
UPDATE_CODED_HEX = "89a17606000301020d030e070f0b100111cb3fe000000000000012a6737061727365"
#: F1 and F2 in an UPDATES whose header names its fields by code (0: 4 is updates, 19 the rows)
UPDATES_CODED_HEX = (
    "84a176060004010213929603070b01cb3fe0000000000000a67370617273659604cf0000010000000000fb00cb3fd000"
    "0000000000a66269746d6170"
)
UPDATE_HEADER_HEX = (  # the fields by name: still accepted, no longer sent
    "89a17606a26f70a6757064617465a373726302a66f726967696e03a373657107a9697465726174696f6e0ba565706f"
    "636801a3746175cb3fe0000000000000a8656e636f64696e67a6737061727365"
)
ONE_ROW_HEADER_HEX = (  # still accepted; sent for a lone update the compact frame cannot carry
    "84a17606a26f70a775706461746573a373726302a775706461746573919603070b01cb3fe0000000000000a673706172"
    "7365"
)
#: the compact frame of F1 with the sparse payload (psrv.encoding.update_frame): tag 0xC1, protocol 6 <<
#: 3 | sparse (origin apart from src), src + 1 = 3, origin 3, seq 7, zigzag(11) = 0x16, zigzag(1) = 2,
#: count 2, N 40, τ's float32 bits, then the two indices
COMPACT_HEX = "c130030307160202280000003f03000000f8ffffff"
#: F1 and F2 as one compact batch: 6 << 3 | BATCH, src + 1, 2 updates, their flags (sparse, bitmap; origin
#: apart), then each with its body's length (the bitmap's less the 3 zero bytes ending it)
COMPACT_BATCH_HEX = (
    "c133030200010307160202280000003f0803000000f8ffffff04808080808020090028280000803e09ffff0800ffff0000ff"
)
UPDATES_HEADER_HEX = (  # still accepted; sent for updates the compact frame cannot carry
    "84a17606a26f70a775706461746573a373726302a775706461746573929603070b01cb3fe0000000000000a673706172"
    "73659604cf0000010000000000fb00cb3fd0000000000000a66269746d6170"
)


def payloads() -> tuple[np.ndarray, np.ndarray]:
    sparse = np.zeros(40, np.float32)
    sparse[[2, 7]] = [3.0, -3.0]
    dense = np.ones(40, np.float32)
    dense[3] = -1.0
    return encode(sparse, 0.5), encode(dense, 0.25)


def test_the_wire_is_byte_identical_to_its_golden_frames() -> None:
    m1, m2 = payloads()
    assert (m1.tobytes().hex(), m2.tobytes().hex()) == (SPARSE_HEX, BITMAP_HEX)
    one = encode_frames(batch_message([(dict(F1), m1)], src=2))
    two = encode_frames(batch_message([(dict(F1), m1), (dict(F2), m2)], src=2))
    assert [frame.hex() for frame in one] == [COMPACT_HEX]
    assert [frame.hex() for frame in two] == [COMPACT_BATCH_HEX]
    assert encode_frames(Message(Op.UPDATE, dict(F1), [m1], src=2))[0].hex() == UPDATE_CODED_HEX


def test_the_golden_frames_decode_to_the_same_items() -> None:
    m1, m2 = payloads()
    update = decode_frames([bytes.fromhex(UPDATE_HEADER_HEX), bytes.fromhex(SPARSE_HEX)])
    one_row = decode_frames([bytes.fromhex(ONE_ROW_HEADER_HEX), bytes.fromhex(SPARSE_HEX)])
    compact = decode_frames([bytes.fromhex(COMPACT_HEX)])
    assert [f for f, _ in unbatch(one_row)] == [f for f, _ in unbatch(compact)] == [F1]
    assert [bytes(b) for _, b in unbatch(compact)] == [bytes.fromhex(SPARSE_HEX)]
    updates = decode_frames(
        [bytes.fromhex(UPDATES_HEADER_HEX), bytes.fromhex(SPARSE_HEX), bytes.fromhex(BITMAP_HEX)]
    )
    assert [f for f, _ in unbatch(update)] == [F1]
    coded = decode_frames([bytes.fromhex(UPDATE_CODED_HEX), bytes.fromhex(SPARSE_HEX)])
    assert [f for f, _ in unbatch(coded)] == [F1]
    coded_rows = decode_frames(
        [bytes.fromhex(UPDATES_CODED_HEX), bytes.fromhex(SPARSE_HEX), bytes.fromhex(BITMAP_HEX)]
    )
    assert [f for f, _ in unbatch(coded_rows)] == [F1, F2]
    assert [f for f, _ in unbatch(updates)] == [F1, F2]
    batch = decode_frames([bytes.fromhex(COMPACT_BATCH_HEX)])
    assert [(f, bytes(b)) for f, b in unbatch(batch)] == [(F1, m1.tobytes()), (F2, m2.tobytes())]
    assert [parse_fields(f) for f, _ in unbatch(updates)] == [UpdateHeader(**F1), UpdateHeader(**F2)]
    for (_, buffer), message in zip(unbatch(updates), [m1, m2], strict=True):
        payload = np.frombuffer(buffer, dtype=np.int32)
        header = payload_header(payload, 40)
        info = message_info(payload)
        assert (header.form, header.n, header.tau) == (info.form, info.n, info.tau)
        assert np.array_equal(payload, message)


def test_the_catalogue_takes_its_update_fields_from_encoding() -> None:
    assert tuple(CATALOGUE[Op.UPDATE].fields) == FIELD_NAMES
    assert CATALOGUE[Op.UPDATE].fields == update_header.FIELD_TYPES
    header = UpdateHeader(**F2)
    assert header.fields() == F2 and header.row() == list(F2.values())
    assert parse_row(header.row()) == header


BAD_FIELDS = [
    {"origin": 0},
    {"origin": True},
    {"seq": 2**63},
    {"seq": 1.0},
    {"iteration": -(2**63)},
    {"epoch": "1"},
    {"tau": 0.0},
    {"tau": float("inf")},
    {"tau": float("nan")},
    {"tau": -1},
    {"tau": None},
    {"encoding": "dense"},
    {"encoding": None},
]


@pytest.mark.parametrize("change", BAD_FIELDS, ids=lambda c: repr(c))
def test_a_bad_field_is_refused_alike_by_encoding_and_by_the_catalogue(change: dict) -> None:
    fields = {**F1, **change}
    with pytest.raises(MalformedHeaderError):
        check_fields(*[fields[name] for name in FIELD_NAMES])
    with pytest.raises(MalformedHeaderError):
        parse_row([fields[name] for name in FIELD_NAMES])
    m1, m2 = payloads()
    for message in (
        Message(Op.UPDATE, fields, [m1], src=2),
        Message(Op.UPDATES, {"updates": [list(F2.values()), [fields[n] for n in FIELD_NAMES]]}, [m2, m1], 2),
    ):
        with pytest.raises(FrameRejectedError) as info:
            decode_frames(encode_frames(message))
        assert info.value.reason == "bad_field"


def test_rows_and_maps_of_the_wrong_shape_are_refused() -> None:
    for row in ([3, 7, 11, 1, 0.5], [3, 7, 11, 1, 0.5, "sparse", 0], "row", None, {"origin": 3}):
        with pytest.raises(MalformedHeaderError, match="a row must be"):
            parse_row(row)
    with pytest.raises(MalformedHeaderError, match="exactly"):
        parse_fields({**F1, "extra": 1})
    with pytest.raises(MalformedHeaderError, match="exactly"):
        parse_fields({k: v for k, v in F1.items() if k != "tau"})
    assert issubclass(MalformedHeaderError, MalformedMessageError)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    data=st.data(),
    threshold=st.floats(1e-3, 10.0),
)
def test_payload_header_agrees_with_the_full_check(n: int, data: st.DataObject, threshold: float) -> None:
    values = data.draw(st.lists(st.floats(-20.0, 20.0, width=32), min_size=n, max_size=n))
    message = encode(np.array(values, dtype=np.float32), threshold)
    if message is None:
        return
    info = message_info(message)
    header = payload_header(message, n)
    assert (header.form, header.n, header.tau) == (info.form, info.n, info.tau)
    assert header.count == (info.count if info.form == "sparse" else None)
    with pytest.raises(MalformedMessageError, match="this model has"):
        payload_header(message, n + 1)
    if info.tau > 1e-3:
        with pytest.raises(MalformedMessageError, match="max_tau"):
            payload_header(message, n, max_tau=info.tau / 2)
    truncated = message[:-1]
    with pytest.raises(MalformedMessageError):
        payload_header(truncated, n)


@pytest.mark.parametrize("name", sorted(update_header.FIELD_BOUNDS))
def test_the_stated_bounds_are_the_checked_ones(name: str) -> None:
    low, high = update_header.FIELD_BOUNDS[name]
    for value, ok in ((low, True), (high, True), (low - 1, False), (high + 1, False)):
        fields = {**F1, name: value}
        row = [fields[n] for n in FIELD_NAMES]
        if ok:
            assert parse_row(row) == UpdateHeader(*row)
        else:
            with pytest.raises(MalformedHeaderError):
                check_fields(*row)


def test_asking_about_an_update_header_does_not_import_numba() -> None:
    """The transport imports update_header in every process; numba loads only with a codec call."""
    import subprocess
    import sys

    code = (
        "import sys, psrv.encoding.update_header, psrv.transport.messages, psrv.server.updates; "
        "assert 'numba' not in sys.modules, 'numba imported'; "
        "from psrv.encoding import decode, ResidualEncoder; assert 'numba' in sys.modules"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
