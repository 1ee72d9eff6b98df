"""Which local address a process binds and advertises: an override, else the network mask.

Rules of ``choose_address`` (first that applies wins):

1. the environment variable (``PSRV_IP`` by default) is set and non-empty: that address, after
   checking it is a valid IP address (it need not belong to a local interface: containers and
   NAT may advertise an outside address);
2. a network mask (CIDR such as ``10.0.0.0/16``) is given: the first address, in interface order
   as the OS lists them, that lies inside it; none is a ``NoMatchingInterfaceError`` naming the
   mask and every interface and address seen;
3. no mask: ``127.0.0.1``. Without a mask psrv stays on loopback, which is right for one host
   and never exposes a port by accident; a cluster sets a mask (or ``PSRV_IP``).

An IPv6 mask matches IPv6 addresses (scope suffixes such as ``%eth0`` are ignored).
"""

from __future__ import annotations

import ipaddress
import os
import socket

import psutil
from psrv.transport.errors import InvalidNetworkMaskError, NoMatchingInterfaceError

__all__ = ["DEFAULT_ADDRESS", "choose_address", "local_interfaces", "describe_interfaces"]

DEFAULT_ADDRESS = "127.0.0.1"


def local_interfaces() -> dict[str, list[str]]:
    """Every local interface with its IPv4 then IPv6 addresses, as psutil reports them."""
    table: dict[str, list[str]] = {}
    for name, addrs in psutil.net_if_addrs().items():
        v4 = [a.address for a in addrs if a.family == socket.AF_INET]
        v6 = [a.address for a in addrs if a.family == socket.AF_INET6]
        table[name] = v4 + v6
    return table


def describe_interfaces(interfaces: dict[str, list[str]]) -> str:
    """``lo: 127.0.0.1, ::1; eth0: 10.0.0.5`` (for error messages and logs)."""
    if not interfaces:
        return "(no interfaces)"
    return "; ".join(
        f"{name}: {', '.join(addrs) if addrs else '(no address)'}" for name, addrs in interfaces.items()
    )


def _parse_mask(mask: str, interfaces: dict[str, list[str]]) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        if not isinstance(mask, str) or "/" not in mask:
            raise ValueError("a CIDR needs an address and a prefix length, as in 10.0.0.0/16")
        return ipaddress.ip_network(mask.strip(), strict=False)
    except ValueError as exc:
        raise InvalidNetworkMaskError(
            f"invalid network mask {mask!r}: expected a CIDR such as 10.0.0.0/16 ({exc}); "
            f"interfaces seen: {describe_interfaces(interfaces)}"
        ) from None


def _as_ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None


def choose_address(
    network_mask: str | None = None,
    *,
    env_var: str = "PSRV_IP",
    interfaces: dict[str, list[str]] | None = None,
) -> str:
    """The address to bind and advertise; see the module docstring for the rules.

    ``interfaces`` replaces the psutil table (for tests); ``env_var=""`` disables the override.
    """
    override = os.environ.get(env_var, "").strip() if env_var else ""
    if override:
        if _as_ip(override) is None:
            raise InvalidNetworkMaskError(
                f"environment variable {env_var}={override!r} is not an IP address (expected e.g. 10.0.0.5)"
            )
        return override.split("%", 1)[0]
    if network_mask is None or not str(network_mask).strip():
        return DEFAULT_ADDRESS
    table = local_interfaces() if interfaces is None else interfaces
    network = _parse_mask(network_mask, table)
    for addrs in table.values():
        for text in addrs:
            ip = _as_ip(text)
            if ip is not None and ip.version == network.version and ip in network:
                return str(ip)
    raise NoMatchingInterfaceError(
        f"no local interface address is inside the network mask {network_mask!r}; "
        f"interfaces seen: {describe_interfaces(table)}"
        + (f" (set {env_var} to override)" if env_var else "")
    )
