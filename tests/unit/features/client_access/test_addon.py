from __future__ import annotations

import ipaddress

import pytest
from mitmproxy.test import tflow

from reshape.features.client_access.addon import ClientAccess, client_allowed

ALLOWED = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("2001:db8::/32"))


@pytest.mark.parametrize(
    ("address", "allowed"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.1.2.3", True),
        ("::ffff:10.1.2.3", True),
        ("2001:db8::7", True),
        ("fe80::1%eth0", False),
        ("192.0.2.7", False),
        ("11.0.0.1", False),
        ("", False),
        ("not-an-ip", False),
    ],
)
def test_client_allowed(address: str, allowed: bool) -> None:
    assert client_allowed(address, ALLOWED) is allowed


def test_only_loopback_without_a_list() -> None:
    assert client_allowed("127.0.0.1", ())
    assert not client_allowed("10.0.0.1", ())


def test_a_refused_client_is_disconnected_and_counted() -> None:
    addon = ClientAccess(ALLOWED)
    client = tflow.tclient_conn()
    client.peername = ("192.0.2.7", 40000)
    addon.client_connected(client)
    assert client.error == "reshape: client address not allowed"
    allowed = tflow.tclient_conn()
    allowed.peername = ("10.9.8.7", 40000)
    addon.client_connected(allowed)
    assert allowed.error is None
