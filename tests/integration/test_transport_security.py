"""CurveZMQ: with keys, a process without them (or with other keys) cannot join, inject or listen."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time

import msgpack
import numpy as np
import pytest
import zmq
from psrv.server.node import Node
from psrv.transport import TransportConfig
from psrv.transport.client import request_status
from psrv.transport.errors import JoinError
from psrv.transport.keys import KeySet, generate_keys, read_keys, write_keys
from psrv.transport.messages import PROTOCOL_VERSION
from psrv.transport.sockets import tcp


def make_keys(directory) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "psrv.server.cli", "keys", str(directory)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return str(directory)


@pytest.mark.timeout(150)
def test_with_keys_members_work_and_strangers_get_nothing_in_or_out(cluster, tmp_path) -> None:
    keys = make_keys(tmp_path / "keys")
    cluster.start_controller(params=500, keys=keys)
    procs = [cluster.start_node(updates=60, rate=30, seed=i, wait_nodes=2) for i in range(2)]
    status = cluster.wait_for(lambda s: len(s["nodes"]) == 2, 60, "2 keyed nodes joined")
    node_address = status["nodes"][0]["address"]
    member = status["nodes"][0]["id"]

    # no keys, and a different key set: no join (the error names both addresses), no status
    write_keys(generate_keys(), tmp_path / "other")
    real, other = read_keys(keys), read_keys(tmp_path / "other")
    # knows the server's public key but holds a client key the controller never issued: ZAP refuses it
    forged = KeySet(real.server_public, other.server_secret, other.client_public, other.client_secret)
    strangers = [
        TransportConfig(join_timeout_s=1.5),
        TransportConfig(join_timeout_s=1.5, keys_dir=str(tmp_path / "other")),
        TransportConfig(join_timeout_s=1.5, keys=forged),
    ]
    for config in strangers:
        with pytest.raises(JoinError) as info:
            Node(config, np.zeros(500, np.float32), cluster.address).start()
        assert (
            cluster.address in str(info.value) and "127.0.0.1:" in str(info.value).split("local address")[1]
        )
        with pytest.raises(JoinError):
            request_status(cluster.address, config, timeout_s=1.0)

    # a stranger injecting a well-formed update at the controller and at a node: nothing arrives
    before = cluster.status()
    context = zmq.Context()
    sockets = []
    try:
        for address in (cluster.address, node_address):
            sock = context.socket(zmq.DEALER)
            sockets.append(sock)
            sock.linger = 0
            sock.connect(tcp(address))
            header = {
                "v": PROTOCOL_VERSION,
                "op": "update",
                "src": member,
                "origin": member,
                "seq": 10**6,
                "iteration": 0,
                "epoch": 0,
                "tau": 1.0,
                "encoding": "sparse",
            }
            for _ in range(20):  # zmq queues these locally; the refused handshake means none is delivered
                with contextlib.suppress(zmq.Again):
                    sock.send_multipart(
                        [msgpack.packb(header), np.array([1, 0, 1, 1], np.int32).tobytes()], zmq.NOBLOCK
                    )
            assert sock.poll(1000) == 0, "a stranger must receive nothing"
    finally:
        for sock in sockets:
            sock.close(0)
        context.term()
    time.sleep(0.5)
    after = cluster.wait_for(
        lambda s: (
            all(n["stats"].get("updates_sent") == 60 for n in s["nodes"])
            and s["counters"]["updates_applied"] == 120
        ),
        60,
        "the members' updates",
    )
    assert after["counters"]["rejected_total"] == before["counters"]["rejected_total"] == 0
    assert all(n["stats"]["rejected_total"] == 0 for n in after["nodes"])
    cluster.assert_equal_to_master(procs)


@pytest.mark.timeout(120)
def test_an_embedded_node_meeting_other_security_settings_says_which_setting_at_once(tmp_path) -> None:
    """``Node().start()`` against a controller with other security settings used to wait out its whole
    join deadline and raise a bare JoinError; the first refused handshake now names the setting."""
    from psrv.server import Controller
    from psrv.transport.errors import SecurityMismatchError

    write_keys(generate_keys(), tmp_path / "keys")
    write_keys(generate_keys(), tmp_path / "other")
    keyed = TransportConfig(keys_dir=str(tmp_path / "keys"), join_timeout_s=60.0, catchup_timeout_s=60.0)
    params = np.zeros(10, np.float32)

    def refused(controller: Controller, config: TransportConfig) -> str:
        started = time.monotonic()
        with pytest.raises(SecurityMismatchError) as info:
            Node(config, params, controller.address).start()
        assert time.monotonic() - started < 15  # not the 120 s deadline
        assert controller.address in str(info.value) and "local address 127.0.0.1:" in str(info.value)
        return str(info.value)

    plain = TransportConfig(join_timeout_s=60.0, catchup_timeout_s=60.0)
    with Controller(TransportConfig(), params) as insecure:
        message = refused(insecure, keyed)
        assert "runs without keys" in message and "neither keys nor keys_dir" in message, message
        with Node(TransportConfig(), params, insecure.address):  # the same settings still join
            pass
    with Controller(TransportConfig(keys_dir=str(tmp_path / "keys")), params) as secure:
        message = refused(secure, plain)
        assert "uses CurveZMQ keys" in message and "TransportConfig(keys_dir=DIR)" in message, message
        wrong = TransportConfig(keys_dir=str(tmp_path / "other"), join_timeout_s=60.0, catchup_timeout_s=60.0)
        message = refused(secure, wrong)
        assert "key set" in message and "TransportConfig(keys_dir=DIR)" in message, message
        with Node(keyed, params, secure.address):
            pass
