"""Fuzzed frames, per message type, through the real decode + dispatch path of a running controller
and a running node: structurally valid headers (every field of the op present, of its type or
not) holding absurd values. Nothing may stop either role, and nothing a stranger sends changes a
replica; the mesh still carries updates afterwards."""

from __future__ import annotations

import time

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psrv.encoding import encode
from psrv.server import Controller, Node
from psrv.transport import TransportConfig
from psrv.transport.header_codes import FIELD_NAMES, compact_header
from psrv.transport.messages import CATALOGUE, PROTOCOL_VERSION, Op

N = 64
SRC_CODE = FIELD_NAMES.index("src")

ints = st.one_of(
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([-1, 0, 1, 2, 3, 2**31, 2**62, 2**63 - 1, 2**64 - 1]),
)
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e30, -1.0, 0.0, 5e-324]))
texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [",,", "(-1,)f4", "<f4", "<f8", "O", "V8", "S0", "f4,f4", "<i4", "sparse", "bitmap", "x" * 5000]
    ),
)
scalars = st.one_of(ints, floats, texts, st.booleans(), st.none(), st.binary(max_size=16))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=6), st.dictionaries(st.one_of(ints, texts), inner, max_size=6)
    ),
    max_leaves=20,
)
watermarks = st.one_of(
    st.dictionaries(st.one_of(ints, texts, st.none()), st.one_of(ints, texts, st.none(), floats), max_size=8),
    st.just({"x": 1}),
    st.just({1: None}),
    st.just({1: "9" * 5000}),
)
BY_TYPE = {
    int: ints,
    float: floats,
    str: texts,
    dict: values,
    list: st.lists(values, max_size=8),
    bool: st.booleans(),
}
SPECIAL = {"watermark": watermarks, "extra_seen": watermarks, "given_up": watermarks, "stats": watermarks,
           "mesh": values}


def field_values(op: Op) -> st.SearchStrategy[dict]:
    fields = {}
    for name, types in CATALOGUE[op].fields.items():
        strategies = [BY_TYPE[t] for t in types if t in BY_TYPE] + (
            [st.none()] if type(None) in types else []
        )
        typed = st.one_of(*strategies)
        fields[name] = (
            st.one_of(SPECIAL.get(name, typed), typed, values)
            if name in SPECIAL
            else st.one_of(typed, typed, values)
        )
    return st.fixed_dictionaries(fields)


@st.composite
def frames(draw, op: Op) -> list[bytes]:
    header = {
        "v": PROTOCOL_VERSION,
        "op": op.value,
        "src": draw(st.one_of(st.sampled_from([-1, 0, 1, 2]), ints)),
    }
    header.update(draw(field_values(op)))
    schema = CATALOGUE[op]
    count = draw(st.integers(schema.min_buffers, min(schema.max_buffers, 4)))
    buffers = [draw(st.binary(max_size=64)) for _ in range(count)]
    if op is Op.UPDATE and draw(st.booleans()):  # a real encoded update behind absurd header fields
        buffers = [encode(np.full(N, 0.5, np.float32), 0.25).tobytes()]
    if draw(st.booleans()):  # the fields and op by code, as the codec sends them
        header = compact_header(header)
    try:
        return [msgpack.packb(header, use_bin_type=True), *buffers]
    except (OverflowError, ValueError, TypeError):
        return [msgpack.packb({"v": PROTOCOL_VERSION, "op": op.value}, use_bin_type=True)]


@pytest.fixture(scope="module")
def mesh():
    cfg = TransportConfig(heartbeat_s=0.2, missed_beats=25, join_timeout_s=10, linger_s=0.2)
    ctrl = Controller(cfg, np.zeros(N, np.float32)).start()
    nodes = [Node(cfg, np.zeros(N, np.float32), ctrl.address).start() for _ in range(2)]
    try:
        yield ctrl, nodes
    finally:
        for role in [*nodes, ctrl]:
            role.stop()


def deliver(role, raw: list[bytes], identity: bytes = b"\x00stranger") -> None:
    """One received message through the role's own receive path, on its I/O thread."""
    role.call(lambda: role._receive(raw, identity, getattr(role, "_router", None)))  # noqa: SLF001


def presented(sender, receiver) -> bytes:
    """The routing id ``sender``'s connection to ``receiver`` presents (the controller: one per member)."""
    if isinstance(sender, Controller):
        return sender.routing_id_to(receiver.node_id)
    return sender.routing_id


def as_sender(raw: list[bytes], src: int) -> list[bytes]:
    header = msgpack.unpackb(raw[0], raw=False, strict_map_key=False)
    key = SRC_CODE if SRC_CODE in header else "src"
    return [msgpack.packb({**header, key: src}, use_bin_type=True), *raw[1:]]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("op", list(Op), ids=[op.value for op in Op])
@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_no_fuzzed_frame_stops_a_role(mesh, op: Op, data) -> None:
    """Each frame arrives from a stranger, then from the peer the role trusts (a node: the
    controller's routing id; the controller: a member's), so the handlers see the absurd values."""
    ctrl, nodes = mesh
    raw = data.draw(frames(op))
    trusted = raw
    if op in (Op.UPDATE, Op.UPDATES):  # the trusted peer never sent these: no payload decodes
        trusted = [raw[0], *(b"\x01" * 12 for _ in raw[1:])]
    for role, peer in ((ctrl, nodes[0]), (nodes[0], ctrl), (nodes[1], ctrl)):
        before = role.params.copy()
        deliver(role, raw)
        assert role.running and role.error is None, f"{role.role} stopped: {role.error!r}"
        if op is not Op.SHUTDOWN:  # from the controller, a shutdown stops a node: that is its job
            deliver(role, as_sender(trusted, peer.node_id), presented(peer, role))
            assert role.running and role.error is None, f"{role.role} stopped: {role.error!r}"
        if op not in (Op.UPDATE, Op.UPDATES, Op.HEARTBEAT, Op.EVICTED, Op.MESH, Op.LEAVE):
            assert np.array_equal(role.params, before), f"a {op} frame changed {role.role}'s parameters"


@pytest.mark.timeout(60)
def test_after_the_fuzz_the_mesh_still_converges(mesh) -> None:
    ctrl, nodes = mesh
    sender, other = nodes
    for i in range(5):
        vector = np.zeros(N, np.float32)
        vector[i] = 1.0
        sender.submit(encode(vector, 0.5), apply_locally=True)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not (
        np.allclose(ctrl.params, sender.params) and np.allclose(other.params, sender.params)
    ):
        time.sleep(0.05)
    assert sender.wait_acknowledged(10.0)
    time.sleep(0.5)
    assert all(r.running and r.error is None for r in (ctrl, *nodes))
    assert np.max(np.abs(other.params - ctrl.params)) <= 1e-6
    assert np.max(np.abs(sender.params - ctrl.params)) <= 1e-6
