from __future__ import annotations

import pytest

from reshape.base.addresses import ListenAddress, parse_listen_address
from reshape.base.errors import UsageError


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8080", ListenAddress("127.0.0.1", 8080)),
        ("0.0.0.0:0", ListenAddress("0.0.0.0", 0)),
        ("[::1]:9464", ListenAddress("::1", 9464)),
        ("localhost:1", ListenAddress("localhost", 1)),
    ],
)
def test_parses(text: str, expected: ListenAddress) -> None:
    assert parse_listen_address(text, option="--listen") == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("8080", "expected HOST:PORT"),
        (":8080", "expected HOST:PORT"),
        ("127.0.0.1:http", "port must be a number"),
        ("127.0.0.1:70000", "port must be 0-65535"),
        ("example.com:80", "host must be an IP address or localhost"),
    ],
)
def test_rejects_with_the_option_named(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message) as info:
        parse_listen_address(text, option="--admin")
    assert str(info.value).startswith("--admin: ")


def test_str_brackets_ipv6() -> None:
    assert str(ListenAddress("::1", 80)) == "[::1]:80"
    assert str(ListenAddress("127.0.0.1", 80)) == "127.0.0.1:80"


@pytest.mark.parametrize(
    ("host", "loopback", "wildcard"),
    [
        ("127.0.0.1", True, False),
        ("::1", True, False),
        ("0.0.0.0", False, True),
        ("::", False, True),
        ("10.1.2.3", False, False),
        ("localhost", True, False),
    ],
)
def test_classifies(host: str, loopback: bool, wildcard: bool) -> None:
    address = ListenAddress(host, 1)
    assert address.is_loopback is loopback
    assert address.is_wildcard is wildcard
