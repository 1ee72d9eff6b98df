"""Per-link routing ids and the JOIN's session field."""

from __future__ import annotations

import msgpack
import pytest
from psrv.server.identity import link_id, new_session, parse_session
from psrv.transport.codec import decode_frames
from psrv.transport.errors import FrameRejectedError
from psrv.transport.messages import PROTOCOL_VERSION


def test_a_link_id_depends_on_the_session_and_the_receiver_and_never_starts_with_zero() -> None:
    a, b = new_session(), new_session()
    ids = {link_id(s, to) for s in (a, b) for to in range(50)}
    assert len(ids) == 100 and all(len(i) == 16 and i[0] != 0 for i in ids)
    assert link_id(a, 3) == link_id(a, 3) and parse_session(a.hex()) == a and parse_session(None) is None


def join_frames(**fields) -> list[bytes]:
    header = {"v": PROTOCOL_VERSION, "op": "join", "src": -1, "address": "127.0.0.1:1", "name": None,
              "token": "t", **fields}
    return [msgpack.packb(header, use_bin_type=True)]


def test_the_session_is_optional_hex_and_checked() -> None:
    assert decode_frames(join_frames())["session"] is None  # a node that sends none
    assert decode_frames(join_frames(session="ab" * 16))["session"] == "ab" * 16
    for bad in ("AB" * 16, "ab" * 15, "zz" * 16, 7):
        with pytest.raises(FrameRejectedError):
            decode_frames(join_frames(session=bad))
    with pytest.raises(FrameRejectedError, match="unexpected"):  # an absent optional field hides no other
        decode_frames(join_frames(other=1))
