"""reshape/features/destinations/rules.py: destination classes from IANA's special-purpose
address registries, and IPv6 forms judged by the IPv4 address they embed (issue 15, finding 12)."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reshape.features.destinations.rules import (
    OwnAddresses,
    category,
    embedded_ipv4,
    ip_of,
    refusal,
    refusal_message,
)
from reshape.policy.schema import DestinationKnobs

DEFAULTS = DestinationKnobs()
DENY_ALL = DestinationKnobs(private="deny", link_local="deny", loopback="deny")


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        # "This network": 0.0.0.0 reaches this machine; the rest is no valid destination.
        ("0.0.0.0", "loopback"),
        ("0.1.2.3", "loopback"),
        ("0.255.255.255", "loopback"),
        # Not globally reachable by the registry.
        ("198.18.0.1", "private"),  # benchmarking
        ("198.19.255.255", "private"),
        ("192.0.2.1", "private"),  # documentation
        ("198.51.100.7", "private"),
        ("203.0.113.9", "private"),
        ("192.0.0.1", "private"),  # IETF protocol assignments
        ("192.0.0.100", "private"),
        ("240.0.0.1", "private"),  # reserved
        ("255.255.255.255", "private"),  # limited broadcast
        ("100.64.0.1", "private"),  # shared address space (CGNAT)
        ("2001:db8::1", "private"),  # documentation
        ("100::1", "private"),  # discard-only
        ("fec0::1", "private"),  # site-local
        ("64:ff9b:1::a9fe:a9fe", "private"),  # NAT64 local use: the embedding is the operator's
        # Globally reachable, registry exceptions included.
        ("192.0.0.9", None),
        ("192.0.0.10", None),
        ("198.20.0.1", None),
        ("1.1.1.1", None),
        ("2606:4700::1111", None),
    ],
)
def test_classes_follow_the_special_purpose_registries(address: str, kind: str | None) -> None:
    assert category(ip_of(address)) == kind


@pytest.mark.parametrize(
    ("address", "embedded", "kind"),
    [
        ("64:ff9b::a9fe:a9fe", "169.254.169.254", "link_local"),  # NAT64 of the metadata address
        ("64:ff9b::7f00:1", "127.0.0.1", "loopback"),
        ("64:ff9b::a00:1", "10.0.0.1", "private"),
        ("64:ff9b::c612:1", "198.18.0.1", "private"),
        ("64:ff9b::808:808", "8.8.8.8", None),
        ("2002:a9fe:a9fe::1", "169.254.169.254", "link_local"),  # 6to4
        ("2002:7f00:1::", "127.0.0.1", "loopback"),
        ("2002:c0a8:101::5", "192.168.1.1", "private"),
        ("2002:808:808::1", "8.8.8.8", None),
        ("::a9fe:a9fe", "169.254.169.254", "link_local"),  # IPv4-compatible (deprecated)
        ("::127.0.0.1", "127.0.0.1", "loopback"),
        ("::ffff:198.18.0.1", "198.18.0.1", "private"),  # IPv4-mapped
    ],
)
def test_ipv6_forms_are_judged_by_the_ipv4_address_they_embed(
    address: str, embedded: str, kind: str | None
) -> None:
    ip = ipaddress.ip_address(address)
    assert embedded_ipv4(ip) == ipaddress.ip_address(embedded)
    assert category(ip) == kind


def test_own_ipv6_addresses_embed_nothing() -> None:
    assert embedded_ipv4(ipaddress.ip_address("::")) is None
    assert embedded_ipv4(ipaddress.ip_address("::1")) is None
    assert category(ipaddress.ip_address("::1")) == "loopback"


def test_the_nat64_metadata_address_is_refused_by_default() -> None:
    assert refusal(("64:ff9b::a9fe:a9fe", 80), DEFAULTS, OwnAddresses()) == "link_local"
    assert refusal(("2002:a9fe:a9fe::", 80), DEFAULTS, OwnAddresses()) == "link_local"
    assert refusal(("198.18.0.1", 80), DENY_ALL, OwnAddresses()) == "private"
    assert refusal(("0.0.0.1", 80), DENY_ALL, OwnAddresses()) == "loopback"


def test_the_message_names_the_embedded_address() -> None:
    message = refusal_message("link_local", "64:ff9b::a9fe:a9fe", 80, "p")
    assert "64:ff9b::a9fe:a9fe (reaching 169.254.169.254)" in message


@given(st.ip_addresses(v=4))
def test_every_embedding_gets_the_class_of_its_ipv4_address(ip: ipaddress.IPv4Address) -> None:
    value = int(ip)
    forms = [
        ipaddress.IPv6Address((0xFFFF << 32) | value),
        ipaddress.IPv6Address((0x64FF9B << 96) | value),
        ipaddress.IPv6Address((0x2002 << 112) | (value << 80)),
    ]
    for form in forms:
        assert embedded_ipv4(form) == ip
        assert category(form) == category(ip), form


@given(st.ip_addresses())
def test_an_address_the_registry_calls_global_is_public_unless_it_embeds_ipv4(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> None:
    if category(ip) is None:
        reached = embedded_ipv4(ip) or ip
        assert reached.is_global and not reached.is_link_local and not reached.is_loopback
