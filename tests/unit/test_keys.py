"""CurveZMQ key sets: generate, write (0600), read back, and clear errors for bad directories."""

from __future__ import annotations

import os
import stat

import pytest
import zmq
from psrv.transport.errors import KeyFileError
from psrv.transport.keys import KEY_FILES, KeySet, generate_keys, read_keys, write_keys


def test_generate_gives_two_distinct_matching_pairs():
    keys = generate_keys()
    assert all(len(v) == 40 for v in (keys.server_public, keys.server_secret, keys.client_public,
                                      keys.client_secret))
    assert zmq.curve_public(keys.server_secret) == keys.server_public
    assert zmq.curve_public(keys.client_secret) == keys.client_public
    assert keys.server_public != keys.client_public
    assert generate_keys() != keys
    assert "secret" not in repr(keys).replace("secrets=***", "")
    assert keys.server_secret.decode() not in repr(keys)


def test_write_then_read_round_trip_with_owner_only_files(tmp_path):
    keys = generate_keys()
    directory = tmp_path / "job" / "keys"
    write_keys(keys, directory)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert sorted(os.listdir(directory)) == sorted(KEY_FILES.values())
    for name in KEY_FILES.values():
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    assert read_keys(directory) == keys
    assert read_keys(str(directory)) == keys


def test_refuses_to_overwrite_unless_asked(tmp_path):
    write_keys(generate_keys(), tmp_path)
    other = generate_keys()
    with pytest.raises(KeyFileError, match="refusing to overwrite"):
        write_keys(other, tmp_path)
    write_keys(other, tmp_path, overwrite=True)
    assert read_keys(tmp_path) == other


def test_missing_directory_or_file(tmp_path):
    with pytest.raises(KeyFileError, match="does not exist.*psrv keys"):
        read_keys(tmp_path / "nope")
    write_keys(generate_keys(), tmp_path)
    (tmp_path / "client.secret").unlink()
    with pytest.raises(KeyFileError, match=r"lacks \['client.secret'\]"):
        read_keys(tmp_path)


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"short", "40-byte"), (b"\x00" * 40, "Z85"), (b"", "40-byte")],
)
def test_corrupt_file_is_named(tmp_path, content, reason):
    write_keys(generate_keys(), tmp_path)
    (tmp_path / "server.public").write_bytes(content)
    with pytest.raises(KeyFileError, match=reason) as info:
        read_keys(tmp_path)
    assert "server.public" in str(info.value)


def test_mixed_key_sets_are_detected(tmp_path):
    a, b = generate_keys(), generate_keys()
    write_keys(a, tmp_path)
    (tmp_path / "client.public").write_bytes(b.client_public)
    with pytest.raises(KeyFileError, match="client.secret does not match client.public"):
        read_keys(tmp_path)
    with pytest.raises(KeyFileError, match="does not match"):
        write_keys(KeySet(a.server_public, b.server_secret, a.client_public, a.client_secret), tmp_path / "x")


def test_target_is_a_file(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    with pytest.raises(KeyFileError):
        write_keys(generate_keys(), target)
    with pytest.raises(KeyFileError, match="does not exist"):
        read_keys(target)


@pytest.mark.timeout(20)
def test_keys_work_for_a_real_curve_socket_pair(tmp_path):
    """The files carry keys libzmq accepts: a CURVE PUSH/PULL pair on loopback exchanges a frame."""
    write_keys(generate_keys(), tmp_path)
    keys = read_keys(tmp_path)
    ctx = zmq.Context()
    try:
        server = ctx.socket(zmq.PULL)
        server.curve_server = True
        server.curve_secretkey = keys.server_secret
        server.curve_publickey = keys.server_public
        server.linger = 0
        port = server.bind_to_random_port("tcp://127.0.0.1")
        client = ctx.socket(zmq.PUSH)
        client.curve_serverkey = keys.server_public
        client.curve_publickey = keys.client_public
        client.curve_secretkey = keys.client_secret
        client.linger = 0
        client.connect(f"tcp://127.0.0.1:{port}")
        client.send(b"hello")
        assert server.poll(5000) and server.recv() == b"hello"
    finally:
        ctx.destroy(linger=0)
