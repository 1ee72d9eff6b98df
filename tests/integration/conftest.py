"""A cluster fixture: a `psrv controller` and N `psrv node` processes on loopback.

Every process started is tracked and killed at teardown (SIGKILL after a grace period), every
socket the fixture opens is closed, and every wait has a deadline so a hang fails fast.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from psrv.encoding import encode
from psrv.transport import TransportConfig
from psrv.transport.client import request_status
from psrv.transport.header_codes import expand_header
from psrv.transport.messages import PROTOCOL_VERSION
from psrv.transport.sockets import tcp

HEARTBEAT_MS = 500  # a loaded 2-core CI box can starve a process for a second; fault tests pass shorter beats
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    stderr_path: Path
    dump: Path | None = None
    lines: queue.Queue = field(default_factory=queue.Queue)
    stdout: list[str] = field(default_factory=list)

    def read_line(self, timeout_s: float) -> str:
        try:
            line = self.lines.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(
                f"{self.name} printed nothing within {timeout_s} s; stderr:\n{self.stderr()}"
            ) from None
        if line is None:
            raise AssertionError(
                f"{self.name} exited (rc {self.popen.poll()}) before printing; stderr:\n{self.stderr()}"
            )
        return line

    def stderr(self) -> str:
        try:
            return self.stderr_path.read_text()[-4000:]
        except OSError:
            return ""

    def wait(self, timeout_s: float) -> int:
        return self.popen.wait(timeout_s)

    def json_line(self) -> dict[str, Any]:
        for line in reversed(self.stdout):
            if line.startswith("{"):
                return json.loads(line)
        raise AssertionError(
            f"{self.name} printed no JSON line; stdout {self.stdout}; stderr:\n{self.stderr()}"
        )


class Cluster:
    """Starts and tracks psrv processes; `close()` kills whatever is still running."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.procs: list[Proc] = []
        self.controller: Proc | None = None
        self.address: str | None = None
        self.keys: str | None = None

    def _spawn(self, name: str, args: list[str], dump: Path | None) -> Proc:
        # PYTHONFAULTHANDLER: a daemon killed by a fatal signal (a segfault) writes every thread's stack to
        # its stderr, which a failing test shows
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1",
                   PSRV_KEYS_DIR=str(self.tmp / "default-keys"))
        stderr_path = self.tmp / f"{name}.log"
        stderr = open(stderr_path, "w")  # noqa: SIM115 - closed right after the child inherits it
        popen = subprocess.Popen(
            [sys.executable, "-m", "psrv.server.cli", "--log-level", "INFO", *args],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=ROOT,
        )
        stderr.close()
        proc = Proc(name, popen, stderr_path, dump)

        def pump() -> None:
            for line in popen.stdout:
                proc.stdout.append(line.rstrip("\n"))
                proc.lines.put(line.rstrip("\n"))
            proc.lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        self.procs.append(proc)
        return proc

    def start_controller(
        self,
        params: int = 1000,
        mesh: str = "plain",
        fan_out: int = 8,
        heartbeat_ms: int = HEARTBEAT_MS,
        missed_beats: int = 4,
        keys: str | None = None,
        port: int = 0,
    ) -> Proc:
        dump = self.tmp / "controller.npy"
        args = [
            "controller",
            "--port",
            str(port),
            "--params",
            str(params),
            "--mesh",
            mesh,
            "--missed-beats",
            str(missed_beats),
            "--fan-out",
            str(fan_out),
            "--heartbeat-ms",
            str(heartbeat_ms),
            "--dump",
            str(dump),
        ]
        args += ["--keys", keys] if keys else ["--insecure"]  # keys are the daemons' default
        self.keys = keys
        proc = self._spawn("controller", args, dump)
        line = proc.read_line(30.0)
        assert line.startswith("psrv controller listening on "), line
        self.address = line.rsplit(" ", 1)[-1]
        self.controller = proc
        return proc

    def start_node(
        self,
        updates: int = 100,
        rate: float = 500.0,
        seed: int = 0,
        name: str | None = None,
        keys: str | None = "default",
        extra: list[str] | None = None,
        wait_nodes: int = 0,
    ) -> Proc:
        index = len(self.procs)
        dump = self.tmp / f"node{index}.npy"
        args = [
            "node",
            "--controller",
            self.address,
            "--updates",
            str(updates),
            "--rate",
            str(rate),
            "--seed",
            str(seed),
            "--dump",
            str(dump),
            "--join-timeout",
            "60",
            "--wait-nodes",
            str(wait_nodes),
        ]
        keys = self.keys if keys == "default" else keys
        args += ["--keys", keys] if keys else ["--insecure"]
        if name:
            args += ["--name", name]
        return self._spawn(f"node{index}", args + (extra or []), dump)

    def status(self, timeout_s: float = 5.0) -> dict[str, Any]:
        return request_status(self.address, TransportConfig(keys_dir=self.keys), timeout_s=timeout_s)

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float, what: str
    ) -> dict[str, Any]:
        """Poll the controller's status until ``predicate`` holds; fail naming ``what`` otherwise."""
        deadline = time.monotonic() + timeout_s
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.status()
            if predicate(status):
                return status
            time.sleep(0.1)
        exited = [p for p in self.procs if p.popen.poll() is not None]
        raise AssertionError(
            f"timed out after {timeout_s} s waiting for {what}; last status:\n"
            f"{json.dumps(status, indent=1)[:4000]}"
            + "".join(f"\n{p.name} exited (rc {p.popen.returncode}):\n{p.stderr()[-1500:]}" for p in exited)
        )

    def stop(self, proc: Proc, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; returns the exit code (the JSON line is then in proc.stdout)."""
        if proc.popen.poll() is None:
            proc.popen.send_signal(signal.SIGTERM)
        try:
            rc = proc.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.popen.send_signal(signal.SIGUSR1)  # the daemons dump every thread's stack
            time.sleep(1.0)
            raise AssertionError(
                f"{proc.name} did not stop within {timeout_s} s; stderr:\n{proc.stderr()}"
            ) from None
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:  # let the pump thread collect the last lines
            try:
                if proc.lines.get(timeout=0.1) is None:
                    break
            except queue.Empty:
                pass
        return rc

    def assert_equal_to_master(self, procs: list[Proc]) -> None:
        """Stop the nodes, then the controller (each must exit 0); every node's dump equals the master's."""
        for proc in procs:
            assert self.stop(proc) == 0, proc.stderr()
        assert self.stop(self.controller) == 0, self.controller.stderr()
        master = np.load(self.controller.dump)
        for proc in procs:
            assert np.max(np.abs(np.load(proc.dump) - master)) <= 1e-6, proc.name

    def close(self) -> None:
        for proc in self.procs:
            if proc.popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.popen.pid, signal.SIGCONT)
                proc.popen.terminate()
        deadline = time.monotonic() + 5.0
        for proc in self.procs:
            try:
                proc.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(5.0)
            if proc.popen.stdout:
                proc.popen.stdout.close()


def wait_until(predicate: Callable[[], Any], timeout_s: float, what: str) -> None:
    """Poll ``predicate`` until it is true; fail naming ``what`` at the deadline."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.03)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def node_entries(status: dict[str, Any]) -> list[dict[str, Any]]:
    return status["nodes"]


def load(path: Path) -> np.ndarray:
    return np.load(path)


@pytest.fixture
def cluster(tmp_path: Path):
    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


# ---------------------------------------------------------------- hostile peers (raw frames)
def header(op: str, src: int, **fields) -> bytes:
    return msgpack.packb({"v": PROTOCOL_VERSION, "op": op, "src": src, **fields})


def update(src: int, origin: int, seq: int, tau: float, params: int) -> list[bytes]:
    """A valid encoded update (3 elements of +tau) for a model of ``params`` values."""
    vector = np.zeros(params, np.float32)
    vector[:3] = tau
    fields = {"origin": origin, "seq": seq, "iteration": 0, "epoch": 0, "tau": tau, "encoding": "sparse"}
    return [header("update", src, **fields), encode(vector, tau).tobytes()]


class Stranger:
    """Raw sockets: a DEALER with its own routing id, and a ROUTER whose address it advertises."""

    def __init__(self) -> None:
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.linger = 0
        self.router.bind("tcp://127.0.0.1:*")
        self.address = self.router.last_endpoint.decode().split("//")[1]
        self.sockets: dict[str, zmq.Socket] = {}

    def dealer(self, address: str) -> zmq.Socket:
        if address not in self.sockets:
            sock = self.context.socket(zmq.DEALER)
            sock.linger = 1000
            sock.sndtimeo = 5000
            sock.setsockopt(zmq.ROUTING_ID, uuid.uuid4().bytes)
            sock.connect(tcp(address))
            self.sockets[address] = sock
        return self.sockets[address]

    def send(self, address: str, frames: list[bytes]) -> None:
        self.dealer(address).send_multipart(frames)

    def join(self, controller: str) -> int:
        """Join as the stock Node API would (no keys are configured): the stranger becomes a member."""
        sock = self.dealer(controller)
        sock.send_multipart([header("join", -1, address=self.address, name=None, token=uuid.uuid4().hex)])
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            if sock.poll(100):
                reply = expand_header(msgpack.unpackb(sock.recv_multipart()[0], strict_map_key=False))
                if reply["op"] == "join_reply":
                    return reply["node_id"]
        raise AssertionError(f"no join reply from {controller} within 10 s")

    def close(self) -> None:
        for sock in [*self.sockets.values(), self.router]:
            sock.close(0)
        self.context.term()
