"""The `psrv` daemons' command line: --help with defaults, `psrv status` in both forms, keys."""

from __future__ import annotations

import argparse
import json
import stat
import subprocess
import sys
import time

import numpy as np
import pytest
from psrv.server import Controller
from psrv.server.cli import build_parser
from psrv.server.node import Node
from psrv.transport import TransportConfig
from psrv.transport.client import request_status


def psrv(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "psrv.server.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["controller", "node", "status", "keys"])
def test_every_subcommand_explains_its_options_with_defaults(command: str) -> None:
    result = psrv(command, "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: psrv " + command in result.stdout
    text = " ".join(result.stdout.split())  # argparse wraps "(default: X)" across lines
    assert "(default: None)" not in text and "(default: False)" not in text, "no default that says nothing"
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    shown = 0
    for action in sub._actions:  # every option with a real default names it once, in its help or after it
        if (not action.option_strings or action.required or action.nargs == 0 or action.default is None
                or action.default == argparse.SUPPRESS):  # e.g. --log-level after the subcommand
            continue
        if "default" in (action.help or "").lower():
            assert f"(default: {action.default})" not in text, f"{action.dest}: the default twice"
        else:
            assert f"(default: {action.default})" in text, f"{action.dest}: default not shown"
            shown += 1
    if command in ("controller", "node"):
        assert shown >= 4
        assert "--network-mask" in result.stdout and "--keys" in result.stdout and "--dump" in result.stdout


@pytest.mark.timeout(120)
def test_status_shows_the_controllers_view(tmp_path) -> None:
    config = TransportConfig(heartbeat_s=0.2, missed_beats=10)
    with (
        Controller(config, np.zeros(100, np.float32)) as ctrl,
        Node(config.replace(node_name="w0"), np.zeros(100, np.float32), ctrl.address) as node,
    ):
        human = psrv("status", ctrl.address, "--insecure")
        as_json = psrv("status", ctrl.address, "--json", "--insecure")
    assert human.returncode == 0, human.stderr
    assert f"controller {ctrl.address}" in human.stdout and node.address in human.stdout
    status = json.loads(as_json.stdout)
    assert [(n["id"], n["parent"], n["state"]) for n in status["nodes"]] == [(node.node_id, 0, "online")]
    assert {"mesh_version", "counters", "checksum"} <= set(status)
    missing = psrv("status", "127.0.0.1:9", "--timeout", "0.5", "--insecure")
    assert missing.returncode == 1 and "127.0.0.1:9" in missing.stderr


@pytest.mark.timeout(60)
def test_keys_are_written_owner_only_and_never_overwritten(tmp_path) -> None:
    target = tmp_path / "k"
    assert psrv("keys", str(target)).returncode == 0
    for path in target.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = psrv("keys", str(target))
    assert again.returncode == 1 and "refusing to overwrite" in again.stderr


@pytest.mark.timeout(150)
def test_the_daemons_use_keys_by_default(cluster, tmp_path, monkeypatch) -> None:
    """No --keys and no --insecure: the controller makes a key set in the default key directory,
    a node and `psrv status` on the same host find it, and a process without the keys gets nothing."""
    from psrv.transport.errors import JoinError
    from psrv.transport.keys import read_keys

    default = tmp_path / "default-keys"  # the cluster fixture points PSRV_KEYS_DIR here
    monkeypatch.setenv("PSRV_KEYS_DIR", str(default))
    proc = cluster._spawn(  # noqa: SLF001 - the fixture's tracked spawn, without its --insecure
        "controller", ["controller", "--port", "0", "--params", "100", "--heartbeat-ms", "500"], None
    )
    line = proc.read_line(60.0)
    address = line.rsplit(" ", 1)[-1]
    assert line.startswith("psrv controller listening on "), line
    read_keys(default)  # a whole, valid key set was written
    assert "wrote a fresh CurveZMQ key set to " + str(default) in proc.stderr()
    node = cluster._spawn(  # noqa: SLF001
        "node",
        ["node", "--controller", address, "--updates", "5", "--rate", "50", "--join-timeout", "60"],
        None,
    )
    keyed = TransportConfig(keys_dir=str(default))
    deadline = time.monotonic() + 60
    while len(request_status(address, keyed, timeout_s=5.0)["nodes"]) != 1:
        assert time.monotonic() < deadline and node.popen.poll() is None, node.stderr()
        time.sleep(0.1)
    shown = psrv("status", address, "--json")
    assert shown.returncode == 0, shown.stderr
    with pytest.raises(JoinError):
        Node(TransportConfig(join_timeout_s=1.5), np.zeros(100, np.float32), address).start()
    assert "WITHOUT keys" not in proc.stderr() + node.stderr()


@pytest.mark.timeout(120)
def test_status_and_node_meeting_other_security_settings_say_which_flag_at_once(tmp_path) -> None:
    """A keyed `psrv status`/`psrv node` against an --insecure controller (and the reverse) used to wait
    out the whole timeout and blame reachability; the refused handshake is now named with its flag."""
    from psrv.transport.keys import generate_keys, write_keys

    keys = tmp_path / "keys"
    write_keys(generate_keys(), keys)
    with Controller(TransportConfig(), np.zeros(10, np.float32)) as insecure:
        started = time.monotonic()
        keyed = psrv("status", insecure.address, "--keys", str(keys), "--timeout", "30")
        node = psrv("node", "--controller", insecure.address, "--keys", str(keys), "--join-timeout", "30")
        assert time.monotonic() - started < 20  # two interpreters' start-up, not two 30 s timeouts
    assert keyed.returncode == 1 and "runs without keys (--insecure)" in keyed.stderr, keyed.stderr
    assert node.returncode != 0 and "pass --insecure here too" in node.stderr, node.stderr
    with Controller(TransportConfig(keys_dir=str(keys)), np.zeros(10, np.float32)) as secure:
        started = time.monotonic()
        plain = psrv("status", secure.address, "--insecure", "--timeout", "30")
        other = tmp_path / "other"
        write_keys(generate_keys(), other)
        wrong = psrv("status", secure.address, "--keys", str(other), "--timeout", "30")
        assert time.monotonic() - started < 20
        assert psrv("status", secure.address, "--keys", str(keys)).returncode == 0  # the right keys work
    assert plain.returncode == 1 and "pass --keys DIR" in plain.stderr, plain.stderr
    assert wrong.returncode == 1 and "refused the CurveZMQ handshake" in wrong.stderr, wrong.stderr


@pytest.mark.timeout(60)
def test_a_controller_port_in_use_names_the_option(tmp_path) -> None:
    with Controller(TransportConfig(), np.zeros(10, np.float32)) as taken:
        port = taken.address.rsplit(":", 1)[1]
        result = psrv("controller", "--port", port, "--params", "10", "--insecure")
    assert result.returncode == 2 and "in use" in result.stderr and "--port 0" in result.stderr, result.stderr
