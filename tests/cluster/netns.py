"""Hosts as Linux network namespaces on one bridge: each host its own network stack, its own link.

    with Hosts(["head", "w1", "w2", "drv"]) as hosts:     # namespaces, a bridge, veth pairs, addresses
        hosts.run("w1", ["ping", "-c1", hosts.address("drv")])
        hosts.shape("w2", "100mbit")                       # tbf both ways on w2's link
        hosts.cut("w1"); hosts.heal("w1")                  # the cable pulled at the switch, put back

Each host is a namespace ``psrv-<tag>-<host>`` holding ``lo``, ``eth0`` (a veth whose peer sits in
the bridge ``psrv<tag>br``) with an address of ``198.18.<n>.0/24`` (RFC 2544's benchmarking range,
so nothing on a real network is shadowed), and a decoy ``dcy0`` in ``198.19.<n>.0/24`` that leads
nowhere, so a process must choose its interface by network mask. ``<tag>`` and ``<n>`` are random,
so two runs never share a name. The root namespace gets only the bridge and the veth peers (no
address, no route); ``close()`` kills every process left in the namespaces and removes them all,
also after a failed build.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

COMMAND_DEADLINE_S = 15.0


def unavailable_reason() -> str | None:
    """Why namespaces cannot be built here (the tests then skip with it), or None."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (tests/cluster runs `ip netns add`; run pytest as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2 is needed to build hosts as network namespaces)"
    probe = f"psrv-probe-{secrets.token_hex(3)}"
    done = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True,
                          timeout=COMMAND_DEADLINE_S)
    if done.returncode != 0:
        return f"cannot create a network namespace: `ip netns add` said {done.stderr.strip()!r}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=COMMAND_DEADLINE_S)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=COMMAND_DEADLINE_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return done


class Hosts:
    """Namespaces on one bridge; see the module docstring."""

    def __init__(self, names: Sequence[str]) -> None:
        if len(set(names)) != len(names) or not 0 < len(names) < 200:
            raise ValueError(f"expected up to 199 distinct host names, got {names!r}")
        self.tag = secrets.token_hex(2)
        self.net = secrets.randbelow(256)
        self.names = list(names)
        self.bridge = f"psrv{self.tag}br"
        self.mask = f"198.18.{self.net}.0/24"
        self._created_namespaces: list[str] = []
        self._created_links: list[str] = []

    # -- names and addresses --------------------------------------------------------------------------
    def namespace(self, host: str) -> str:
        return f"psrv-{self.tag}-{host}"

    def address(self, host: str) -> str:
        """The host's address on the cluster's link (inside its namespace only)."""
        return f"198.18.{self.net}.{self.names.index(host) + 2}"

    def decoy_address(self, host: str) -> str:
        return f"198.19.{self.net}.{self.names.index(host) + 2}"

    def peer(self, host: str) -> str:
        """The root namespace's end of the host's veth pair (a port of the bridge)."""
        return f"psrv{self.tag}v{self.names.index(host)}"

    # -- building and removing ------------------------------------------------------------------------
    def __enter__(self) -> Hosts:
        try:
            self.create()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def create(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        self._created_links.append(self.bridge)
        _ip("link", "set", self.bridge, "up")
        for host in self.names:
            ns = self.namespace(host)
            _ip("netns", "add", ns)
            self._created_namespaces.append(ns)
            _ip("link", "add", self.peer(host), "type", "veth", "peer", "name", "eth0", "netns", ns)
            self._created_links.append(self.peer(host))
            _ip("link", "set", self.peer(host), "master", self.bridge)
            _ip("link", "set", self.peer(host), "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            # a second interface leading nowhere: the address choice must come from the network mask
            _ip("-n", ns, "link", "add", "dcy0", "type", "veth", "peer", "name", "dcy1")
            _ip("-n", ns, "addr", "add", f"{self.decoy_address(host)}/24", "dev", "dcy0")
            _ip("-n", ns, "link", "set", "dcy0", "up")
            _ip("-n", ns, "link", "set", "dcy1", "up")

    def close(self) -> None:
        """Kill what still runs in the namespaces, then remove namespaces, veths and the bridge."""
        for ns in self._created_namespaces:
            for pid in self._pids(ns):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + COMMAND_DEADLINE_S
        while any(self._pids(ns) for ns in self._created_namespaces) and time.monotonic() < deadline:
            time.sleep(0.1)
        for ns in reversed(self._created_namespaces):
            _ip("netns", "del", ns, check=False)
        for link in reversed(self._created_links):  # gone with their namespaces' ends normally
            if _ip("link", "show", link, check=False).returncode == 0:
                _ip("link", "del", link, check=False)
        self._created_namespaces.clear()
        self._created_links.clear()

    # -- running things inside ------------------------------------------------------------------------
    def argv(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the host's namespace."""
        return ["ip", "netns", "exec", self.namespace(host), *map(str, argv)]

    def run(self, host: str, argv: Sequence[str], timeout: float = COMMAND_DEADLINE_S,
            check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(self.argv(host, argv), capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise RuntimeError(f"{host}: {' '.join(map(str, argv))} failed ({done.returncode}): "
                               f"{done.stdout[-1000:]} {done.stderr[-2000:]}")
        return done

    @staticmethod
    def _pids(ns: str) -> list[int]:
        done = _ip("netns", "pids", ns, check=False)
        return [int(p) for p in done.stdout.split() if p.isdigit()] if done.returncode == 0 else []

    def pids(self, host: str) -> list[int]:
        """Every process running in the host's namespace."""
        return self._pids(self.namespace(host))

    def kill_all(self, host: str) -> list[int]:
        """SIGKILL every process of the host (a host lost at once); returns their ids."""
        killed = self.pids(host)
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return killed

    # -- the link -------------------------------------------------------------------------------------
    def shape(self, host: str, rate: str = "100mbit", burst: str = "32kbit") -> None:
        """A token bucket of ``rate`` both ways on the host's link (its eth0 out, the bridge port in);
        at high rates give a ``burst`` that lasts a few milliseconds, or the link carries less."""
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", "400ms"]
        self.run(host, ["tc", "qdisc", "add", "dev", "eth0", *tbf])
        done = subprocess.run(["tc", "qdisc", "add", "dev", self.peer(host), *tbf], capture_output=True,
                              text=True, timeout=COMMAND_DEADLINE_S)
        if done.returncode != 0:
            raise RuntimeError(f"tc on {self.peer(host)} failed: {done.stderr.strip()}")

    def qdisc(self, host: str) -> str:
        return self.run(host, ["tc", "qdisc", "show", "dev", "eth0"]).stdout

    def cut(self, host: str) -> None:
        """The host's cable pulled at the switch: its bridge port goes down, eth0 loses its carrier;
        packets vanish without an error inside the host (addresses and routes stay)."""
        _ip("link", "set", self.peer(host), "down")

    def heal(self, host: str) -> None:
        _ip("link", "set", self.peer(host), "up")


__all__ = ["Hosts", "unavailable_reason"]
