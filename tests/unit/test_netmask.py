"""choose_address: PSRV_IP override, CIDR matching against real and injected interface tables."""

from __future__ import annotations

import pytest
from psrv.transport.errors import InvalidNetworkMaskError, NoMatchingInterfaceError, TransportError
from psrv.transport.netmask import DEFAULT_ADDRESS, choose_address, local_interfaces

TABLE = {
    "lo": ["127.0.0.1", "::1"],
    "docker0": ["172.17.0.1"],
    "eth0": ["10.0.3.7", "fe80::1%eth0"],
    "eth1": ["10.1.0.9", "2001:db8::5"],
    "down0": [],
}


@pytest.fixture(autouse=True)
def no_override(monkeypatch):
    monkeypatch.delenv("PSRV_IP", raising=False)


def test_loopback_mask_matches_real_loopback():
    assert "127.0.0.1" in local_interfaces().get("lo", ["127.0.0.1"])
    assert choose_address("127.0.0.0/8") == "127.0.0.1"


def test_real_interfaces_table_is_well_formed():
    table = local_interfaces()
    assert table and all(isinstance(k, str) and isinstance(v, list) for k, v in table.items())
    assert any("127.0.0.1" in addrs for addrs in table.values())


@pytest.mark.parametrize(
    ("mask", "expected"),
    [
        ("10.0.0.0/16", "10.0.3.7"),
        ("10.1.0.0/16", "10.1.0.9"),
        ("10.0.0.0/8", "10.0.3.7"),  # first in interface order
        ("172.16.0.0/12", "172.17.0.1"),
        ("10.1.0.9/32", "10.1.0.9"),
        ("10.1.2.3/16", "10.1.0.9"),  # host bits in the mask are tolerated
        ("2001:db8::/32", "2001:db8::5"),
        ("fe80::/10", "fe80::1"),  # scope suffix dropped
        (" 127.0.0.0/8 ", "127.0.0.1"),
    ],
)
def test_mask_picks_first_matching_address(mask, expected):
    assert choose_address(mask, interfaces=TABLE) == expected


def test_no_mask_means_loopback():
    assert choose_address(None, interfaces=TABLE) == DEFAULT_ADDRESS == "127.0.0.1"
    assert choose_address("", interfaces=TABLE) == "127.0.0.1"


def test_no_match_names_mask_and_every_interface():
    with pytest.raises(NoMatchingInterfaceError) as info:
        choose_address("192.168.0.0/16", interfaces=TABLE)
    text = str(info.value)
    assert "192.168.0.0/16" in text and "PSRV_IP" in text
    for name, addrs in TABLE.items():
        assert name in text
        for addr in addrs:
            assert addr in text
    assert isinstance(info.value, TransportError)


@pytest.mark.parametrize("mask", ["banana", "10.0.0.0", "10.0.0.0/33", "300.0.0.0/8", "10.0.0.0/x"])
def test_invalid_mask_is_a_clear_error(mask):
    with pytest.raises(InvalidNetworkMaskError) as info:
        choose_address(mask, interfaces=TABLE)
    text = str(info.value)
    assert repr(mask) in text and "CIDR" in text and "eth0: 10.0.3.7" in text


def test_env_override_wins(monkeypatch):
    monkeypatch.setenv("PSRV_IP", "10.20.30.40")
    assert choose_address("10.0.0.0/16", interfaces=TABLE) == "10.20.30.40"
    assert choose_address(None, interfaces={}) == "10.20.30.40"
    assert choose_address("10.0.0.0/16", env_var="", interfaces=TABLE) == "10.0.3.7"  # override disabled
    monkeypatch.setenv("MY_IP", "10.9.9.9")
    assert choose_address(env_var="MY_IP") == "10.9.9.9"


def test_bad_env_override_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("PSRV_IP", "not-an-ip")
    with pytest.raises(InvalidNetworkMaskError, match="PSRV_IP='not-an-ip'"):
        choose_address("10.0.0.0/16", interfaces=TABLE)


def test_empty_override_is_ignored(monkeypatch):
    monkeypatch.setenv("PSRV_IP", "  ")
    assert choose_address("10.1.0.0/16", interfaces=TABLE) == "10.1.0.9"


def test_empty_interface_table():
    with pytest.raises(NoMatchingInterfaceError, match="no interfaces"):
        choose_address("10.0.0.0/8", interfaces={})
