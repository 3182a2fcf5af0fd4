"""reshape/features/destinations/rules.py: which destination addresses are refused, without
sockets."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.base.addresses import ListenAddress
from reshape.features.destinations.rules import (
    REASONS,
    OwnAddresses,
    category,
    ip_of,
    refusal,
    refusal_message,
)
from reshape.features.telemetry import metrics
from reshape.policy.schema import DestinationKnobs

DEFAULTS = DestinationKnobs()
DENY_ALL = DestinationKnobs(private="deny", link_local="deny", loopback="deny")
ALLOW_ALL = DestinationKnobs(private="allow", link_local="allow", loopback="allow")
NOBODY = OwnAddresses()


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("169.254.169.254", "link_local"),
        ("169.254.0.1", "link_local"),
        ("fe80::1", "link_local"),
        ("fe80::1%eth0", "link_local"),
        ("fd00:ec2::254", "link_local"),  # inside fc00::/7, but the metadata service
        ("::ffff:169.254.169.254", "link_local"),
        ("127.0.0.1", "loopback"),
        ("127.9.9.9", "loopback"),
        ("::1", "loopback"),
        ("0.0.0.0", "loopback"),
        ("::", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.168.1.1", "private"),
        ("100.64.0.1", "private"),
        ("fd12:3456::1", "private"),
        ("[fc00::1]", "private"),
        ("172.32.0.1", None),
        ("8.8.8.8", None),
        ("2001:4860:4860::8888", None),
        ("100.128.0.1", None),
    ],
)
def test_category(address: str, kind: str | None) -> None:
    assert category(ip_of(address)) == kind


def test_not_an_address_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        refusal(("metadata.google.internal", 80), DEFAULTS, NOBODY)


def test_defaults_refuse_link_local_only() -> None:
    assert refusal(("169.254.169.254", 80), DEFAULTS, NOBODY) == "link_local"
    assert refusal(("fd00:ec2::254", 80), DEFAULTS, NOBODY) == "link_local"
    assert refusal(("10.0.0.1", 80), DEFAULTS, NOBODY) is None
    assert refusal(("127.0.0.1", 80), DEFAULTS, NOBODY) is None
    assert refusal(("93.184.216.34", 443), DEFAULTS, NOBODY) is None


@pytest.mark.parametrize("kind", ["private", "link_local", "loopback"])
def test_each_knob_decides_its_own_kind(kind: str) -> None:
    address = {"private": "192.168.0.7", "link_local": "169.254.1.1", "loopback": "127.0.0.5"}
    for other in ("private", "link_local", "loopback"):
        knobs = DestinationKnobs(**{**{k: "allow" for k in address}, kind: "deny"})  # type: ignore[arg-type]
        expected = kind if other == kind else None
        assert refusal((address[other], 80), knobs, NOBODY) == expected


@given(st.ip_addresses())
def test_an_address_outside_the_guarded_kinds_is_never_refused(ip: ipaddress._BaseAddress) -> None:
    verdict = refusal((str(ip), 80), DENY_ALL, NOBODY)
    assert (verdict is None) == (category(ip_of(str(ip))) is None)
    assert refusal((str(ip), 80), ALLOW_ALL, NOBODY) is None


@given(st.ip_addresses(network="169.254.0.0/16") | st.ip_addresses(network="fe80::/10"))
def test_link_local_is_refused_by_default(ip: ipaddress._BaseAddress) -> None:
    assert refusal((str(ip), 80), DEFAULTS, NOBODY) == "link_local"


def test_own_addresses_are_refused_whatever_the_policy() -> None:
    own = OwnAddresses.of([ListenAddress("127.0.0.1", 8080), ListenAddress("::1", 9464)])
    assert refusal(("127.0.0.1", 8080), ALLOW_ALL, own) == "own_address"
    assert refusal(("::ffff:127.0.0.1", 8080), ALLOW_ALL, own) == "own_address"
    assert refusal(("::1", 9464), ALLOW_ALL, own) == "own_address"
    assert refusal(("0.0.0.0", 8080), ALLOW_ALL, own) == "own_address"  # reaches the listener
    assert refusal(("127.0.0.1", 8081), ALLOW_ALL, own) is None
    assert refusal(("127.0.0.2", 8080), ALLOW_ALL, own) is None


def test_localhost_listen_covers_both_loopbacks() -> None:
    own = OwnAddresses.of([ListenAddress("localhost", 3128)])
    assert ("127.0.0.1", 3128) in own and ("::1", 3128) in own


def test_a_wildcard_listen_covers_every_local_address() -> None:
    local = {ipaddress.ip_address("192.0.2.10"), ipaddress.ip_address("2001:db8::10")}
    own = OwnAddresses.of([ListenAddress("0.0.0.0", 8080)], is_local=lambda ip: ip in local)
    for address in ("192.0.2.10", "2001:db8::10", "127.0.0.1", "127.3.0.1", "::1", "0.0.0.0"):
        assert refusal((address, 8080), ALLOW_ALL, own) == "own_address", address
    assert refusal(("192.0.2.11", 8080), ALLOW_ALL, own) is None  # another machine
    assert refusal(("192.0.2.10", 8081), ALLOW_ALL, own) is None  # another port


def test_port_zero_is_added_once_bound() -> None:
    own = OwnAddresses.of([ListenAddress("127.0.0.1", 0)])
    assert not own.exact
    own = own.with_address(ListenAddress("127.0.0.1", 40000))
    assert ("127.0.0.1", 40000) in own


def test_messages_say_what_and_why() -> None:
    assert refusal_message("link_local", "169.254.169.254", 80, "office") == (
        "reshape: destination 169.254.169.254 is link-local (policy 'office' denies it)"
    )
    assert refusal_message("loopback", "127.0.0.1", 80, "strict", host="localhost") == (
        "reshape: destination localhost (127.0.0.1) is loopback (policy 'strict' denies it)"
    )
    assert "own address" in refusal_message("own_address", "127.0.0.1", 8080, "p")


def test_metric_reasons_are_these() -> None:
    assert metrics.DESTINATION_REFUSALS == REASONS
