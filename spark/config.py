"""VoidConfiguration: where the gradient-sharing controller listens and how workers reach it.

Named after DL4J's ``VoidConfiguration``. The driver turns it into a
``psrv.transport.TransportConfig`` for its controller and one for the nodes in the tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from psrv.spark.errors import SparkConfigError
from psrv.transport.config import TransportConfig
from psrv.transport.netmask import choose_address

MESH_MODES = ("plain", "mesh")


def split_address(address: str) -> tuple[str, int | None]:
    """``"host:port"`` -> (host, port); ``"host"`` -> (host, None). IPv6 in brackets: ``"[::1]:5"``."""
    text = str(address).strip()
    if not text:
        raise SparkConfigError("controller_address: expected 'host' or 'host:port', got an empty string")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not port_text:
        return host, None
    try:
        port = int(port_text)
    except ValueError:
        raise SparkConfigError(
            f"controller_address: port {port_text!r} in {address!r} is not a number"
        ) from None
    if not 0 < port <= 65535:
        raise SparkConfigError(f"controller_address: port {port} in {address!r} is outside 1..65535")
    return host, port


def _as_ip(host: str) -> str:
    """Sockets bind IP addresses: a host name (as spark.driver.host may be) is resolved."""
    import ipaddress
    import socket

    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        return socket.gethostbyname(host)
    except OSError as exc:
        raise SparkConfigError(f"cannot resolve the driver host {host!r} to an address: {exc}; set "
                               "VoidConfiguration.controller_address or network_mask") from None


def _is_port(value: Any, low: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and low <= value <= 65535


def _check_port(value: Any) -> int | tuple[int, int]:
    """``unicast_port``: an int in 0..65535, or a range ``(low, high)`` of ports in 1..65535."""
    if _is_port(value, 0):
        return int(value)
    if isinstance(value, tuple | list) and len(value) == 2 and all(_is_port(v, 1) for v in value) \
            and value[0] <= value[1]:
        return int(value[0]), int(value[1])
    raise SparkConfigError(f"unicast_port: expected an int in 0..65535 (0 = any free port) or a range "
                           f"(low, high) with 1 <= low <= high <= 65535, got {value!r}")


@dataclass
class VoidConfiguration:
    """Settings of the gradient-sharing transport as a Spark user sees them.

    - ``controller_address``: the address workers connect to (``host`` or ``host:port``). Default:
      the driver's address inside ``network_mask``, else Spark's ``spark.driver.host``. A port
      given here is what workers dial (e.g. a forwarded port); the controller binds ``unicast_port``.
    - ``unicast_port``: the controller's port on the driver: 0 (the default) = any free port, which
      the tasks are told with the job, so several fits on one driver host never collide; a fixed
      port (a firewall opening); or a range ``(low, high)``, the first free port in it. Nodes on the
      executors always bind ephemeral ports, so executors sharing a host never collide.
    - ``network_mask``: CIDR (e.g. ``10.0.0.0/16``) choosing the interface every process binds and
      advertises; the ``PSRV_IP`` environment variable overrides it per process.
    - ``mesh_build_mode``: ``plain`` (every node a child of the controller; fine below ~32 workers)
      or ``mesh`` (a breadth-first tree, 8 children per node).
    - ``heartbeat_ms``: beat interval both ways; a node silent for 3 beats is dropped.
    - ``secure``: CurveZMQ keys generated on the driver for each fit and shipped with the job.
    - ``mesh_fan_out``: most children per node in ``mesh`` mode (small values force a deep tree).
    - ``join_timeout_ms``: how long a worker tries to reach the controller before its task fails
      (and how long the driver waits for the first worker before cancelling the job).
    - ``controller_lost_timeout_ms``: how long a worker that lost the controller (a partition, a
      paused driver) keeps trying to rejoin before its task fails.
    """

    controller_address: str | None = None
    unicast_port: int | tuple[int, int] = 0
    network_mask: str | None = None
    mesh_build_mode: str = "plain"
    heartbeat_ms: int = 1000
    secure: bool = True
    join_timeout_ms: int = 15_000
    mesh_fan_out: int = 8
    controller_lost_timeout_ms: int = 60_000

    def __post_init__(self) -> None:
        if self.controller_address is not None:
            split_address(self.controller_address)
        self.unicast_port = _check_port(self.unicast_port)
        if str(self.mesh_build_mode).lower() not in MESH_MODES:
            raise SparkConfigError(
                f"mesh_build_mode: expected one of {MESH_MODES}, got {self.mesh_build_mode!r}"
            )
        self.mesh_build_mode = str(self.mesh_build_mode).lower()
        fan_out = self.mesh_fan_out
        if isinstance(fan_out, bool) or not isinstance(fan_out, int) or fan_out < 1:
            raise SparkConfigError(f"mesh_fan_out: expected an int >= 1, got {self.mesh_fan_out!r}")
        for name in ("heartbeat_ms", "join_timeout_ms", "controller_lost_timeout_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise SparkConfigError(f"{name}: expected a positive number of milliseconds, got {value!r}")
        if self.network_mask is not None:
            import ipaddress

            try:
                ipaddress.ip_network(self.network_mask, strict=False)
            except ValueError as exc:
                raise SparkConfigError(f"network_mask: expected a CIDR such as 10.0.0.0/16, got "
                                       f"{self.network_mask!r} ({exc})") from None

    def controller_ports(self) -> list[int]:
        """The ports the controller tries to bind, in order (``[0]``: any free port)."""
        port = self.unicast_port
        if isinstance(port, tuple):
            return list(range(port[0], port[1] + 1))
        return [port]

    # -- addresses -----------------------------------------------------------------------------------
    def controller_host(self, spark_driver_host: str | None) -> str:
        """The host the driver binds its controller to (see the class docstring for the order)."""
        if self.controller_address is not None:
            return _as_ip(split_address(self.controller_address)[0])
        if self.network_mask is not None:
            return choose_address(self.network_mask)
        return _as_ip(spark_driver_host or "127.0.0.1")

    def advertised_address(self, bound_address: str) -> str:
        """What workers dial: ``controller_address`` when it names a port, else where the controller bound."""
        if self.controller_address is not None:
            host, port = split_address(self.controller_address)
            if port is not None:
                return f"{host}:{port}"
        return bound_address

    # -- transport -----------------------------------------------------------------------------------
    def transport_config(self, *, host: str | None, port: int, keys: Any = None,
                         **extra: Any) -> TransportConfig:
        """The nodes' and the controller's transport settings from this configuration."""
        return TransportConfig(
            host=host,
            port=port,
            network_mask=self.network_mask,
            mesh=self.mesh_build_mode,
            fan_out=self.mesh_fan_out,
            heartbeat_s=self.heartbeat_ms / 1000.0,
            join_timeout_s=self.join_timeout_ms / 1000.0,
            controller_lost_timeout_s=self.controller_lost_timeout_ms / 1000.0,
            keys=keys,
            **extra,
        )


__all__ = ["MESH_MODES", "VoidConfiguration", "split_address"]
