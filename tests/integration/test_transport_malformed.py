"""10 000 malformed frames at a node and at the controller: no crash, every one counted, mesh still works."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq
from psrv.transport.messages import PROTOCOL_VERSION
from psrv.transport.sockets import tcp

FLOOD = 10_000


def malformed(i: int, member: int) -> list[bytes]:
    """One of ten kinds of bad message; each must cost exactly one rejection."""
    good = {
        "v": PROTOCOL_VERSION,
        "op": "update",
        "src": member,
        "origin": member,
        "seq": 10**9 + i,
        "iteration": 0,
        "epoch": 0,
        "tau": 1e-3,
        "encoding": "sparse",
    }
    kind = i % 10
    if kind == 0:
        return [bytes([i % 251]) * (1 + i % 40)]  # garbage
    if kind == 1:
        return [msgpack.packb(good)[: 5 + i % 20]]  # truncated header
    if kind == 2:
        return [msgpack.packb({**good, "v": 99}), b"\0" * 8]  # unknown version
    if kind == 3:
        return [msgpack.packb({**good, "op": "teleport"}), b"\0" * 8]  # unknown type
    if kind == 4:
        return [msgpack.packb({k: v for k, v in good.items() if k != "seq"}), b"\0" * 8]  # missing field
    if kind == 5:
        return [msgpack.packb(good), b"\0" * 7]  # payload not int32
    if kind == 6:
        return [msgpack.packb(good), np.array([123456, 7, 7], dtype=np.int32).tobytes()]  # not an encoding
    if kind == 7:
        return [msgpack.packb({"v": PROTOCOL_VERSION, "op": "leave", "src": member, "reason": "x"}), b"extra"]
    if kind == 8:
        return [msgpack.packb([1, 2, 3])]  # not a map
    return [
        msgpack.packb(
            {
                "v": PROTOCOL_VERSION,
                "op": "chunk",
                "src": member,
                "msg_id": i,
                "index": 3,
                "count": 2,
                "offset": 0,
                "total": 4,
                "inner": {},
                "lengths": [4],
            }
        ),
        b"abcd",
    ]


def flood(address: str, member: int) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 2000
    sock.sndtimeo = 10_000
    sock.connect(tcp(address))
    try:
        for i in range(FLOOD):
            sock.send_multipart(malformed(i, member))
    finally:
        sock.close()
        context.term()


def rejected_by(status: dict, node_id: int) -> int:
    return next(n["stats"].get("rejected_total", 0) for n in status["nodes"] if n["id"] == node_id)


@pytest.mark.timeout(120)
def test_ten_thousand_malformed_frames_are_counted_and_harmless(cluster) -> None:
    cluster.start_controller(params=1000)
    procs = [cluster.start_node(updates=300, rate=40, seed=i, wait_nodes=2) for i in range(2)]
    status = cluster.wait_for(
        lambda s: len(s["nodes"]) == 2 and s["counters"]["updates_applied"] > 10, 60, "2 nodes exchanging"
    )
    target = status["nodes"][0]
    flood(cluster.address, member=target["id"])
    flood(target["address"], member=target["id"])
    status = cluster.wait_for(
        lambda s: s["counters"]["rejected_total"] == FLOOD and rejected_by(s, target["id"]) == FLOOD,
        30,
        "every malformed frame counted as rejected",
    )
    reasons = status["counters"]["rejected"]
    assert {
        "bad_header",
        "unknown_version",
        "unknown_type",
        "bad_field",
        "bad_payload",
        "bad_buffers",
        "bad_chunk",
    } <= set(reasons), reasons
    # the mesh still works: both nodes finish and end equal to the master copy
    cluster.wait_for(
        lambda s: (
            len(s["nodes"]) == 2
            and all(n["stats"].get("updates_sent") == 300 for n in s["nodes"])
            and s["counters"]["updates_applied"] == 600
        ),
        60,
        "all updates after the flood",
    )
    cluster.assert_equal_to_master(procs)
    log = cluster.controller.stderr()
    assert log.count("rejected a message") < 200, "rejections are logged at a rate limit, not one line each"


def finding_one_frames() -> list[list[bytes]]:
    """The frames that killed a job: a params reply whose dtype numpy cannot
    parse, and controller heartbeats whose watermark is not a map of ints."""
    out = []
    for dtype in (",,", "(-1,)f4"):
        header = {
            "v": PROTOCOL_VERSION,
            "op": "params_reply",
            "src": 0,
            "request_id": 1,
            "dtype": dtype,
            "size": 1000,
            "updater_dtype": None,
            "updater_size": 0,
            "watermark": {},
            "extra_seen": {},
        }
        out.append([msgpack.packb(header), b"\0" * 4000])
    for watermark in ({"x": 1}, {1: None}, {1: "9" * 5000}, "9" * 5000):
        header = {"v": PROTOCOL_VERSION, "op": "heartbeat", "src": 0, "mesh_version": 1, "stats": {}}
        out.append([msgpack.packb({**header, "watermark": watermark})])
    return out


def send_all(address: str, messages: list[list[bytes]]) -> None:
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 2000
    sock.sndtimeo = 10_000
    sock.connect(tcp(address))
    try:
        for frames in messages:
            sock.send_multipart(frames)
    finally:
        sock.close()
        context.term()


@pytest.mark.timeout(120)
def test_the_frames_of_finding_one_are_rejected_by_real_daemons(cluster) -> None:
    cluster.start_controller(params=1000)
    procs = [cluster.start_node(updates=200, rate=40, seed=i, wait_nodes=2) for i in range(2)]
    status = cluster.wait_for(
        lambda s: len(s["nodes"]) == 2 and s["counters"]["updates_applied"] > 10, 60, "2 nodes exchanging"
    )
    bad = finding_one_frames()
    send_all(cluster.address, bad)
    for node in status["nodes"]:
        send_all(node["address"], bad)
    cluster.wait_for(
        lambda s: s["counters"]["rejected_total"] == len(bad)
        and all(rejected_by(s, n["id"]) == len(bad) for n in status["nodes"]),
        30,
        "every such frame counted as rejected by every process",
    )
    assert all(p.popen.poll() is None for p in [cluster.controller, *procs]), "a process died"
    cluster.wait_for(
        lambda s: len(s["nodes"]) == 2 and s["counters"]["updates_applied"] == 400, 60, "all updates"
    )
    cluster.assert_equal_to_master(procs)
